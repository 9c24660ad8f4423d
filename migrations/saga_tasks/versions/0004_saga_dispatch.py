"""Flow control: commands waiting for capacity at their queue, and each queue's rate bucket.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB, UUID

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "saga_dispatch",
        sa.Column("message_id", UUID(as_uuid=False), primary_key=True),
        sa.Column("saga_id", UUID(as_uuid=False), nullable=False),
        sa.Column("step", sa.Text(), nullable=False),
        sa.Column("queue", sa.Text(), nullable=False),
        sa.Column("task_name", sa.Text(), nullable=False),
        sa.Column("routing_key", sa.Text()),
        sa.Column("headers", JSONB(), nullable=False),
        sa.Column("body", JSONB(), nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.Column("sent_at", sa.DateTime(timezone=True)),
        sa.Column("withdrawn_at", sa.DateTime(timezone=True)),
        schema="saga",
    )
    op.create_index(
        "ix_dispatch_waiting",
        "saga_dispatch",
        ["queue", "created_at"],
        schema="saga",
        postgresql_where=sa.text("sent_at IS NULL AND withdrawn_at IS NULL"),
    )
    op.create_index(
        "ix_dispatch_sent",
        "saga_dispatch",
        ["queue"],
        schema="saga",
        postgresql_where=sa.text("sent_at IS NOT NULL"),
    )
    op.create_index("ix_dispatch_saga", "saga_dispatch", ["saga_id", "step"], schema="saga")
    op.create_table(
        "dispatch_rate",
        sa.Column("queue", sa.Text(), primary_key=True),
        sa.Column("tokens", sa.Float(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        schema="saga",
    )


def downgrade() -> None:
    op.drop_table("dispatch_rate", schema="saga")
    op.drop_table("saga_dispatch", schema="saga")
