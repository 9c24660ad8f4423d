"""The operator's reads of a saga, as SQL text over any driver: no SQLAlchemy here.

``saga-tasks show``, ``list`` and ``stuck`` answer from these through psycopg2 alone
(``ops.reader``), which saves importing SQLAlchemy (most of a read command's time); the
app's views, the API and the orchestrator's ``sagas.get`` run the same functions over a
SQLAlchemy connection (``db.query_on``). A ``Query`` runs SQL with ``:name`` parameters
and returns plain rows, UUIDs as strings whatever the driver's habit.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from saga_tasks.core.model import SagaState, StepState
from saga_tasks.core.states import SagaStatus, StepStatus
from saga_tasks.errors import SagaNotFound, SagaPurged

Query = Callable[[str, Mapping[str, Any]], list[dict[str, Any]]]

PARAM = re.compile(r"(?<![:\w]):(\w+)")
"""A ``:name`` parameter (not a ``::`` cast) in SQL text."""


def pyformat(sql: str) -> str:
    """``:name`` parameters as psycopg2's ``%(name)s``."""
    return PARAM.sub(r"%(\1)s", sql)


_SAGA_WITH_STEPS = """SELECT s.*, st.step, st.status AS step_status, st.attempt,
       st.compensation_attempt, st.generation, st.command_id, st.compensation_id,
       st.requested_at, st.deadline AS step_deadline, st.finished_at AS step_finished_at,
       st.result, st.last_error, st.given_up
FROM saga.saga_instance s LEFT JOIN saga.saga_step st ON st.saga_id = s.saga_id
WHERE s.saga_id = CAST(:saga_id AS uuid)
ORDER BY st.position"""

_SUMMARY = (
    "saga_id, saga_type, business_key, status, status_reason, version, "
    "created_at, updated_at, finished_at"
)


def plain(row: Mapping[Any, Any]) -> dict[str, Any]:
    """A row with its UUIDs as strings (psycopg2 gives strings, SQLAlchemy UUIDs)."""
    return {k: str(v) if isinstance(v, uuid.UUID) else v for k, v in row.items()}


def to_state(rows: Sequence[Mapping[Any, Any]], head: Mapping[Any, Any] | None = None) -> SagaState:
    """A saga from its step rows (joined with the saga's columns, or ``head`` given)."""
    saga: Mapping[Any, Any] = head if head is not None else rows[0]
    steps: dict[str, StepState] = {}
    for m in rows:
        if m["step"] is None:
            continue
        steps[m["step"]] = StepState(
            status=StepStatus(m["step_status"]),
            attempt=m["attempt"],
            compensation_attempt=m["compensation_attempt"],
            generation=m["generation"],
            command_id=m["command_id"],
            compensation_id=m["compensation_id"],
            requested_at=m["requested_at"],
            deadline=m["step_deadline"],
            finished_at=m["step_finished_at"],
            result=m["result"],
            error=m["last_error"],
            given_up=m["given_up"],
        )
    return SagaState(
        saga_id=saga["saga_id"],
        saga_type=saga["saga_type"],
        definition_version=saga["definition_version"],
        business_key=saga["business_key"],
        status=SagaStatus(saga["status"]),
        version=saga["version"],
        payload=saga["payload"],
        steps=steps,
        created_at=saga["created_at"],
        deadline=saga["deadline"],
        reason=saga["status_reason"],
        finished_at=saga["finished_at"],
        correlation_id=saga["correlation_id"],
        traceparent=saga["traceparent"],
        extra={"updated_at": saga["updated_at"]},
        id_key=saga["id_key"],
    )


def load(query: Query, saga_id: str) -> SagaState | None:
    """A saga with its steps, unlocked: for reading tools."""
    rows = query(_SAGA_WITH_STEPS, {"saga_id": saga_id})
    return to_state(rows) if rows else None


def get(query: Query, saga_id: str) -> SagaState:
    """``load``, or ``SagaNotFound`` naming what was asked (a bad id says so too)."""
    try:
        uuid.UUID(saga_id)
    except ValueError:
        raise SagaNotFound(f"{saga_id!r} is not a saga id (a UUID)") from None
    state = load(query, saga_id)
    if state is None:
        gone = query(
            "SELECT status, finished_at, purged_at FROM saga.purged_saga "
            "WHERE saga_id = CAST(:saga_id AS uuid)",
            {"saga_id": saga_id},
        )
        if gone:
            raise SagaPurged(saga_id, **gone[0])
        raise SagaNotFound(f"no saga {saga_id}")
    return state


