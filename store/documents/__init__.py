"""Versioned JSON documents: ops, a tracked draft that records them, stored versions."""

from store.documents.draft import Draft
from store.documents.ops import OpError, apply_ops

__all__ = ["Draft", "OpError", "apply_ops"]
