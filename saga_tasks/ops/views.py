"""The JSON shapes of a saga and of a saga list, shared by the CLI and the HTTP API.

Shapes (documented in the README and pinned by tests):

    saga:  {saga_id, saga_type, business_key, status, status_reason, version,
            definition_version, created_at, updated_at, finished_at, deadline,
            steps: [{step, status, attempt, compensation_attempt, requested_at,
                     finished_at, last_error}],
            history: [{at, event, step, status_before, status_after,
                       step_status_before, step_status_after, message_id,
                       causation_id, actor, reason}],
            held_messages: [{id, holding, status, reason, step, kind, message_id, ...}]}
    list:  {sagas: [{saga_id, saga_type, business_key, status, status_reason,
                     version, created_at, updated_at, finished_at}], count}
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from saga_tasks.app import SagaApp
from saga_tasks.core.states import SagaStatus
from saga_tasks.persistence import sagas
from saga_tasks.persistence.db import translated
from saga_tasks.persistence.tables import invalid_message


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def saga_view(app: SagaApp, saga_id: str) -> dict[str, Any]:
    from sqlalchemy import select

    from saga_tasks.ops.operator import held_summary
    from saga_tasks.persistence.tables import held_message

    state = app.orchestrator.get(saga_id)
    with translated(app.settings.database_url), app.engine.connect() as conn:
        history = sagas.history(conn, state.saga_id)
        held_rows = conn.execute(
            select(held_message)
            .where(held_message.c.saga_id == state.saga_id)
            .order_by(held_message.c.id)
        ).all()
    updated = state.extra.get("updated_at")
    return {
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
        "held_messages": [held_summary(dict(r._mapping)) for r in held_rows],
    }


def list_view(
    app: SagaApp,
    *,
    status: SagaStatus | None = None,
    saga_type: str | None = None,
    business_key: str | None = None,
    limit: int = 50,
) -> dict[str, Any]:
    with translated(app.settings.database_url), app.engine.connect() as conn:
        rows = sagas.list_sagas(
            conn, status=status, saga_type=saga_type, business_key=business_key, limit=limit
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
    from sqlalchemy import select

    stmt = select(invalid_message).order_by(invalid_message.c.id.desc()).limit(limit)
    with translated(app.settings.database_url), app.engine.connect() as conn:
        rows = [dict(r._mapping) for r in conn.execute(stmt)]
    for r in rows:
        r["received_at"] = _iso(r["received_at"])
    return {"invalid_messages": rows, "count": len(rows)}
