"""Alembic environment of the saga schema: the library's own chain.

``saga-tasks db upgrade`` runs it first, then the app's chains, in one transaction under
one advisory lock (see ``saga_tasks.persistence.schema``).
"""

from __future__ import annotations

from saga_tasks.persistence.schema import run_migrations
from saga_tasks.persistence.tables import SAGA_SCHEMA, metadata

run_migrations(version_table_schema=SAGA_SCHEMA, schemas={SAGA_SCHEMA}, target_metadata=metadata)
