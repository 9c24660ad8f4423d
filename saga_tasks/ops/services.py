"""Checking the backing services, with errors that name the service; migrating the schema
(``persistence.migrate``), gathered for the CLI."""

from __future__ import annotations

import redis

from saga_tasks.config import Settings, unavailable
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
    "upgrade",
]
