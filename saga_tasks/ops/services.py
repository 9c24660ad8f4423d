"""Checking the backing services and migrating the schema, with errors that name the service."""

from __future__ import annotations

import logging
from pathlib import Path

from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from saga_tasks.config import Settings, mask_url
from saga_tasks.errors import ConfigurationError, ServiceUnavailable
from saga_tasks.messaging.admin import check_broker
from saga_tasks.persistence.admin import ensure_database
from saga_tasks.persistence.db import check_database, translated


def check_redis(url: str) -> None:
    """Raise ``ServiceUnavailable`` unless Redis answers PING at ``url``."""
    import redis

    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=3, socket_timeout=3)
        client.ping()
        client.close()
    except (redis.RedisError, OSError, ValueError) as exc:
        raise ServiceUnavailable("Redis", mask_url(url), _describe(exc)) from exc


def check_all(settings: Settings) -> None:
    check_database(settings.database_url)
    check_broker(settings.broker_url)
    check_redis(settings.result_backend)


def _describe(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def migrations_dir() -> Path:
    """The Alembic scripts: shipped inside the wheel, or at the top of a checkout."""
    package = Path(__file__).resolve().parent.parent
    for candidate in (package / "_migrations", package.parent / "migrations"):
        if (candidate / "env.py").exists():
            return candidate
    raise ConfigurationError("cannot find the migrations directory")


def upgrade(url: str, revision: str = "head") -> str:
    """Apply migrations up to ``revision``; running it again changes nothing."""
    from alembic import command
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    logging.getLogger("alembic").setLevel(logging.WARNING)
    with translated(url):
        command.upgrade(cfg, revision)
    return current_revision(url) or "none"


def current_revision(url: str) -> str | None:
    engine = create_engine(url, poolclass=NullPool, connect_args={"connect_timeout": 5})
    try:
        with translated(url), engine.connect() as conn:
            exists = conn.execute(text("SELECT to_regclass('saga.alembic_version')")).scalar()
            if exists is None:
                return None
            value = conn.execute(text("SELECT version_num FROM saga.alembic_version")).scalar()
            return str(value) if value is not None else None
    finally:
        engine.dispose()


__all__ = [
    "check_all",
    "check_broker",
    "check_database",
    "check_redis",
    "current_revision",
    "ensure_database",
    "migrations_dir",
    "upgrade",
]
