"""Versioned JSON documents: ops, a tracked draft that records them, stored versions."""

from store.documents.draft import Draft, StaleError
from store.documents.ops import OpError, apply_ops
from store.errors import DocumentConflict

__all__ = ["DocumentConflict", "Draft", "OpError", "StaleError", "apply_ops"]
