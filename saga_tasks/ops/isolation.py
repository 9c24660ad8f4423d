"""A RabbitMQ vhost and a PostgreSQL database of one's own (tests, chaos runs, benchmarks)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from sqlalchemy.engine import make_url

from saga_tasks.messaging.admin import RabbitAdmin, queue_depths
from saga_tasks.persistence.admin import create_database, drop_database, list_databases

__all__ = [
    "Isolation",
    "RabbitAdmin",
    "create_database",
    "drop_database",
    "list_databases",
    "queue_depths",
]


@dataclass
class Isolation:
    """A vhost and a database of one's own for one test run, and the URLs to reach them.

    With ``participants``, each of them gets a database of its own too
    (``<ident>_<name>``, from the template ``<template>_<name>`` when a template is
    given), and ``env`` sets ``SAGA_PARTICIPANT_DATABASE_URL`` to reach them.
    """

    admin_database_url: str = "postgresql+psycopg2://saga_tasks:saga_tasks@127.0.0.1:5432/postgres"
    broker_host: str = "guest:guest@127.0.0.1:5672"
    prefix: str = "saga_test_"
    template: str | None = None
    name: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    rabbit: RabbitAdmin = field(default_factory=RabbitAdmin)
    participants: tuple[str, ...] = ()

    @property
    def ident(self) -> str:
        return f"{self.prefix}{self.name}"

    @property
    def database_url(self) -> str:
        return str(
            make_url(self.admin_database_url).set(database=self.ident).render_as_string(False)
        )

    def participant_url(self, name: str) -> str:
        """The database URL of participant ``name``."""
        database = f"{self.ident}_{name}"
        return str(make_url(self.admin_database_url).set(database=database).render_as_string(False))

    @property
    def participant_database_url(self) -> str:
        """``SAGA_PARTICIPANT_DATABASE_URL`` for this isolation ("" without participants)."""
        if not self.participants:
            return ""
        return self.participant_url("PARTICIPANT").replace("_PARTICIPANT", "_{participant}")

    @property
    def broker_url(self) -> str:
        return f"amqp://{self.broker_host}/{self.ident}"

    def __enter__(self) -> Isolation:
        self.rabbit.create_vhost(self.ident)
        try:
            create_database(self.database_url, template=self.template)
            for name in self.participants:
                template = f"{self.template}_{name}" if self.template else None
                create_database(self.participant_url(name), template=template)
        except Exception:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            for url in (self.database_url, *map(self.participant_url, self.participants)):
                drop_database(url)
        finally:
            self.rabbit.delete_vhost(self.ident)

    def env(self, **extra: str) -> dict[str, str]:
        """Environment for a subprocess that should use this isolation."""
        return {
            "SAGA_DATABASE_URL": self.database_url,
            "SAGA_PARTICIPANT_DATABASE_URL": self.participant_database_url,
            "SAGA_BROKER_URL": self.broker_url,
            **extra,
        }
