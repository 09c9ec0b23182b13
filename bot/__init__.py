"""Steward's core below the command line: the agent and its durable runtime, memory, tools,
model clients, the scheduler, and the seam connectors use (`port.py`, `channels.py`);
`bot/app/` is the composition root above it all."""
