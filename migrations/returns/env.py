"""Alembic environment of the example's returns participant, in returns's own database.

Its version table is ``returns.alembic_version``: the participant's chain is its own, apart
from the saga schema's and every other participant's. ``saga-tasks db upgrade`` runs it
in the database ``SAGA_PARTICIPANT_DATABASE_URL`` gives returns (``--only returns``: it alone).
"""

from __future__ import annotations

from participants.returns import participant
from saga_tasks.persistence.schema import run_migrations

run_migrations(
    version_table_schema=participant.schema,
    schemas={participant.schema},
    target_metadata=participant.metadata,
)
