"""What operators read, as JSON shapes shared by the CLI, the HTTP API and the dashboard.

Shapes (documented in the README and pinned by tests):

    saga:  {saga_id, saga_type, business_key, status, status_reason, version,
            definition_version, created_at, updated_at, finished_at, deadline,
            steps: [{step, status, attempt, compensation_attempt, requested_at,
                     finished_at, last_error}],
            history: [{id, at, event, step, status_before, status_after,
                       step_status_before, step_status_after, message_id,
                       causation_id, actor, reason}],   (a page, newest first)
            history_next,                               (cursor of the older page, or null)
            notes: [{event, noted, dropped, last_at}],  (notes kept to a few per kind)
            held_messages: [{id, holding, status, reason, step, kind, message_id, ...}],
            held_count: {total, pending, not_attested}}
    list:  {sagas: [{saga_id, saga_type, business_key, status, status_reason,
                     version, created_at, updated_at, finished_at}], count}
    schedules: {schedules: [{name, saga_type, schedule, every_seconds, cron, key,
                             grace_seconds, next_run, last_run, last_error}], count, now}
           a run: {tick, business_key, saga_id, saga_status, started_at, fired_at,
                   firings, missed_before, error}
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from saga_tasks.core.model import SagaState
from saga_tasks.core.states import ACTIVE_SAGA, SagaStatus
from saga_tasks.ops.reader import Reader
from saga_tasks.persistence import readsql

if TYPE_CHECKING:
    from saga_tasks.app import SagaApp

# The read views of ``show``, ``list`` and ``stuck`` go through ``readsql`` and import no
# SQLAlchemy when given a ``Reader`` (the CLI's light path); the others import what they
# need when called.


@contextmanager
def _reading(app: SagaApp | Reader) -> Iterator[readsql.Query]:
    if isinstance(app, Reader):
        with app.query() as query:
            yield query
        return
    from saga_tasks.persistence.db import query_on, translated

    with translated(app.settings.database_url), app.engine.connect() as conn:
        yield query_on(conn)


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


HISTORY_PAGE = 50
"""History lines a saga view holds unless asked for another number (at most
``HISTORY_PAGE_MOST``): a page, newest first, and the cursor of the next."""
HISTORY_PAGE_MOST = 1000
HELD_SHOWN = 20
"""Held messages a saga view lists (pending and attested first); ``held_count`` counts
them all, and ``GET /held?saga_id=`` lists them."""


def saga_view(
    app: SagaApp | Reader,
    saga_id: str,
    *,
    history_limit: int = HISTORY_PAGE,
    history_before: int | None = None,
) -> dict[str, Any]:
    return saga_state_and_view(
        app, saga_id, history_limit=history_limit, history_before=history_before
    )[1]


def saga_state_and_view(
    app: SagaApp | Reader,
    saga_id: str,
    *,
    history_limit: int = HISTORY_PAGE,
    history_before: int | None = None,
) -> tuple[SagaState, dict[str, Any]]:
    """The saga as the decider sees it, and its view, from one read. The view's history
    is one page, newest first: ``history_limit`` lines older than the line with id
    ``history_before`` (None: the newest), and ``history_next`` the cursor of the page
    after it (the ``history_before`` that asks for it; None on the last page)."""
    limit = max(1, min(history_limit, HISTORY_PAGE_MOST))
    with _reading(app) as query:
        state = readsql.get(query, saga_id)
        history = readsql.history(query, state.saga_id, limit=limit + 1, before=history_before)
        notes = readsql.note_tallies(query, state.saga_id)
        held_rows = readsql.held_of_saga(query, state.saga_id, limit=HELD_SHOWN)
        held_count = readsql.held_counts(query, state.saga_id)
    more = len(history) > limit
    history = history[:limit]
    updated = state.extra.get("updated_at")
    return state, {
        "saga_id": state.saga_id,
        "saga_type": state.saga_type,
        "business_key": state.business_key,
        "status": state.status.value,
        "status_reason": state.reason,
        "version": state.version,
        "definition_version": state.definition_version,
        "created_at": _iso(state.created_at),
        "updated_at": _iso(updated if isinstance(updated, datetime) else None),
        "finished_at": _iso(state.finished_at),
        "deadline": _iso(state.deadline),
        "steps": [
            {
                "step": name,
                "status": st.status.value,
                "attempt": st.attempt,
                "compensation_attempt": st.compensation_attempt,
                "requested_at": _iso(st.requested_at),
                "finished_at": _iso(st.finished_at),
                "last_error": st.error,
            }
            for name, st in state.steps.items()
        ],
        "history": [
            {
                "id": h["id"],
                "at": _iso(h["at"]),
                "event": h["event"],
                "step": h["step"],
                "status_before": h["status_before"],
                "status_after": h["status_after"],
                "step_status_before": h["step_status_before"],
                "step_status_after": h["step_status_after"],
                "message_id": h["message_id"],
                "causation_id": h["causation_id"],
                "actor": h["actor"],
                "reason": h["reason"],
            }
            for h in history
        ],
        "history_next": history[-1]["id"] if more else None,
        "notes": [
            {
                "event": n["event"],
                "noted": n["noted"],
                "dropped": n["dropped"],
                "last_at": _iso(n["last_at"]),
            }
            for n in notes
        ],
        "held_messages": [held_summary(r) for r in held_rows],
        "held_count": held_count,
    }


def list_view(
    app: SagaApp | Reader,
    *,
    status: SagaStatus | None = None,
    saga_type: str | None = None,
    business_key: str | None = None,
    limit: int = 50,
) -> dict[str, Any]:
    with _reading(app) as query:
        rows = readsql.list_sagas(
            query,
            status=status.value if status is not None else None,
            saga_type=saga_type,
            business_key=business_key,
            limit=limit,
        )
    items = [
        {
            "saga_id": str(r["saga_id"]),
            "saga_type": r["saga_type"],
            "business_key": r["business_key"],
            "status": r["status"],
            "status_reason": r["status_reason"],
            "version": r["version"],
            "created_at": _iso(r["created_at"]),
            "updated_at": _iso(r["updated_at"]),
            "finished_at": _iso(r["finished_at"]),
        }
        for r in rows
    ]
    return {"sagas": items, "count": len(items)}


def invalid_view(app: SagaApp, *, limit: int = 50) -> dict[str, Any]:
    from saga_tasks.persistence import reads
    from saga_tasks.persistence.db import translated

    with translated(app.settings.database_url), app.engine.connect() as conn:
        rows = reads.invalid_messages(conn, limit)
    for r in rows:
        r["received_at"] = _iso(r["received_at"])
    return {"invalid_messages": rows, "count": len(rows)}


def stuck(
    app: SagaApp | Reader,
    *,
    older_than: float | None = None,
    limit: int = 100,
    status: str | None = None,
    saga_type: str | None = None,
    business_key: str | None = None,
) -> dict[str, Any]:
    """Active sagas with no change for ``older_than`` seconds (``SAGA_STUCK_AFTER``),
    longest idle first; optionally of one active status, type or business key."""
    seconds = app.settings.stuck_after if older_than is None else older_than
    cutoff = app.clock.now() - timedelta(seconds=seconds)
    wanted = [s.value for s in ACTIVE_SAGA if status in (None, s.value)]
    rows = []
    if wanted:
        with _reading(app) as query:
            rows = readsql.quiet_sagas(
                query,
                statuses=wanted,
                before=cutoff,
                saga_type=saga_type,
                business_key=business_key,
                limit=limit,
            )
    now = app.clock.now()
    items = [
        {
            "saga_id": str(r["saga_id"]),
            "saga_type": r["saga_type"],
            "business_key": r["business_key"],
            "status": r["status"],
            "status_reason": r["status_reason"],
            "version": r["version"],
            "created_at": r["created_at"].isoformat(),
            "updated_at": r["updated_at"].isoformat(),
            "finished_at": None,
            "idle_seconds": round((now - r["updated_at"]).total_seconds(), 1),
            "next_wake_at": r["next_wake_at"].isoformat() if r["next_wake_at"] else None,
        }
        for r in rows
    ]
    return {"stuck": items, "count": len(items), "older_than_seconds": seconds}


def held_list(
    app: SagaApp,
    holding: str,
    *,
    status: str | None = "pending",
    saga_id: str | None = None,
    limit: int = 50,
) -> dict[str, Any]:
    from saga_tasks.persistence import reads
    from saga_tasks.persistence.db import translated

    with translated(app.settings.database_url), app.engine.connect() as conn:
        found = reads.held_messages(conn, holding, status=status, saga_id=saga_id, limit=limit)
    rows = [held_summary(r) for r in found]
    return {"messages": rows, "count": len(rows)}


def held_show(app: SagaApp, held_id: int) -> dict[str, Any]:
    """One held message with its replay checks as they stand now."""

    from saga_tasks.persistence import held as held_sql
    from saga_tasks.persistence.db import translated

    with translated(app.settings.database_url), app.engine.connect() as conn:
        row = held_sql.get(conn, held_id)
        checks = app.replayer.checks(conn, row)
    view = held_summary(row)
    view["headers"] = row["headers"]
    view["body"] = row["body"] if not row["body_base64"] else f"(base64) {row['body']}"
    view["replay_checks"] = [
        {"check": c.name, "finding": c.finding, "blocks": c.blocks} for c in checks
    ]
    return view


def held_outcome(app: SagaApp, held_id: int) -> dict[str, Any]:
    """What became of a held message an operator acted on, without its content: its
    status (the outcome) and its saga's version, for a caller who may not read."""
    with _reading(app) as query:
        found = readsql.held_outcome(query, held_id)
    return {
        "held_id": held_id,
        "saga_id": found["saga_id"],
        "outcome": found["status"],
        "version": found["version"],
    }


