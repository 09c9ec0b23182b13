"""Small SQL helpers that differ between SQLite and PostgreSQL."""

from sqlalchemy import Table
from sqlalchemy.dialects import postgresql, sqlite


def insert_ignore(dialect: str, table: Table, *conflict_columns: str):
    """INSERT ... ON CONFLICT (cols) DO NOTHING, in the dialect's spelling."""
    module = postgresql if dialect == "postgresql" else sqlite
    return module.insert(table).on_conflict_do_nothing(index_elements=list(conflict_columns))
