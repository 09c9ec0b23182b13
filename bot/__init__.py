"""Steward core: runtime, agent turn, LLM clients, tools, scheduler and CLI."""
