"""A RabbitMQ vhost and a PostgreSQL database of one's own (tests, chaos runs, benchmarks)."""

from __future__ import annotations

import contextlib
import os
import uuid
from dataclasses import dataclass, field

from sqlalchemy.engine import make_url

from saga_tasks.config import mask_url, scrub
from saga_tasks.errors import ConfigurationError, first_line
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


ADMIN_URL_ENV = "SAGA_TEST_ADMIN_URL"
FALLBACK_ADMIN_URL = "postgresql+psycopg2://saga_tasks:saga_tasks@127.0.0.1:5432/postgres"


def default_admin_url(environ: os._Environ[str] | dict[str, str] | None = None) -> str:
    """Where an ``Isolation`` creates its databases when told nothing: ``SAGA_TEST_ADMIN_URL``,
    else the server of ``SAGA_DATABASE_URL`` (its ``postgres`` database, its role), else
    the local role this project's own set-up makes."""
    env = os.environ if environ is None else environ
    if env.get(ADMIN_URL_ENV):
        return env[ADMIN_URL_ENV]
    if env.get("SAGA_DATABASE_URL"):
        url = make_url(env["SAGA_DATABASE_URL"]).set(database="postgres")
        return str(url.render_as_string(hide_password=False))
    return FALLBACK_ADMIN_URL


@dataclass
class Isolation:
    """A vhost and a database of one's own for one test run, and the URLs to reach them.

    With ``participants``, each of them gets a database of its own too
    (``<ident>_<name>``, from the template ``<template>_<name>`` when a template is
    given), and ``env`` sets ``SAGA_PARTICIPANT_DATABASE_URL`` to reach them.
    """

    admin_database_url: str = field(default_factory=default_admin_url)
    """A role that may create databases (``CREATEDB``), on any database of the server."""
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
            try:
                create_database(self.database_url, template=self.template)
            except Exception as exc:
                raise ConfigurationError(
                    f"Isolation cannot create a database as {mask_url(self.admin_database_url)}"
                    f" ({scrub(first_line(exc), self.admin_database_url)[:200]}): it needs a "
                    "role that may create databases; "
                    f"set {ADMIN_URL_ENV} (or pass admin_database_url=) to one"
                ) from exc
            for name in self.participants:
                template = f"{self.template}_{name}" if self.template else None
                create_database(self.participant_url(name), template=template)
        except Exception:
            with contextlib.suppress(Exception):  # what it could not make it cannot drop
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
