"""Operator actions on sagas, shared by the CLI and the HTTP API.

Every action names an actor and a reason, states the saga version it was decided
on (``expect_version``), and is written to the saga's history. The rules of what an
action may do live in the decider; this module only carries the request there.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import select

from saga_tasks.core.events import OperatorAction, OperatorVerb
from saga_tasks.errors import InputError
from saga_tasks.persistence.db import translated
from saga_tasks.persistence.tables import held_message, saga_instance

if TYPE_CHECKING:
    from saga_tasks.app import SagaApp


def act(
    app: SagaApp,
    saga_id: str,
    verb: OperatorVerb | str,
    *,
    actor: str,
    reason: str,
    expect_version: int,
    step: str | None = None,
    resolution: str | None = None,
) -> dict[str, Any]:
    """Apply one operator action; return the saga as ``show`` prints it."""
    from saga_tasks.ops.views import saga_view

    if not actor.strip() or not reason.strip():
        raise InputError("an operator action needs --actor and --reason")
    action = OperatorAction(
        verb=OperatorVerb(verb),
        actor=actor.strip(),
        reason=reason.strip(),
        step=step,
        resolution=resolution.upper() if resolution else None,
    )
    app.orchestrator.act(saga_id, action, expect_version=expect_version)
    return saga_view(app, saga_id)


def stuck(
    app: SagaApp,
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
    active = ("RUNNING", "COMPENSATING")
    wanted = [s for s in active if status in (None, s)]
    c = saga_instance.c
    stmt = (
        select(
            c.saga_id,
            c.saga_type,
            c.business_key,
            c.status,
            c.status_reason,
            c.version,
            c.created_at,
            c.updated_at,
            c.finished_at,
            c.next_wake_at,
        )
        .where(c.status.in_(wanted), c.updated_at < cutoff)
        .order_by(c.updated_at)
        .limit(limit)
    )
    if saga_type is not None:
        stmt = stmt.where(c.saga_type == saga_type)
    if business_key is not None:
        stmt = stmt.where(c.business_key == business_key)
    rows = []
    if wanted:
        with translated(app.settings.database_url), app.engine.connect() as conn:
            rows = [dict(r._mapping) for r in conn.execute(stmt)]
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
    stmt = select(held_message).where(held_message.c.holding == holding)
    if status:
        stmt = stmt.where(held_message.c.status == status)
    if saga_id:
        stmt = stmt.where(held_message.c.saga_id == saga_id)
    stmt = stmt.order_by(held_message.c.id.desc()).limit(limit)
    with translated(app.settings.database_url), app.engine.connect() as conn:
        rows = [held_summary(dict(r._mapping)) for r in conn.execute(stmt)]
    return {"messages": rows, "count": len(rows)}


def held_show(app: SagaApp, held_id: int) -> dict[str, Any]:
    """One held message with its replay checks as they stand now."""
    from saga_tasks.runtime.holding import held, replay_checks

    with translated(app.settings.database_url), app.engine.connect() as conn:
        row = held(conn, held_id)
        checks = replay_checks(app, conn, row)
    view = held_summary(row)
    view["headers"] = row["headers"]
    view["body"] = row["body"] if not row["body_base64"] else f"(base64) {row['body']}"
    view["replay_checks"] = [
        {"check": c.name, "finding": c.finding, "blocks": c.blocks} for c in checks
    ]
    return view


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
    }
