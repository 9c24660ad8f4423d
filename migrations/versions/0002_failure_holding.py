"""Failure holding: messages taken off the dead-letter and parking queues, redelivery counts.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
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


def downgrade() -> None:
    op.drop_table("redelivery", schema="saga")
    op.drop_index(
        "ix_held_pending",
        table_name="held_message",
        schema="saga",
        postgresql_where=sa.text("status = 'pending'"),
    )
    op.drop_index("ix_held_saga", table_name="held_message", schema="saga")
    op.drop_table("held_message", schema="saga")
