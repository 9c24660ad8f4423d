"""Retention: finished sagas are purged after SAGA_RETENTION_DAYS in bounded batches,
found by an index on when they finished, and each leaves a tombstone so its id answers
"purged" rather than "no such saga".

The indexes (finished sagas by ``finished_at``; the saga outbox's, the inbox's and the
bulk items' rows by saga) are plain builds, in the migration's transaction: on large
tables they hold writes back while they build (seconds per million rows). To avoid that,
build them beforehand with ``CREATE INDEX CONCURRENTLY`` under the names and definitions
of ``INDEXES`` below; this migration then finds them valid and builds nothing.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import UUID

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

FINISHED = "status IN ('COMPLETED', 'COMPENSATED', 'FAILED')"


def upgrade() -> None:
    op.create_table(
        "purged_saga",
        sa.Column("saga_id", UUID(as_uuid=False), nullable=False),
        sa.Column("saga_type", sa.Text(), nullable=False),
        sa.Column("business_key", sa.Text(), nullable=False),
        sa.Column("status", sa.Text(), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True)),
        sa.Column("purged_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("saga_id", name="purged_saga_pkey"),
        schema="saga",
    )
    op.create_index("ix_purged_saga_purged", "purged_saga", ["purged_at"], schema="saga")
    for name, table, columns, where in INDEXES:
        _index(name, table, columns, where)


INDEXES = (
    ("ix_saga_finished", "saga_instance", "finished_at", FINISHED),
    # The purge deletes a saga's rows by its id: without these it scans whole tables.
    ("ix_saga_outbox_saga", "outbox", "saga_id", None),
    ("ix_inbox_saga", "inbox", "saga_id", None),
    ("ix_bulk_item_saga", "bulk_item", "saga_id", None),
)


def _index(name: str, table: str, columns: str, where: str | None) -> None:
    """Build the index unless a valid one of its name exists (built beforehand
    CONCURRENTLY); one left invalid by a failed concurrent build is built again."""
    op.execute(
        f"""DO $$ BEGIN
          IF EXISTS (SELECT 1 FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
                     JOIN pg_namespace n ON n.oid = c.relnamespace
                     WHERE n.nspname = 'saga' AND c.relname = '{name}' AND NOT i.indisvalid)
          THEN DROP INDEX saga.{name}; END IF; END $$"""  # noqa: S608 - names of INDEXES
    )
    clause = f" WHERE {where}" if where else ""
    op.execute(f"CREATE INDEX IF NOT EXISTS {name} ON saga.{table} ({columns}){clause}")


def downgrade() -> None:
    for name, *_ in INDEXES:
        op.execute(f"DROP INDEX IF EXISTS saga.{name}")
    op.drop_table("purged_saga", schema="saga")
