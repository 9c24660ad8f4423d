"""A RabbitMQ vhost and a PostgreSQL database of one's own (tests, chaos runs, benchmarks)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from sqlalchemy.engine import make_url

from saga_tasks.config import Settings
from saga_tasks.errors import ConfigurationError, ServiceUnavailable
from saga_tasks.messaging.admin import RabbitAdmin, queue_depths
from saga_tasks.persistence.admin import (
    create_database,
    creator,
    drop_database,
    list_databases,
)
from saga_tasks.urls import mask_url

ADMIN_URL_VARIABLE = "SAGA_TEST_ADMIN_URL"
BROKER_URL_VARIABLE = "SAGA_TEST_BROKER_URL"


def broker_base(env: Mapping[str, str] | None = None) -> tuple[str, str]:
    """The broker ``Isolation`` makes its vhost on (a URL whose vhost is ignored), and
    where it came from: ``SAGA_TEST_BROKER_URL``, else the settings' broker URL
    (``SAGA_BROKER_URL`` or its default, guest on 127.0.0.1)."""
    env = os.environ if env is None else env
    if env.get(BROKER_URL_VARIABLE):
        return env[BROKER_URL_VARIABLE], BROKER_URL_VARIABLE
    return Settings.from_env(env).broker_url, "SAGA_BROKER_URL"


def admin_url(env: Mapping[str, str] | None = None) -> tuple[str, str]:
    """The URL ``Isolation`` creates its databases with, and where it came from:
    ``SAGA_TEST_ADMIN_URL``, else the settings' database URL (``SAGA_DATABASE_URL`` or its
    default) pointed at its server's ``postgres`` database."""
    env = os.environ if env is None else env
    if env.get(ADMIN_URL_VARIABLE):
        return env[ADMIN_URL_VARIABLE], ADMIN_URL_VARIABLE
    database_url = Settings.from_env(env).database_url
    if not database_url:
        raise ConfigurationError(
            f"Isolation needs a PostgreSQL role that may create databases: set "
            f"{ADMIN_URL_VARIABLE} (or SAGA_DATABASE_URL) to a URL of one, or pass "
            f"admin_database_url="
        )
    postgres = make_url(database_url).set(database="postgres")
    return postgres.render_as_string(hide_password=False), "SAGA_DATABASE_URL"


__all__ = [
    "ADMIN_URL_VARIABLE",
    "BROKER_URL_VARIABLE",
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

    The databases are created as the role of ``admin_database_url``; without one, of
    ``admin_url()``. The vhost is made on the broker of ``broker_url`` (its vhost
    ignored); without one, of ``broker_base()``, through its management API as the URL's
    user (``rabbit=`` for another admin). A role that cannot log in or may not create
    databases, or a broker user that may not create vhosts, is refused with a
    ``ConfigurationError`` saying what is needed, before anything is made.
    """

    admin_database_url: str = ""
    broker_host: str = ""
    """``user:password@host:port`` of the broker; derived from ``broker_base()`` if empty."""
    prefix: str = "saga_test_"
    template: str | None = None
    name: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    rabbit: RabbitAdmin | None = None
    participants: tuple[str, ...] = ()
    admin_from: str = field(default="admin_database_url", init=False)
    """Where ``admin_database_url`` came from, for the error that names it."""
    broker_from: str = field(default="broker_host", init=False)
    scheme: str = field(default="amqp", init=False)

    def __post_init__(self) -> None:
        if not self.admin_database_url:
            self.admin_database_url, self.admin_from = admin_url()
        if not self.broker_host:
            base, self.broker_from = broker_base()
            first = urlsplit(base.split(";")[0])
            self.scheme, self.broker_host = first.scheme or "amqp", first.netloc
        if self.rabbit is None:
            self.rabbit = RabbitAdmin.for_broker(f"{self.scheme}://{self.broker_host}/")

    @property
    def admin(self) -> RabbitAdmin:
        assert self.rabbit is not None  # set in __post_init__
        return self.rabbit

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
        return f"{self.scheme}://{self.broker_host}/{self.ident}"

    def check_admin(self) -> None:
        """Refuse, saying what is needed, an admin role that cannot log in or may not
        create databases."""
        shown = f"{mask_url(self.admin_database_url)} (from {self.admin_from})"
        try:
            role, may_create = creator(self.admin_database_url)
        except ServiceUnavailable as exc:
            raise ConfigurationError(
                f"Isolation needs a PostgreSQL role that may create databases; it cannot "
                f"log in with {shown}: {exc.detail}. Set {ADMIN_URL_VARIABLE} (or pass "
                f"admin_database_url=) to the URL of such a role"
            ) from exc
        if not may_create:
            raise ConfigurationError(
                f"Isolation needs a PostgreSQL role that may create databases; {role!r} of "
                f"{shown} may not (ALTER ROLE {role} CREATEDB, or set {ADMIN_URL_VARIABLE} "
                f"to the URL of a role that may)"
            )

    def __enter__(self) -> Isolation:
        self.check_admin()
        try:
            self.admin.create_vhost(self.ident)
        except ConfigurationError as exc:
            shown = f"{mask_url(self.broker_url)} (from {self.broker_from})"
            raise ConfigurationError(
                f"Isolation needs a RabbitMQ user that may create vhosts, for {shown}: "
                f"{exc}. Set {BROKER_URL_VARIABLE} to a URL of such a user, or pass "
                f"rabbit=RabbitAdmin(api=, user=, password=)"
            ) from exc
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
            self.admin.delete_vhost(self.ident)

    def env(self, **extra: str) -> dict[str, str]:
        """Environment for a subprocess that should use this isolation."""
        return {
            "SAGA_DATABASE_URL": self.database_url,
            "SAGA_PARTICIPANT_DATABASE_URL": self.participant_database_url,
            "SAGA_BROKER_URL": self.broker_url,
            **extra,
        }
