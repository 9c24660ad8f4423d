"""Engines per process, and the boundary where database errors become ours.

An engine is created lazily in the process that uses it and never shared across a
fork: a prefork child that inherits its parent's pool would use the parent's sockets.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Engine, create_engine, exc, text
from sqlalchemy.pool import NullPool

from saga_tasks.config import mask_url
from saga_tasks.errors import ConcurrencyConflict, InputError, ServiceUnavailable

_engines: dict[tuple[int, str, int], Engine] = {}
_lock = threading.Lock()


def get_engine(url: str, pool_size: int = 2) -> Engine:
    """This process's engine for ``url``; a forked child gets a fresh one."""
    key = (os.getpid(), url, pool_size)
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
                pool_pre_ping=True,
                pool_recycle=1800,
                connect_args={"connect_timeout": 5, "application_name": "saga_tasks"},
            )
            _engines[key] = engine
    return engine


def dispose_all() -> None:
    """Close every engine of this process (tests, shutdown)."""
    with _lock:
        for key in [k for k in _engines if k[0] == os.getpid()]:
            _engines.pop(key).dispose()


@contextmanager
def translated(url: str) -> Iterator[None]:
    """Turn database errors into saga_tasks errors: a connection lost or refused is a
    ``ServiceUnavailable``, a lost serialization race a ``ConcurrencyConflict``, a value
    PostgreSQL cannot store (NUL characters, out-of-range numbers) an ``InputError``."""
    try:
        yield
    except exc.DataError as error:
        raise InputError(f"a value cannot be stored: {_first_line(error)}") from error
    except ValueError as error:
        if "NUL" not in str(error):
            raise
        raise InputError("text must not contain NUL characters") from error
    except exc.OperationalError as error:
        if _is_serialization_failure(error):
            raise ConcurrencyConflict(str(error.orig).strip()) from error
        raise ServiceUnavailable("PostgreSQL", mask_url(url), _first_line(error)) from error
    except exc.InterfaceError as error:
        raise ServiceUnavailable("PostgreSQL", mask_url(url), _first_line(error)) from error


def _is_serialization_failure(error: exc.OperationalError) -> bool:
    code = getattr(error.orig, "pgcode", None)
    return code in ("40001", "40P01")


def _first_line(error: BaseException) -> str:
    orig = getattr(error, "orig", None) or error
    lines = str(orig).strip().splitlines()
    return lines[0] if lines else type(orig).__name__


def check_database(url: str) -> None:
    """Raise ``ServiceUnavailable`` unless PostgreSQL answers at ``url``."""
    engine = create_engine(url, poolclass=NullPool, connect_args={"connect_timeout": 3})
    try:
        with translated(url), engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    finally:
        engine.dispose()
