"""The orders schema: the orders participant's own database: its orders.

Its business tables, and the command ledger, outbox and redelivery counts the library
creates for a participant.

Revision ID: 0001
Revises:
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

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
    create_participant_tables(op, "orders")
    create_redelivery_table(op, "orders")
    op.create_table(
        "orders",
        sa.Column("order_id", sa.UUID(as_uuid=False), nullable=False),
        sa.Column("saga_id", sa.UUID(as_uuid=False), nullable=False),
        sa.Column("customer_id", sa.Text(), nullable=False),
        sa.Column("amount_cents", sa.Integer(), nullable=False),
        sa.Column("items", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("status", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("order_id"),
        sa.UniqueConstraint("saga_id"),
        schema="orders",
    )


def downgrade() -> None:
    op.drop_table("orders", schema="orders")
    drop_participant_tables(op, "orders")
