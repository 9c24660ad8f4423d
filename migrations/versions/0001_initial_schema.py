"""Initial schema: the orchestrator (saga) and the example participants' schemas.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


PARTICIPANT_SCHEMAS = ("orders", "inventory", "payments")


def upgrade() -> None:
    # The saga schema is created by env.py, before Alembic's version table.
    for schema in PARTICIPANT_SCHEMAS:
        op.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
    op.create_table(
        "inbox",
        sa.Column("consumer", sa.Text(), nullable=False),
        sa.Column("message_id", sa.Text(), nullable=False),
        sa.Column("saga_id", sa.UUID(as_uuid=False), nullable=True),
        sa.Column(
            "received_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("consumer", "message_id", name="pk_inbox"),
        schema="saga",
    )
    op.create_table(
        "invalid_message",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=True), nullable=False),
        sa.Column(
            "received_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("consumer", sa.Text(), nullable=False),
        sa.Column("queue", sa.Text(), nullable=True),
        sa.Column("routing_key", sa.Text(), nullable=True),
        sa.Column("task_name", sa.Text(), nullable=True),
        sa.Column("message_id", sa.Text(), nullable=True),
        sa.Column("saga_id", sa.Text(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("headers", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("body_sha256", sa.Text(), nullable=True),
        sa.Column("body_size", sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        schema="saga",
    )
    op.create_index(
        "ix_invalid_received", "invalid_message", ["received_at"], unique=False, schema="saga"
    )
    op.create_table(
        "outbox",
        sa.Column("message_id", sa.UUID(as_uuid=False), nullable=False),
        sa.Column("saga_id", sa.UUID(as_uuid=False), nullable=True),
        sa.Column("task_name", sa.Text(), nullable=False),
        sa.Column("queue", sa.Text(), nullable=False),
        sa.Column("routing_key", sa.Text(), nullable=True),
        sa.Column("headers", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("body", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("published_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("publish_attempts", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("recovered", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.PrimaryKeyConstraint("message_id"),
        schema="saga",
    )
    op.create_index(
        "ix_saga_outbox_unpublished",
        "outbox",
        ["created_at"],
        unique=False,
        schema="saga",
        postgresql_where=sa.text("published_at IS NULL"),
    )
    op.create_table(
        "saga_history",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=True), nullable=False),
        sa.Column("saga_id", sa.UUID(as_uuid=False), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("event", sa.Text(), nullable=False),
        sa.Column("step", sa.Text(), nullable=True),
        sa.Column("status_before", sa.Text(), nullable=True),
        sa.Column("status_after", sa.Text(), nullable=True),
        sa.Column("step_status_before", sa.Text(), nullable=True),
        sa.Column("step_status_after", sa.Text(), nullable=True),
        sa.Column("message_id", sa.Text(), nullable=True),
        sa.Column("causation_id", sa.Text(), nullable=True),
        sa.Column("actor", sa.Text(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column(
            "detail",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("id"),
        schema="saga",
    )
    op.create_index(
        "ix_history_saga", "saga_history", ["saga_id", "id"], unique=False, schema="saga"
    )
    op.create_table(
        "saga_instance",
        sa.Column("saga_id", sa.UUID(as_uuid=False), nullable=False),
        sa.Column("saga_type", sa.Text(), nullable=False),
        sa.Column("definition_version", sa.Integer(), nullable=False),
        sa.Column("business_key", sa.Text(), nullable=False),
        sa.Column("status", sa.Text(), nullable=False),
        sa.Column("status_reason", sa.Text(), nullable=True),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.Column("payload", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("payload_hash", sa.Text(), nullable=False),
        sa.Column("correlation_id", sa.Text(), nullable=False),
        sa.Column("traceparent", sa.Text(), nullable=True),
        sa.Column("deadline", sa.DateTime(timezone=True), nullable=True),
        sa.Column("next_wake_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("saga_id"),
        sa.UniqueConstraint("saga_type", "business_key", name="uq_saga_type_business_key"),
        schema="saga",
    )
    op.create_index("ix_saga_created", "saga_instance", ["created_at"], unique=False, schema="saga")
    op.create_index(
        "ix_saga_next_wake_active",
        "saga_instance",
        ["next_wake_at"],
        unique=False,
        schema="saga",
        postgresql_where=sa.text("status IN ('RUNNING', 'COMPENSATING')"),
    )
    op.create_index(
        "ix_saga_status_updated",
        "saga_instance",
        ["status", "updated_at"],
        unique=False,
        schema="saga",
    )
    op.create_table(
        "saga_step",
        sa.Column("saga_id", sa.UUID(as_uuid=False), nullable=False),
        sa.Column("step", sa.Text(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("status", sa.Text(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("compensation_attempt", sa.Integer(), nullable=False),
        sa.Column("generation", sa.Integer(), nullable=False),
        sa.Column("command_id", sa.UUID(as_uuid=False), nullable=True),
        sa.Column("compensation_id", sa.UUID(as_uuid=False), nullable=True),
        sa.Column("requested_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("deadline", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("result", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("given_up", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.PrimaryKeyConstraint("saga_id", "step", name="pk_saga_step"),
        schema="saga",
    )
    op.create_table(
        "command_ledger",
        sa.Column("command_id", sa.UUID(as_uuid=False), nullable=False),
        sa.Column("saga_id", sa.UUID(as_uuid=False), nullable=False),
        sa.Column("step", sa.Text(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("task_name", sa.Text(), nullable=False),
        sa.Column("outcome", sa.Text(), nullable=False),
        sa.Column("reply_message_id", sa.UUID(as_uuid=False), nullable=True),
        sa.Column("reply", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("compensates", sa.UUID(as_uuid=False), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("command_id"),
        schema="orders",
    )
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
        "outbox",
        sa.Column("message_id", sa.UUID(as_uuid=False), nullable=False),
        sa.Column("saga_id", sa.UUID(as_uuid=False), nullable=True),
        sa.Column("task_name", sa.Text(), nullable=False),
        sa.Column("queue", sa.Text(), nullable=False),
        sa.Column("routing_key", sa.Text(), nullable=True),
        sa.Column("headers", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("body", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("published_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("publish_attempts", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("recovered", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.PrimaryKeyConstraint("message_id"),
        schema="orders",
    )
    op.create_index(
        "ix_orders_outbox_unpublished",
        "outbox",
        ["created_at"],
        unique=False,
        schema="orders",
        postgresql_where=sa.text("published_at IS NULL"),
    )
    op.create_table(
        "command_ledger",
        sa.Column("command_id", sa.UUID(as_uuid=False), nullable=False),
        sa.Column("saga_id", sa.UUID(as_uuid=False), nullable=False),
        sa.Column("step", sa.Text(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("task_name", sa.Text(), nullable=False),
        sa.Column("outcome", sa.Text(), nullable=False),
        sa.Column("reply_message_id", sa.UUID(as_uuid=False), nullable=True),
        sa.Column("reply", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("compensates", sa.UUID(as_uuid=False), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("command_id"),
        schema="inventory",
    )
    op.create_table(
        "outbox",
        sa.Column("message_id", sa.UUID(as_uuid=False), nullable=False),
        sa.Column("saga_id", sa.UUID(as_uuid=False), nullable=True),
        sa.Column("task_name", sa.Text(), nullable=False),
        sa.Column("queue", sa.Text(), nullable=False),
        sa.Column("routing_key", sa.Text(), nullable=True),
        sa.Column("headers", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("body", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("published_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("publish_attempts", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("recovered", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.PrimaryKeyConstraint("message_id"),
        schema="inventory",
    )
    op.create_index(
        "ix_inventory_outbox_unpublished",
        "outbox",
        ["created_at"],
        unique=False,
        schema="inventory",
        postgresql_where=sa.text("published_at IS NULL"),
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
    op.create_table(
        "command_ledger",
        sa.Column("command_id", sa.UUID(as_uuid=False), nullable=False),
        sa.Column("saga_id", sa.UUID(as_uuid=False), nullable=False),
        sa.Column("step", sa.Text(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("task_name", sa.Text(), nullable=False),
        sa.Column("outcome", sa.Text(), nullable=False),
        sa.Column("reply_message_id", sa.UUID(as_uuid=False), nullable=True),
        sa.Column("reply", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("compensates", sa.UUID(as_uuid=False), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("command_id"),
        schema="payments",
    )
    op.create_table(
        "customer",
        sa.Column("customer_id", sa.Text(), nullable=False),
        sa.Column("credit_limit_cents", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("customer_id"),
        schema="payments",
    )
    op.create_table(
        "outbox",
        sa.Column("message_id", sa.UUID(as_uuid=False), nullable=False),
        sa.Column("saga_id", sa.UUID(as_uuid=False), nullable=True),
        sa.Column("task_name", sa.Text(), nullable=False),
        sa.Column("queue", sa.Text(), nullable=False),
        sa.Column("routing_key", sa.Text(), nullable=True),
        sa.Column("headers", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("body", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("published_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("publish_attempts", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("recovered", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.PrimaryKeyConstraint("message_id"),
        schema="payments",
    )
    op.create_index(
        "ix_payments_outbox_unpublished",
        "outbox",
        ["created_at"],
        unique=False,
        schema="payments",
        postgresql_where=sa.text("published_at IS NULL"),
    )


def downgrade() -> None:
    op.drop_index(
        "ix_payments_outbox_unpublished",
        table_name="outbox",
        schema="payments",
        postgresql_where=sa.text("published_at IS NULL"),
    )
    op.drop_table("outbox", schema="payments")
    op.drop_table("customer", schema="payments")
    op.drop_table("command_ledger", schema="payments")
    op.drop_table("authorization", schema="payments")
    op.drop_table("stock", schema="inventory")
    op.drop_table("reservation", schema="inventory")
    op.drop_index(
        "ix_inventory_outbox_unpublished",
        table_name="outbox",
        schema="inventory",
        postgresql_where=sa.text("published_at IS NULL"),
    )
    op.drop_table("outbox", schema="inventory")
    op.drop_table("command_ledger", schema="inventory")
    op.drop_index(
        "ix_orders_outbox_unpublished",
        table_name="outbox",
        schema="orders",
        postgresql_where=sa.text("published_at IS NULL"),
    )
    op.drop_table("outbox", schema="orders")
    op.drop_table("orders", schema="orders")
    op.drop_table("command_ledger", schema="orders")
    op.drop_table("saga_step", schema="saga")
    op.drop_index("ix_saga_status_updated", table_name="saga_instance", schema="saga")
    op.drop_index(
        "ix_saga_next_wake_active",
        table_name="saga_instance",
        schema="saga",
        postgresql_where=sa.text("status IN ('RUNNING', 'COMPENSATING')"),
    )
    op.drop_index("ix_saga_created", table_name="saga_instance", schema="saga")
    op.drop_table("saga_instance", schema="saga")
    op.drop_index("ix_history_saga", table_name="saga_history", schema="saga")
    op.drop_table("saga_history", schema="saga")
    op.drop_index(
        "ix_saga_outbox_unpublished",
        table_name="outbox",
        schema="saga",
        postgresql_where=sa.text("published_at IS NULL"),
    )
    op.drop_table("outbox", schema="saga")
    op.drop_index("ix_invalid_received", table_name="invalid_message", schema="saga")
    op.drop_table("invalid_message", schema="saga")
    op.drop_table("inbox", schema="saga")
    for schema in PARTICIPANT_SCHEMAS:
        op.execute(f"DROP SCHEMA IF EXISTS {schema}")