def history(
    query: Query, saga_id: str, *, limit: int, before: int | None = None
) -> list[dict[str, Any]]:
    """Up to ``limit`` history lines of a saga, newest first, older than the line with
    id ``before`` if given (the index on (saga_id, id) read backwards)."""
    older = "" if before is None else "AND id < :before "
    return query(
        "SELECT * FROM saga.saga_history WHERE saga_id = CAST(:saga_id AS uuid) "  # noqa: S608
        f"{older}ORDER BY id DESC LIMIT :limit",
        {"saga_id": saga_id, "before": before, "limit": limit},
    )


def note_tallies(query: Query, saga_id: str) -> list[dict[str, Any]]:
    """How many notes of each kind the saga was given, and how many were dropped."""
    return query(
        "SELECT event, noted, dropped, last_at FROM saga.saga_note_tally "
        "WHERE saga_id = CAST(:saga_id AS uuid) ORDER BY event",
        {"saga_id": saga_id},
    )


def held_of_saga(query: Query, saga_id: str, *, limit: int) -> list[dict[str, Any]]:
    """Up to ``limit`` of a saga's held messages: pending before resolved, attested
    before not (a flood of forged ones cannot hide a real one), newest first."""
    return query(
        "SELECT * FROM saga.held_message WHERE saga_id = CAST(:saga_id AS uuid) "
        "ORDER BY status = 'pending' DESC, attested DESC, id DESC LIMIT :limit",
        {"saga_id": saga_id, "limit": limit},
    )


def held_counts(query: Query, saga_id: str) -> dict[str, int]:
    """How many held messages a saga has: all of them, pending, and not attested."""
    (found,) = query(
        "SELECT count(*) AS total, count(*) FILTER (WHERE status = 'pending') AS pending, "
        "count(*) FILTER (WHERE NOT attested) AS not_attested "
        "FROM saga.held_message WHERE saga_id = CAST(:saga_id AS uuid)",
        {"saga_id": saga_id},
    )
    return {k: int(v) for k, v in found.items()}


def held_outcome(query: Query, held_id: int) -> dict[str, Any]:
    """A held message's status, saga and that saga's version (None without one)."""
    (found,) = query(
        "SELECT h.status, h.saga_id, s.version FROM saga.held_message h "
        "LEFT JOIN saga.saga_instance s ON s.saga_id = h.saga_id WHERE h.id = :held_id",
        {"held_id": held_id},
    )
    return found


def list_sagas(
    query: Query,
    *,
    status: str | None = None,
    saga_type: str | None = None,
    business_key: str | None = None,
    limit: int = 50,
) -> list[dict[str, Any]]:
    """Newest first."""
    where, params = _filters(saga_type, business_key)
    if status is not None:
        where.append("status = :status")
        params["status"] = status
    return query(
        f"SELECT {_SUMMARY} FROM saga.saga_instance WHERE {' AND '.join(where)} "  # noqa: S608
        "ORDER BY created_at DESC LIMIT :limit",
        {**params, "limit": limit},
    )


def quiet_sagas(
    query: Query,
    *,
    statuses: Sequence[str],
    before: datetime,
    saga_type: str | None,
    business_key: str | None,
    limit: int,
) -> list[dict[str, Any]]:
    """Sagas in ``statuses`` unchanged since ``before``, longest quiet first."""
    where, params = _filters(saga_type, business_key)
    where += ["status = ANY(CAST(:statuses AS text[]))", "updated_at < :before"]
    return query(
        f"SELECT {_SUMMARY}, next_wake_at FROM saga.saga_instance "  # noqa: S608
        f"WHERE {' AND '.join(where)} ORDER BY updated_at LIMIT :limit",
        {**params, "statuses": list(statuses), "before": before, "limit": limit},
    )


def _filters(saga_type: str | None, business_key: str | None) -> tuple[list[str], dict[str, Any]]:
    where, params = ["true"], {}
    if saga_type is not None:
        where.append("saga_type = :saga_type")
        params["saga_type"] = saga_type
    if business_key is not None:
        where.append("business_key = :business_key")
        params["business_key"] = business_key
    return where, params
