"""The agent: turns, LLM calls, tool calls and deliveries as durable tasks."""
