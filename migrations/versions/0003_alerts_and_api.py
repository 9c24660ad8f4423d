"""Alerts sent once per saga and condition; Idempotency-Key of HTTP starts.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Dashboard and API filters on 100k+ sagas: by status (newest first), by business key.
    op.create_index(
        "ix_saga_status_created", "saga_instance", ["status", "created_at"], schema="saga"
    )
    op.create_index("ix_saga_business_key", "saga_instance", ["business_key"], schema="saga")
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


def downgrade() -> None:
    op.drop_index("ix_saga_business_key", table_name="saga_instance", schema="saga")
    op.drop_index("ix_saga_status_created", table_name="saga_instance", schema="saga")
    op.drop_table("api_idempotency", schema="saga")
    op.drop_table("alert_sent", schema="saga")
