"""Notes that change nothing kept to a few per saga and kind, with a count of the rest.

A history note that changes nothing (a held message the broker does not vouch for, a
parked message, a duplicate delivery, a dead letter its saga could not take) is written
for whatever arrives naming the saga, so anyone who can publish could grow a saga's
history without bound: 2,000 forged dead letters made 2,010 history rows of a saga that
had 10, and its ``GET /sagas/{id}`` 2.5 MB. Now each saga keeps the newest few notes of
each kind, and ``saga_note_tally`` counts them all and those dropped.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import UUID

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "saga_note_tally",
        sa.Column("saga_id", UUID(as_uuid=False), nullable=False),
        sa.Column("event", sa.Text(), nullable=False),
        sa.Column("noted", sa.BigInteger(), nullable=False),
        sa.Column("dropped", sa.BigInteger(), nullable=False, server_default=sa.text("0")),
        sa.Column("last_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("saga_id", "event", name="pk_saga_note_tally"),
        schema="saga",
    )
    # The notes written before: counted, so the first note after trims them too.
    op.execute(
        "INSERT INTO saga.saga_note_tally (saga_id, event, noted, dropped, last_at) "
        "SELECT saga_id, event, count(*), 0, max(at) FROM saga.saga_history "
        "WHERE event IN ('held_not_attested', 'message_parked', 'dead_letter_not_fed') "
        "GROUP BY saga_id, event"
    )


def downgrade() -> None:
    op.drop_table("saga_note_tally", schema="saga")
