"""Long-term memory: facts, compaction, full-history search."""
