"""Reminders and recurring jobs: trigger maths, the scheduler loop, the agent's tool."""
