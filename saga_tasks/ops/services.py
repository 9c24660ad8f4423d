"""Checking the backing services, with errors that name the service; migrating the schema
(``persistence.migrate``), gathered for the CLI."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import redis

from saga_tasks.config import Settings
from saga_tasks.errors import ConfigurationError, InputError, ServiceUnavailable
from saga_tasks.messaging.admin import check_broker
from saga_tasks.persistence.admin import ensure_database
from saga_tasks.persistence.db import check_database
from saga_tasks.persistence.migrate import (
    chains,
    current_revision,
    current_revisions,
    migrations_dir,
    revision,
    upgrade,
)
from saga_tasks.urls import mask_url

if TYPE_CHECKING:
    from saga_tasks.app import SagaApp


def check_redis(url: str) -> None:
    """Raise ``ServiceUnavailable`` unless Redis answers PING at ``url``."""
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=3, socket_timeout=3)
        client.ping()
        client.close()
    except (redis.RedisError, OSError, ValueError) as exc:
        raise ServiceUnavailable("Redis", url, exc) from exc


def check_all(settings: Settings) -> None:
    """PostgreSQL (the orchestrator's database when named, and each participant database
    named outright: a participant's own process has only its own), RabbitMQ, Redis."""
    urls = [settings.database_url] if settings.database_url else []
    for url in [*urls, *settings.named_participant_databases()]:
        try:
            check_database(url)
        except ServiceUnavailable as exc:
            if "does not exist" not in exc.detail:
                raise
            raise ServiceUnavailable(
                exc.service, exc.url, f"{exc.detail} (saga-tasks db upgrade creates it)"
            ) from exc
    check_broker(settings.broker_url)
    check_redis(settings.result_backend)


@dataclass(frozen=True)
class Target:
    """One database to migrate and the chains it holds."""

    name: str
    """``saga`` (the orchestrator's database) or a participant's name."""
    url: str
    chains: tuple[str, ...]
    library: bool
    """The saga schema's chain runs here first (the orchestrator's database only)."""


def targets(app: SagaApp | None, settings: Settings, only: Sequence[str] = ()) -> list[Target]:
    """The databases of a deployment and their chains: the orchestrator's (the saga schema,
    then the app's chains), then each participant's own (its chain alone); ``only`` picks
    some by name. Without an app, the saga schema only."""
    owned = [] if app is None else [p for p in app.participants.values() if p.migrations]
    names = ["saga", *(p.name for p in owned)]
    unknown = sorted(set(only) - set(names))
    if unknown:
        raise ConfigurationError(
            f"{', '.join(unknown)}: not 'saga' nor a participant with migrations "
            f"({', '.join(names)})"
        )
    # Only the databases picked are looked up: a participant's own process is given its own.
    found = []
    if not only or "saga" in only:
        own = settings if app is None else app.settings
        if not own.database_url:
            raise ConfigurationError(
                "SAGA_DATABASE_URL is empty (a participant's own process): migrate the "
                "participant's own database with --only NAME"
            )
        chains = () if app is None else tuple(app.migrations)
        found.append(Target("saga", own.database_url, chains, True))
    found += [
        Target(p.name, app.settings.participant_database(p.name), (str(p.migrations),), False)
        for p in owned
        if app is not None and (not only or p.name in only)
    ]
    return found


def chain_of(app: SagaApp, name: str) -> tuple[str, str]:
    """(database URL, chain directory) of a participant's chain (by the participant's
    name) or one of the app's (by its folder's name)."""
    participant = app.participants.get(name)
    if participant is not None and participant.migrations is not None:
        return app.settings.participant_database(name), str(participant.migrations)
    for location in app.migrations:
        if Path(location).name == name:
            if not app.settings.database_url:
                raise ConfigurationError(f"{name} migrates SAGA_DATABASE_URL, which is empty")
            return app.settings.database_url, str(location)
    known = [p.name for p in app.participants.values() if p.migrations]
    known += [Path(m).name for m in app.migrations]
    raise InputError(
        f"{name!r}: no participant with migrations= nor app chain of that name"
        f" (known: {', '.join(known) or 'none'})"
    )


def upgrade_all(
    app: SagaApp | None,
    settings: Settings,
    only: Sequence[str] = (),
    *,
    create: bool = True,
    say: Callable[[str], None] = lambda _line: None,
) -> list[tuple[str, str, str]]:
    """Migrate every database of ``targets`` (creating missing ones with ``create``), one
    after the other; (target, chain, revision) of each chain."""
    done = []
    for target in targets(app, settings, only):
        if create and ensure_database(target.url):
            say(f"created the database {mask_url(target.url)}")
        for chain, at in upgrade(target.url, target.chains, library=target.library):
            done.append((target.name, chain, at))
    return done


__all__ = [
    "chains",
    "check_all",
    "check_broker",
    "check_database",
    "check_redis",
    "current_revision",
    "current_revisions",
    "ensure_database",
    "chain_of",
    "migrations_dir",
    "revision",
    "targets",
    "upgrade",
    "upgrade_all",
]
