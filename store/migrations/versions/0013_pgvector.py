"""Entry embeddings searched by an index on PostgreSQL (pgvector), where it is installed.

- `entry_vectors.embedding`: on PostgreSQL a `real[]` (a plain type: dimensions differ by
  model, and the column is there whether pgvector is or not), on SQLite an unused BLOB
  (its index is a file rebuilt from `entry_vectors`, store/vector_index.py).
- PostgreSQL with the `vector` extension available (scripts/install-pgvector): the
  extension is created (in schema `public`, so a store living in another schema, as each
  test's does, never owns it), `embedding` is filled from `vec`, streamed in batches, and
  each model gets a partial HNSW index over `embedding::vector(D)` (store/vectors.py
  `index_sql`; also made when a model's first vector is stored).
- PostgreSQL without it (a user's own server, or no right to create extensions): the
  failed `CREATE EXTENSION` is undone by its savepoint, `embedding` stays NULL, and search
  stays the exact one over `vec`.

Revision ID: 0013
Revises: 0012
"""

import struct

from alembic import op
from sqlalchemy import text

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

BATCH = 2000


def _extension_schema(bind) -> str | None:
    return bind.execute(text(
        "SELECT n.nspname FROM pg_extension AS x JOIN pg_namespace AS n "
        "ON n.oid = x.extnamespace WHERE x.extname = 'vector'")).scalar()


def _create_extension(bind) -> str | None:
    schema = _extension_schema(bind)
    if schema is not None:
        return schema
    if not bind.execute(text("SELECT count(*) FROM pg_available_extensions "
                             "WHERE name = 'vector'")).scalar():
        return None
    for sql in ("CREATE EXTENSION IF NOT EXISTS vector SCHEMA public",
                "CREATE EXTENSION IF NOT EXISTS vector"):
        try:
            with bind.begin_nested():
                bind.execute(text(sql))
            return _extension_schema(bind)
        except Exception:  # no right to create it, no schema public: try the next, or skip
            continue
    return None


def _literal(blob: bytes) -> str:
    return "{" + ",".join(repr(x) for x in struct.unpack(f"<{len(blob) // 4}f", blob)) + "}"


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        op.execute("ALTER TABLE entry_vectors ADD COLUMN embedding BLOB")
        return
    op.execute("ALTER TABLE entry_vectors ADD COLUMN embedding real[]")
    schema = _create_extension(bind)
    if schema is None:
        return
    dims = dict(bind.execute(text(
        "SELECT DISTINCT ON (model) model, length(vec) / 4 FROM entry_vectors "
        "WHERE vec IS NOT NULL ORDER BY model, entry_id")).all())
    for model, dim in dims.items():
        after = 0
        while True:  # streamed: one batch of rows in memory at a time
            rows = bind.execute(text(
                "SELECT entry_id, vec FROM entry_vectors WHERE model = :m AND entry_id > :a "
                "AND vec IS NOT NULL ORDER BY entry_id LIMIT :n"),
                {"m": model, "a": after, "n": BATCH}).all()
            if not rows:
                break
            after = rows[-1][0]
            rows = [(e, bytes(v)) for e, v in rows if len(v) == 4 * dim]
            bind.execute(text(
                "UPDATE entry_vectors AS v SET embedding = CAST(u.x AS real[]) "
                "FROM unnest(CAST(:ids AS bigint[]), CAST(:xs AS text[])) AS u(id, x) "
                "WHERE v.model = :m AND v.entry_id = u.id"),
                {"m": model, "ids": [e for e, _ in rows], "xs": [_literal(v) for _, v in rows]})
    from store.vectors import index_sql

    op.execute("SET LOCAL maintenance_work_mem = '512MB'")
    for model, dim in dims.items():
        op.execute(text(index_sql(schema, model, dim)))


def downgrade() -> None:
    with op.batch_alter_table("entry_vectors") as batch:
        batch.drop_column("embedding")
