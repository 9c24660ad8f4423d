"""Engines per process, and the boundary where database errors become ours.

An engine is created lazily in the process that uses it and never shared across a
fork: a prefork child that inherits its parent's pool would use the parent's sockets.

A pooled connection is tested with a round trip before use only when it sat idle in
the pool for ``IDLE_PING_AFTER`` seconds (``pool_pre_ping`` would test it before every
transaction: one round trip of the ten a reply costs). A busy worker reuses its
connections within milliseconds, where a restart of PostgreSQL in between is a
failure like any other (the message is retried); after a pause, when a restart or an
idle timeout is likely, the dead connection is replaced before anyone sees it.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from sqlalchemy import URL, Connection, Engine, create_engine, event, exc, text
from sqlalchemy.pool import NullPool

from saga_tasks.errors import ConcurrencyConflict, InputError, ServiceUnavailable, first_line
from saga_tasks.persistence.prepared import PREPARE_KEY
from saga_tasks.persistence.readsql import Query, plain

IDLE_PING_AFTER = 1.0
"""Seconds a pooled connection may sit unused before it is tested on checkout."""

_engines: dict[tuple[int, str, int, bool], Engine] = {}
_lock = threading.Lock()


def get_engine(url: str, pool_size: int = 2, *, prepare: bool = True) -> Engine:
    """This process's engine for ``url``; a forked child gets a fresh one. ``prepare``:
    its connections prepare the hot statements (``SAGA_DB_PREPARE``)."""
    key = (os.getpid(), url, pool_size, prepare)
    engine = _engines.get(key)
    if engine is not None:
        return engine
    with _lock:
        engine = _engines.get(key)
        if engine is None:
            for stale in [k for k in _engines if k[0] != key[0]]:
                # Inherited from the parent: drop the pool without closing its sockets.
                _engines.pop(stale).dispose(close=False)
            engine = create_engine(
                url,
                pool_size=pool_size,
                max_overflow=pool_size,
                pool_recycle=1800,
                connect_args={"connect_timeout": 5, "application_name": "saga_tasks"},
            )
            _ping_when_idle(engine)
            _mark_prepare(engine, prepare)
            _engines[key] = engine
    return engine


def _mark_prepare(engine: Engine, prepare: bool) -> None:
    @event.listens_for(engine, "connect")
    def connected(_dbapi_connection: Any, record: Any) -> None:
        record.info[PREPARE_KEY] = prepare


def _ping_when_idle(engine: Engine) -> None:
    @event.listens_for(engine, "checkin")
    def checked_in(_dbapi_connection: Any, record: Any) -> None:
        record.info["idle_since"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def checked_out(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        idle_since = record.info.get("idle_since")
        if idle_since is None or time.monotonic() - idle_since < IDLE_PING_AFTER:
            return
        try:
            with dbapi_connection.cursor() as cursor:
                cursor.execute("SELECT 1")
        except engine.dialect.loaded_dbapi.Error as error:
            # The pool replaces the connection and tries again (up to three times).
            raise exc.DisconnectionError(str(error)) from error


def dispose_all() -> None:
    """Close every engine of this process (tests, shutdown)."""
    with _lock:
        for key in [k for k in _engines if k[0] == os.getpid()]:
            _engines.pop(key).dispose()


@contextmanager
def translated(url: str | URL) -> Iterator[None]:
    """Turn database errors into saga_tasks errors: a connection lost or refused is a
    ``ServiceUnavailable``, a lost serialization race a ``ConcurrencyConflict``, a value
    PostgreSQL cannot store (NUL characters, out-of-range numbers) an ``InputError``.

    ``url`` (an engine's URL object will do) is rendered only if an error names it.
    """
    try:
        yield
    except exc.DataError as error:
        raise InputError(f"a value cannot be stored: {first_line(error)}") from error
    except ValueError as error:
        if "NUL" not in str(error):
            raise
        raise InputError("text must not contain NUL characters") from error
    except exc.OperationalError as error:
        if _is_serialization_failure(error):
            raise ConcurrencyConflict(str(error.orig).strip()) from error
        raise ServiceUnavailable("PostgreSQL", _written(url), error) from error
    except exc.InterfaceError as error:
        raise ServiceUnavailable("PostgreSQL", _written(url), error) from error


def _written(url: str | URL) -> str:
    """The URL as written, password and all: only ``unavailable`` sees it, to mask it and
    scrub the driver's words of it."""
    return url if isinstance(url, str) else url.render_as_string(hide_password=False)


def _is_serialization_failure(error: exc.OperationalError) -> bool:
    code = getattr(error.orig, "pgcode", None)
    return code in ("40001", "40P01")


def check_database(url: str) -> None:
    """Raise ``ServiceUnavailable`` unless PostgreSQL answers at ``url``."""
    engine = create_engine(url, poolclass=NullPool, connect_args={"connect_timeout": 3})
    try:
        with translated(url), engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    finally:
        engine.dispose()


def query_on(conn: Connection) -> Query:
    """``conn`` as a ``readsql.Query``: SQL text with ``:name`` parameters, plain rows."""

    def run(sql: str, params: Mapping[str, Any]) -> list[dict[str, Any]]:
        return [plain(m) for m in conn.execute(text(sql), dict(params)).mappings()]

    return run
