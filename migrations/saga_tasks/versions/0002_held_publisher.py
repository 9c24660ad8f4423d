"""Held messages name the broker user that published them, and whether it may speak for
their step (``attested``): a message that is not moves no saga.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "held_message", sa.Column("published_by", sa.Text(), nullable=True), schema="saga"
    )
    op.add_column(
        "held_message",
        sa.Column("attested", sa.Boolean(), server_default=sa.text("true"), nullable=False),
        schema="saga",
    )


def downgrade() -> None:
    op.drop_column("held_message", "attested", schema="saga")
    op.drop_column("held_message", "published_by", schema="saga")
