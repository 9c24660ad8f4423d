"""Databases themselves: create, copy from a template, drop, list (tests, tools, deploys)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError, ProgrammingError
from sqlalchemy.pool import NullPool

from saga_tasks.errors import ConfigurationError
from saga_tasks.persistence.db import translated

DUPLICATE_DATABASE = "42P04"
UNIQUE_VIOLATION = "23505"


def _admin_engine(url: str) -> Any:
    return create_engine(
        make_url(url).set(database="postgres"), poolclass=NullPool, isolation_level="AUTOCOMMIT"
    )


def create_database(url: str, template: str | None = None) -> None:
    """Create the database ``url`` names, optionally as a copy of ``template``."""
    name = make_url(url).database
    engine = _admin_engine(url)
    try:
        with engine.connect() as conn:
            suffix = f' TEMPLATE "{template}"' if template else ""
            conn.execute(text(f'CREATE DATABASE "{name}"{suffix}'))
    finally:
        engine.dispose()


def drop_database(url: str) -> None:
    """Drop the database ``url`` names, closing whatever is still connected to it."""
    name = make_url(url).database
    engine = _admin_engine(url)
    try:
        with engine.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        engine.dispose()


def creator(url: str) -> tuple[str, bool]:
    """The role ``url`` logs in as on its server's ``postgres`` database, and whether it
    may create databases (``CREATEDB``, or a superuser). ``ServiceUnavailable`` when it
    cannot log in."""
    engine = create_engine(
        make_url(url).set(database="postgres"),
        poolclass=NullPool,
        connect_args={"connect_timeout": 5},
    )
    try:
        with translated(url), engine.connect() as conn:
            row = conn.execute(
                text(
                    "SELECT rolname, rolcreatedb OR rolsuper FROM pg_roles "
                    "WHERE rolname = current_user"
                )
            ).one()
            return str(row[0]), bool(row[1])
    finally:
        engine.dispose()


def list_databases(url: str, prefix: str) -> list[str]:
    engine = _admin_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                text("SELECT datname FROM pg_database WHERE datname LIKE :p"), {"p": f"{prefix}%"}
            )
            return [r[0] for r in rows]
    finally:
        engine.dispose()


def ensure_database(url: str) -> bool:
    """Create the database ``url`` names if it does not exist; True if it was created."""
    target = make_url(url)
    name = target.database
    if not name:
        raise ConfigurationError("SAGA_DATABASE_URL names no database")
    admin = create_engine(
        target.set(database="postgres"),
        poolclass=NullPool,
        isolation_level="AUTOCOMMIT",
        connect_args={"connect_timeout": 5},
    )
    try:
        with translated(url), admin.connect() as conn:
            exists = conn.execute(
                text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": name}
            ).first()
            if exists:
                return False
            try:
                conn.execute(text(f'CREATE DATABASE "{name}"'))
            except (ProgrammingError, IntegrityError) as exc:
                # Created by a concurrent run: "already exists" if it had committed when
                # this one looked, a unique violation on pg_database if it was underway.
                if getattr(exc.orig, "pgcode", None) in (DUPLICATE_DATABASE, UNIQUE_VIOLATION):
                    return False
                raise
            return True
    finally:
        admin.dispose()
