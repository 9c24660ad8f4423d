"""The example participants' schemas: orders, inventory, payments.

Each holds its business tables, and the command ledger and outbox the library creates
for a participant. Before 1.0 these were part of the saga schema's chain.

Revision ID: 0001
Revises:
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from saga_tasks.persistence.schema import create_participant_tables, drop_participant_tables

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

SCHEMAS = ("orders", "inventory", "payments")


def upgrade() -> None:
    for schema in SCHEMAS:
        create_participant_tables(op, schema)
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
    op.create_table(
        "authorization",
        sa.Column("authorization_id", sa.UUID(as_uuid=False), nullable=False),
        sa.Column("command_id", sa.UUID(as_uuid=False), nullable=False),
        sa.Column("saga_id", sa.UUID(as_uuid=False), nullable=False),
        sa.Column("customer_id", sa.Text(), nullable=False),
        sa.Column("amount_cents", sa.Integer(), nullable=False),
        sa.Column("status", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("voided_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("authorization_id"),
        sa.UniqueConstraint("command_id"),
        schema="payments",
    )
    # authorized_cents: the customer's open authorizations, kept under the row lock
    # authorize takes, so a payment does not sum the customer's history.
    op.create_table(
        "customer",
        sa.Column("customer_id", sa.Text(), nullable=False),
        sa.Column("credit_limit_cents", sa.Integer(), nullable=False),
        sa.Column("authorized_cents", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.PrimaryKeyConstraint("customer_id"),
        schema="payments",
    )


def downgrade() -> None:
    op.drop_table("customer", schema="payments")
    op.drop_table("authorization", schema="payments")
    op.drop_table("stock", schema="inventory")
    op.drop_table("reservation", schema="inventory")
    op.drop_table("orders", schema="orders")
    for schema in SCHEMAS:
        drop_participant_tables(op, schema)
        op.execute(f'DROP SCHEMA IF EXISTS "{schema}"')
