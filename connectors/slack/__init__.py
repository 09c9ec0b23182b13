"""Slack: chat with Steward in DMs, channels and threads (see `connector.py`). Nothing is
imported here, so the config model (`config.py`) and the export reader load without the
Slack SDK."""
