"""Alembic environment of the example's orders participant, in orders's own database.

Its version table is ``orders.alembic_version``: the participant's chain is its own, apart
from the saga schema's and every other participant's. ``saga-tasks db upgrade`` runs it
in the database ``SAGA_PARTICIPANT_DATABASE_URL`` gives orders (``--only orders``: it alone).
"""

from __future__ import annotations

from participants.orders import participant
from saga_tasks.persistence.schema import run_migrations

run_migrations(
    version_table_schema=participant.schema,
    schemas={participant.schema},
    target_metadata=participant.metadata,
)
