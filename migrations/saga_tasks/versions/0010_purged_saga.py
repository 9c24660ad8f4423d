"""Retention: finished sagas are purged after SAGA_RETENTION_DAYS in bounded batches,
found by an index on when they finished, and each leaves a tombstone so its id answers
"purged" rather than "no such saga".

The index is a plain build, in the migration's transaction: on a large saga table it
holds writes back while it builds (seconds per million rows). To avoid that, build it
beforehand with ``CREATE INDEX CONCURRENTLY ix_saga_finished ON saga.saga_instance
(finished_at) WHERE status IN ('COMPLETED', 'COMPENSATED', 'FAILED')``; this migration then
finds it and builds nothing.

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
    op.execute(
        f"CREATE INDEX IF NOT EXISTS ix_saga_finished ON saga.saga_instance (finished_at) "
        f"WHERE {FINISHED}"
    )


def downgrade() -> None:
    op.drop_index("ix_saga_finished", table_name="saga_instance", schema="saga")
    op.drop_table("purged_saga", schema="saga")
