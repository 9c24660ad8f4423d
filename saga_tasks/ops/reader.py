"""What an operator's read command needs, and nothing more: settings, a clock, psycopg2.

``saga-tasks show``, ``list`` and ``stuck`` only read the saga tables. Loading the
deployment's ``SagaApp`` for them would import its participants, Celery, kombu and the
rest; even SQLAlchemy alone is most of such a command's time. With ``SAGA_DATABASE_URL``
in the environment they read through this instead (the same settings every command
takes from there), running ``persistence.readsql``'s SQL on one psycopg2 connection.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from saga_tasks.config import Settings
from saga_tasks.core.clock import Clock, SystemClock
from saga_tasks.errors import ConfigurationError, ServiceUnavailable, first_line
from saga_tasks.persistence.readsql import Query, plain, pyformat
from saga_tasks.urls import mask_url, scrub


class Reader:
    """The read side of a ``SagaApp``: what ``ops.views``' read views use of one."""

    def __init__(self, settings: Settings, clock: Clock | None = None) -> None:
        self.settings = settings
        self.clock = clock or SystemClock()

    @contextmanager
    def query(self) -> Iterator[Query]:
        """A ``readsql.Query`` on a read-only connection of its own, closed after."""
        import psycopg2
        import psycopg2.extras

        url = self.settings.database_url
        _, _, rest = url.partition("://")
        try:
            # libpq takes the URL SQLAlchemy takes, without the driver in its scheme.
            conn = psycopg2.connect(
                f"postgresql://{rest}", connect_timeout=5, application_name="saga_tasks"
            )
        except psycopg2.OperationalError as error:
            raise ServiceUnavailable("PostgreSQL", url, error) from error
        except psycopg2.ProgrammingError as error:  # libpq cannot read the URL: one line
            why = scrub(first_line(error), url)
            raise ConfigurationError(
                f"SAGA_DATABASE_URL is malformed: {why}: {mask_url(url)}"
            ) from error
        try:
            conn.set_session(readonly=True, autocommit=True)

            def run(sql: str, params: Mapping[str, Any]) -> list[dict[str, Any]]:
                try:
                    with conn.cursor(cursor_factory=psycopg2.extras.RealDictCursor) as cursor:
                        cursor.execute(pyformat(sql), dict(params))
                        return [plain(row) for row in cursor]
                except (psycopg2.OperationalError, psycopg2.InterfaceError) as error:
                    raise ServiceUnavailable("PostgreSQL", url, error) from error

            yield run
        finally:
            conn.close()
