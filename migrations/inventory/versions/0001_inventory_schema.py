"""The inventory schema: the inventory participant's own database: stock and reservations.

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
    create_participant_tables(op, "inventory")
    create_redelivery_table(op, "inventory")
    op.create_table(
        "reservation",
        sa.Column("reservation_id", sa.UUID(as_uuid=False), nullable=False),
        sa.Column("command_id", sa.UUID(as_uuid=False), nullable=False),
        sa.Column("saga_id", sa.UUID(as_uuid=False), nullable=False),
        sa.Column("items", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("status", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("released_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("reservation_id"),
        sa.UniqueConstraint("command_id"),
        schema="inventory",
    )
    op.create_table(
        "stock",
        sa.Column("sku", sa.Text(), nullable=False),
        sa.Column("on_hand", sa.Integer(), nullable=False),
        sa.Column("reserved", sa.Integer(), nullable=False),
        sa.CheckConstraint("reserved >= 0 AND reserved <= on_hand", name="ck_stock_reserved"),
        sa.PrimaryKeyConstraint("sku"),
        schema="inventory",
    )


def downgrade() -> None:
    op.drop_table("stock", schema="inventory")
    op.drop_table("reservation", schema="inventory")
    drop_participant_tables(op, "inventory")
