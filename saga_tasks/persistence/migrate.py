"""The schema's migrations: the library's Alembic chain, then an app's own chains, in one
transaction under one advisory lock, and the revision each chain is at."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.environment import EnvironmentContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy import Connection, create_engine, text
from sqlalchemy.pool import NullPool

from saga_tasks.errors import ConfigurationError
from saga_tasks.persistence.db import translated
from saga_tasks.persistence.schema import lock_migrations

LIBRARY_CHAIN = "saga_tasks"
"""Name of the saga schema's chain in reports; an app's chain is named after its folder."""


def migrations_dir() -> Path:
    """The library's Alembic chain: shipped inside the wheel, or in a checkout's migrations/."""
    package = Path(__file__).resolve().parent.parent  # saga_tasks/
    for candidate in (package / "_migrations", package.parent / "migrations" / "saga_tasks"):
        if (candidate / "env.py").exists():
            return candidate
    raise ConfigurationError("cannot find the migrations directory")


def chains(
    migrations: Sequence[str | Path] = (), *, library: bool = True
) -> list[tuple[str, Path]]:
    """The library's chain (unless ``library`` is False: a participant's database), then
    each of ``migrations``, named for reports."""
    found = [(LIBRARY_CHAIN, migrations_dir())] if library else []
    for location in migrations:
        path = Path(location).resolve()
        if not (path / "env.py").exists():
            raise ConfigurationError(f"{location} is not an Alembic script directory (no env.py)")
        found.append((path.name, path))
    return found


def upgrade(
    url: str, migrations: Sequence[str | Path] = (), *, library: bool = True
) -> list[tuple[str, str]]:
    """Bring the saga schema (unless ``library`` is False), then each chain of
    ``migrations``, to head; return each chain's revision. One transaction under one
    advisory lock: two runs at once serialize, and a failing chain leaves every chain
    of this database as it was."""
    found = chains(migrations, library=library)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    engine = create_engine(url, poolclass=NullPool, connect_args={"connect_timeout": 5})
    try:
        with translated(url), engine.connect() as conn, conn.begin():
            lock_migrations(conn)
            for name, path in found:
                try:
                    command.upgrade(_alembic_config(path, url, conn), "head")
                except CommandError as exc:  # e.g. a revision this chain does not know
                    raise ConfigurationError(f"migrating {name}: {exc}") from exc
            return [(name, _revision(path, url, conn)) for name, path in found]
    finally:
        engine.dispose()


def current_revisions(
    url: str, migrations: Sequence[str | Path] = (), *, library: bool = True
) -> list[tuple[str, str]]:
    """Each chain's revision (``none`` for a chain never applied); changes nothing."""
    found = chains(migrations, library=library)
    engine = create_engine(url, poolclass=NullPool, connect_args={"connect_timeout": 5})
    try:
        with translated(url), engine.connect() as conn:
            revisions = [(name, _revision(path, url, conn)) for name, path in found]
            conn.rollback()  # a chain's env.py may have created its version table's schema
            return revisions
    finally:
        engine.dispose()


def revision(
    url: str, location: str | Path, message: str, *, autogenerate: bool = True
) -> Path | None:
    """Write the chain's next revision, numbered after its head when its revisions are
    numbered (``0002`` after ``0001``); with ``autogenerate``, the operations that bring
    the database at ``url`` (which must be at the chain's head) to the chain's metadata.
    The file written, or None when autogenerate found nothing to change (no file then);
    nothing in the database changes."""
    ((name, path),) = chains([location], library=False)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    engine = create_engine(url, poolclass=NullPool, connect_args={"connect_timeout": 5})
    try:
        with translated(url), engine.connect() as conn:
            cfg = _alembic_config(path, url, conn)
            try:
                written = command.revision(
                    cfg,
                    message=message,
                    autogenerate=autogenerate,
                    rev_id=_next_id(cfg),
                    process_revision_directives=_skip_empty if autogenerate else None,
                )
            except CommandError as exc:
                raise ConfigurationError(f"revision of {name}: {exc}{_hint(str(exc))}") from exc
            finally:
                conn.rollback()
    finally:
        engine.dispose()
    scripts = [s for s in (written if isinstance(written, list) else [written]) if s is not None]
    return Path(scripts[0].path) if scripts else None


def _skip_empty(_context: Any, _revision: Any, directives: list[Any]) -> None:
    """An autogenerated revision with no operation is not written: nothing changed."""
    if directives and directives[0].upgrade_ops.is_empty():
        directives[:] = []


def _hint(error: str) -> str:
    if "up to date" in error:
        return " (run saga-tasks db upgrade first)"
    if "does not provide a MetaData" in error:
        return (
            " (its env.py names no metadata: set target_metadata=<participant>.metadata "
            "there, as init participant --module MODULE:ATTRIBUTE writes it)"
        )
    return ""


def _next_id(cfg: Any) -> str | None:
    """``0002`` after a head ``0001``; None (Alembic's random id) when ids are not numbers."""
    ids = [r.revision for r in ScriptDirectory.from_config(cfg).walk_revisions()]
    if not ids:
        return "0001"
    if not all(i.isdigit() for i in ids):
        return None
    width = max(len(i) for i in ids)
    return f"{max(int(i) for i in ids) + 1:0{width}d}"


def _alembic_config(path: Path, url: str, conn: Connection) -> Any:
    cfg = Config()
    cfg.set_main_option("script_location", str(path))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    cfg.attributes["connection"] = conn
    return cfg


def _revision(path: Path, url: str, conn: Connection) -> str:
    """The chain's revision, read through its own env.py (which knows its version table)."""
    cfg = _alembic_config(path, url, conn)
    script = ScriptDirectory.from_config(cfg)
    heads: list[str] = []

    def read(rev: Any, _context: Any) -> list[Any]:
        heads.extend(str(r) for r in rev)
        return []

    with EnvironmentContext(cfg, script, fn=read, dont_mutate=True):
        script.run_env()
    return ",".join(heads) or "none"


def current_revision(url: str) -> str | None:
    """The saga schema's revision, read without Alembic (None: never migrated)."""
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
