"""What an operator's read command needs, and nothing more: settings, a clock, an engine.

``saga-tasks show``, ``list`` and ``stuck`` only read the saga tables. Loading the
deployment's ``SagaApp`` for them would import its participants, Celery, kombu and the
rest, most of the command's wall time; with ``SAGA_DATABASE_URL`` in the environment
they read through this instead (the same settings every command takes from there).
"""

from __future__ import annotations

from functools import cached_property

from sqlalchemy import Engine

from saga_tasks.config import Settings
from saga_tasks.core.clock import Clock, SystemClock
from saga_tasks.persistence.db import get_engine


class Reader:
    """The read side of a ``SagaApp``: what ``ops.views``' read views use of one."""

    def __init__(self, settings: Settings, clock: Clock | None = None) -> None:
        self.settings = settings
        self.clock = clock or SystemClock()

    @cached_property
    def engine(self) -> Engine:
        return get_engine(self.settings.database_url)
