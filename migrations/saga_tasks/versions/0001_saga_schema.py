"""The saga schema: sagas, steps, history, outbox, inbox, held messages, alerts, samples.

The history before 1.0 (revisions 0001 to 0005 of one chain that also held the example
participants' schemas) is collapsed into this revision: it creates the saga schema those
five revisions made. A database migrated by the old chain is not upgraded in place.

Revision ID: 0001
Revises:
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    # The saga schema is created by env.py, before Alembic's version table.
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
    # Dashboard and API filters on 100k+ sagas: by status (newest first), by business key.
    op.create_index(
        "ix_saga_status_created", "saga_instance", ["status", "created_at"], schema="saga"
    )
    op.create_index("ix_saga_business_key", "saga_instance", ["business_key"], schema="saga")
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
        "held_message",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=True), nullable=False),
        sa.Column("holding", sa.Text(), nullable=False),
        sa.Column("delivery_key", sa.Text(), nullable=False),
        sa.Column("message_id", sa.Text(), nullable=True),
        sa.Column("saga_id", sa.UUID(as_uuid=False), nullable=True),
        sa.Column("step", sa.Text(), nullable=True),
        sa.Column("kind", sa.Text(), nullable=True),
        sa.Column("task_name", sa.Text(), nullable=True),
        sa.Column("original_queue", sa.Text(), nullable=True),
        sa.Column("original_routing_key", sa.Text(), nullable=True),
        sa.Column("original_exchange", sa.Text(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("death_count", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("first_death_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_death_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column(
            "received_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("content_type", sa.Text(), nullable=True),
        sa.Column("content_encoding", sa.Text(), nullable=True),
        sa.Column("headers", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("body", sa.Text(), nullable=True),
        sa.Column("body_base64", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.Column("status", sa.Text(), server_default=sa.text("'pending'"), nullable=False),
        sa.Column("resolved_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("resolved_by", sa.Text(), nullable=True),
        sa.Column("resolution", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("holding", "delivery_key", name="uq_held_delivery"),
        schema="saga",
    )
    op.create_index("ix_held_saga", "held_message", ["saga_id"], unique=False, schema="saga")
    op.create_index(
        "ix_held_pending",
        "held_message",
        ["holding", "received_at"],
        unique=False,
        schema="saga",
        postgresql_where=sa.text("status = 'pending'"),
    )
    op.create_table(
        "redelivery",
        sa.Column("consumer", sa.Text(), nullable=False),
        sa.Column("message_id", sa.Text(), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column(
            "first_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.Column(
            "last_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.PrimaryKeyConstraint("consumer", "message_id", name="pk_redelivery"),
        schema="saga",
    )
    op.create_table(
        "alert_sent",
        sa.Column("saga_id", sa.UUID(as_uuid=False), nullable=False),
        sa.Column("condition", sa.Text(), nullable=False),
        sa.Column(
            "sent_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.PrimaryKeyConstraint("saga_id", "condition", name="pk_alert_sent"),
        schema="saga",
    )
    op.create_table(
        "api_idempotency",
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("request_hash", sa.Text(), nullable=False),
        sa.Column("saga_id", sa.UUID(as_uuid=False), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("key"),
        schema="saga",
    )
    op.create_table(
        "status_sample",
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("saga_type", sa.Text(), nullable=False),
        sa.Column("status", sa.Text(), nullable=False),
        sa.Column("count", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("at", "saga_type", "status", name="pk_status_sample"),
        schema="saga",
    )


def downgrade() -> None:
    for table in (
        "status_sample",
        "api_idempotency",
        "alert_sent",
        "redelivery",
        "held_message",
        "saga_step",
        "saga_instance",
        "saga_history",
        "outbox",
        "invalid_message",
        "inbox",
    ):
        op.drop_table(table, schema="saga")  # its indexes go with it
