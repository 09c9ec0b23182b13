"""Moved to store/read/plain.py. This name stays only while the search and vector modules
(store/search.py, vectors.py, vector_index.py; another owner) still import it from here;
drop it once they import `store.read.plain`."""

from store.read.plain import run  # noqa: F401
