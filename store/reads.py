"""Moved to store/read/queries.py. This name stays only while store/search.py and
store/hybrid.py (another owner) still import it from here; drop it once they import
`store.read.queries`."""

from store.read.queries import ENTRY, conversation  # noqa: F401