def held_summary(row: dict[str, Any]) -> dict[str, Any]:
    def iso(value: Any) -> str | None:
        return value.isoformat() if value is not None else None

    return {
        "id": row["id"],
        "holding": row["holding"],
        "status": row["status"],
        "reason": row["reason"],
        "saga_id": str(row["saga_id"]) if row["saga_id"] else None,
        "step": row["step"],
        "kind": row["kind"],
        "task_name": row["task_name"],
        "message_id": row["message_id"],
        "original_queue": row["original_queue"],
        "original_routing_key": row["original_routing_key"],
        "death_count": row["death_count"],
        "first_death_at": iso(row["first_death_at"]),
        "last_death_at": iso(row["last_death_at"]),
        "received_at": iso(row["received_at"]),
        "resolved_by": row["resolved_by"],
        "resolved_at": iso(row["resolved_at"]),
        "resolution": row["resolution"],
        "published_by": row["published_by"],
        "attested": row["attested"],
    }


def schedules_view(app: SagaApp) -> dict[str, Any]:
    """Each schedule of the app: what it starts, when next, and its newest run and error."""
    now = app.clock.now()
    names = [s.name for s in app.schedules]
    last: dict[str, dict[str, Any]] = {}
    failed: dict[str, dict[str, Any]] = {}
    if names:
        from saga_tasks.persistence import schedule_runs
        from saga_tasks.persistence.db import translated

        with translated(app.settings.database_url), app.engine.connect() as conn:
            last = schedule_runs.latest(conn, names)
            failed = schedule_runs.latest_errors(conn, names)
    items = [
        {
            "name": s.name,
            "saga_type": s.saga_type,
            "schedule": s.describe(),
            "every_seconds": s.every.total_seconds() if s.every is not None else None,
            "cron": str(s.cron) if s.cron is not None else None,
            "key": s.key,
            "grace_seconds": s.grace.total_seconds() if s.grace is not None else None,
            "next_run": _iso(s.next_tick(now)),
            "last_run": schedule_run(last.get(s.name)),
            "last_error": schedule_run(failed.get(s.name)),
        }
        for s in app.schedules
    ]
    return {"schedules": items, "count": len(items), "now": _iso(now)}


def schedule_run(row: dict[str, Any] | None) -> dict[str, Any] | None:
    if row is None:
        return None
    return {
        "tick": _iso(row["tick"]),
        "business_key": row["business_key"],
        "saga_id": str(row["saga_id"]) if row["saga_id"] else None,
        "saga_status": row["saga_status"],
        "started_at": _iso(row["started_at"]),
        "fired_at": _iso(row["fired_at"]),
        "firings": row["firings"],
        "missed_before": row["missed_before"],
        "error": row["error"],
    }
