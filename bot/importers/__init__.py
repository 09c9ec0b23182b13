"""Readers and the batch writer behind `steward import`: the JSONL reader and the
import record (`model`) are the core's; the Slack-export and mbox readers live in their
connectors, and `bot/app/importers.py` picks one per format."""
