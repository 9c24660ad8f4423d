"""Checking the backing services, with errors that name the service; migrating the schema
(``persistence.migrate``), gathered for the CLI."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import redis

from saga_tasks.config import Settings, mask_url, unavailable
from saga_tasks.errors import ConfigurationError
from saga_tasks.messaging.admin import check_broker
from saga_tasks.persistence.admin import ensure_database
from saga_tasks.persistence.db import check_database
from saga_tasks.persistence.migrate import (
    chains,
    current_revision,
    current_revisions,
    migrations_dir,
    upgrade,
)

if TYPE_CHECKING:
    from saga_tasks.app import SagaApp


def check_redis(url: str) -> None:
    """Raise ``ServiceUnavailable`` unless Redis answers PING at ``url``."""
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=3, socket_timeout=3)
        client.ping()
        client.close()
    except (redis.RedisError, OSError, ValueError) as exc:
        raise unavailable("Redis", url, exc) from exc


def check_all(settings: Settings) -> None:
    check_database(settings.database_url)
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
    if app is None:
        names = ["saga"]
    else:
        names = ["saga", *(p.name for p in app.participants.values() if p.migrations)]
    unknown = sorted(set(only) - set(names))
    if unknown:
        raise ConfigurationError(
            f"{', '.join(unknown)}: not 'saga' nor a participant with migrations "
            f"({', '.join(names)})"
        )
    if app is not None:
        settings = app.settings
    found = []
    for name in names:
        if only and name not in only:
            continue  # a process given one participant's database names no other
        if name == "saga":
            chains = tuple(app.migrations) if app is not None else ()
            found.append(Target("saga", settings.database_url, chains, True))
        else:
            assert app is not None
            p = app.participants[name]
            url = settings.participant_database(name)
            found.append(Target(name, url, (str(p.migrations),), False))
    return found


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
        for chain, revision in upgrade(target.url, target.chains, library=target.library):
            done.append((target.name, chain, revision))
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
    "migrations_dir",
    "targets",
    "upgrade",
    "upgrade_all",
]
