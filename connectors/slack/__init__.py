"""Slack: chat with Steward in DMs, channels and threads (see `connector.py`)."""

from .connector import SlackConnector

__all__ = ["SlackConnector"]
