"""Bulk actions by incident: which sagas a filter selects, the run's row, and what it did
to each saga.

A saga is acted on in a transaction that also inserts its ``bulk_item`` row (on the
incident's and saga's key): killed at any instant, a run has either done both or
neither, so running the incident again continues with the sagas it has not reached and
never acts twice on one.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, and_, exists, func, not_, or_, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.sql.elements import ColumnElement

from saga_tasks.persistence.tables import bulk_item, bulk_run, saga_instance, saga_step

ACCEPTED = "accepted"
REFUSED = "refused"
MOVED = "moved"
"""Selected when the run read its batch, no longer when it locked the saga: not acted on."""


@dataclass(frozen=True)
class Selection:
    """Which sagas a bulk run acts on; every field given must hold (and), none: all."""

    saga_type: str | None = None
    status: str | None = None
    definition_version: int | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None
    key_prefix: str | None = None
    error: str | None = None
    """Text in the saga's reason or in a step's last error (case-insensitive)."""

    def document(self) -> dict[str, Any]:
        """The selection as the JSON stored with its run (what was given only)."""
        return {
            k: (v.isoformat() if isinstance(v, datetime) else v)
            for k, v in asdict(self).items()
            if v is not None
        }


def _where(sel: Selection) -> list[ColumnElement[bool]]:
    s = saga_instance.c
    found: list[ColumnElement[bool]] = []
    if sel.saga_type is not None:
        found.append(s.saga_type == sel.saga_type)
    if sel.status is not None:
        found.append(s.status == sel.status)
    if sel.definition_version is not None:
        found.append(s.definition_version == sel.definition_version)
    if sel.created_after is not None:
        found.append(s.created_at >= sel.created_after)
    if sel.created_before is not None:
        found.append(s.created_at < sel.created_before)
    if sel.key_prefix is not None:
        found.append(s.business_key.startswith(sel.key_prefix, autoescape=True))
    if sel.error is not None:
        step_error = exists().where(
            and_(
                saga_step.c.saga_id == s.saga_id,
                saga_step.c.last_error.icontains(sel.error, autoescape=True),
            )
        )
        found.append(or_(s.status_reason.icontains(sel.error, autoescape=True), step_error))
    return found


def count(conn: Connection, sel: Selection) -> int:
    """How many sagas the selection holds now."""
    query = select(func.count()).select_from(saga_instance).where(*_where(sel))
    return int(conn.execute(query).scalar_one())


def sample(conn: Connection, sel: Selection, limit: int) -> list[dict[str, Any]]:
    """The first sagas of the selection, oldest first, as a dry run shows them."""
    s = saga_instance.c
    query = (
        select(s.saga_id, s.saga_type, s.business_key, s.status, s.status_reason, s.created_at)
        .where(*_where(sel))
        .order_by(s.created_at, s.saga_id)
        .limit(limit)
    )
    return [dict(r._mapping) for r in conn.execute(query)]


def lock_if_selected(conn: Connection, saga_id: str, sel: Selection) -> bool:
    """Lock the saga's row, then say whether the selection still holds it (the caller acts
    in this transaction); False if it moved out since its batch was read. Two statements:
    the second, after the lock, sees every table as the lock's holder left it (a step's
    error too, which a filtered ``FOR UPDATE`` would read from before its wait)."""
    s = saga_instance.c
    conn.execute(select(s.saga_id).where(s.saga_id == saga_id).with_for_update())
    return (
        conn.execute(select(s.saga_id).where(s.saga_id == saga_id, *_where(sel))).first()
        is not None
    )


def _unreached(incident: str) -> ColumnElement[bool]:
    s = saga_instance.c
    return not_(
        exists().where(and_(bulk_item.c.incident == incident, bulk_item.c.saga_id == s.saga_id))
    )


def pending(conn: Connection, incident: str, sel: Selection, limit: int) -> list[str]:
    """The next sagas of the selection the incident has not reached, oldest first."""
    s = saga_instance.c
    query = (
        select(s.saga_id)
        .where(*_where(sel), _unreached(incident))
        .order_by(s.created_at, s.saga_id)
        .limit(limit)
    )
    return [str(r) for r in conn.execute(query).scalars()]


def count_pending(conn: Connection, incident: str, sel: Selection) -> int:
    """How many sagas of the selection the incident has not reached."""
    query = (
        select(func.count()).select_from(saga_instance).where(*_where(sel), _unreached(incident))
    )
    return int(conn.execute(query).scalar_one())


@dataclass(frozen=True)
class Run:
    incident: str
    verb: str
    selection: dict[str, Any]
    options: dict[str, Any]
    actor: str
    reason: str
    started_at: datetime
    finished_at: datetime | None


def begin(conn: Connection, run: Run) -> Run:
    """The incident's run: this one, inserted, or the one already under its name, for
    the caller to check it is the same."""
    conn.execute(
        pg_insert(bulk_run)
        .values(
            incident=run.incident,
            verb=run.verb,
            selection=run.selection,
            options=run.options,
            actor=run.actor,
            reason=run.reason,
            started_at=run.started_at,
        )
        .on_conflict_do_nothing(index_elements=["incident"])
    )
    found = find(conn, run.incident)
    assert found is not None
    return found


def find(conn: Connection, incident: str) -> Run | None:
    row = conn.execute(select(bulk_run).where(bulk_run.c.incident == incident)).first()
    return None if row is None else Run(**row._mapping)


def reached(
    conn: Connection,
    incident: str,
    saga_id: str,
    *,
    outcome: str,
    detail: str | None = None,
    now: datetime,
) -> bool:
    """Write that the incident reached the saga; False if it had already (a run of the
    same incident at the same time got there first: the caller rolls its action back)."""
    row = conn.execute(
        pg_insert(bulk_item)
        .values(incident=incident, saga_id=saga_id, outcome=outcome, detail=detail, at=now)
        .on_conflict_do_nothing(index_elements=["incident", "saga_id"])
        .returning(bulk_item.c.saga_id)
    ).first()
    return row is not None


def tally(conn: Connection, incident: str) -> dict[str, int]:
    """How many sagas the incident reached, by outcome."""
    rows = conn.execute(
        select(bulk_item.c.outcome, func.count())
        .where(bulk_item.c.incident == incident)
        .group_by(bulk_item.c.outcome)
    ).all()
    counts = {ACCEPTED: 0, REFUSED: 0, MOVED: 0}
    counts.update({str(outcome): int(n) for outcome, n in rows})
    return counts


def finish(conn: Connection, incident: str, now: datetime) -> None:
    conn.execute(bulk_run.update().where(bulk_run.c.incident == incident).values(finished_at=now))
