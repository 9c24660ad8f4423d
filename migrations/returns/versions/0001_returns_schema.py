"""The returns schema: the returns participant's own database: return requests and the
notifications sent for them.

Its business tables, and the command ledger, outbox and redelivery counts the library
creates for a participant.

Revision ID: 0001
Revises:
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from saga_tasks.persistence.schema import (
    create_participant_tables,
    create_redelivery_table,
    drop_participant_tables,
)

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    create_participant_tables(op, "returns")
    create_redelivery_table(op, "returns")
    op.create_table(
        "return_request",
        sa.Column("return_id", sa.Text(), nullable=False),
        sa.Column("saga_id", sa.UUID(as_uuid=False), nullable=False),
        sa.Column("order_ref", sa.Text(), nullable=False),
        sa.Column("customer_id", sa.Text(), nullable=False),
        sa.Column("sku", sa.Text(), nullable=False),
        sa.Column("qty", sa.Integer(), nullable=False),
        sa.Column("status", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("return_id"),
        schema="returns",
    )
    op.create_table(
        "notification",
        sa.Column("command_id", sa.UUID(as_uuid=False), nullable=False),
        sa.Column("return_id", sa.Text(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("sent_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("command_id"),
        schema="returns",
    )


def downgrade() -> None:
    op.drop_table("notification", schema="returns")
    op.drop_table("return_request", schema="returns")
    drop_participant_tables(op, "returns")
