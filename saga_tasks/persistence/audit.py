"""Read-only questions an audit asks of a deployment's tables once its sagas have ended
(``saga_tasks.testing.invariants`` turns the answers into violations)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, text

from saga_tasks.core.states import ACTIVE_SAGA

SYSTEM_ACTOR = "system"


def _schema(name: str) -> str:
    if not name.isidentifier():
        raise ValueError(f"not a schema name: {name!r}")
    return name


def status_counts(conn: Connection) -> dict[str, int]:
    rows = conn.execute(text("SELECT status, count(*) FROM saga.saga_instance GROUP BY 1"))
    return {str(status): int(n) for status, n in rows}


def unfinished(conn: Connection) -> list[tuple[str, str]]:
    """(saga id, status) of every saga still running or compensating."""
    rows = conn.execute(
        text("SELECT saga_id::text, status FROM saga.saga_instance WHERE status = ANY(:s)"),
        {"s": [s.value for s in ACTIVE_SAGA]},
    )
    return [(r[0], r[1]) for r in rows]


def review_without_reason(conn: Connection) -> list[str]:
    rows = conn.execute(
        text(
            "SELECT saga_id::text FROM saga.saga_instance WHERE status = 'MANUAL_REVIEW' "
            "AND coalesce(status_reason, '') = ''"
        )
    )
    return [r[0] for r in rows]


def step_statuses(conn: Connection) -> list[tuple[str, str, str, str]]:
    """(saga id, saga status, step, step status) of every step."""
    rows = conn.execute(
        text(
            "SELECT st.saga_id::text, s.status, st.step, st.status FROM saga.saga_step st "
            "JOIN saga.saga_instance s USING (saga_id)"
        )
    )
    return [(r[0], r[1], r[2], r[3]) for r in rows]


def by_hand(conn: Connection) -> list[tuple[str, str, str, str, str | None]]:
    """(saga id, step, event, actor, step status before) of every step an operator marked
    done (``step_succeeded``) or undone (``step_compensated``), oldest first."""
    rows = conn.execute(
        text(
            "SELECT saga_id::text, step, event, actor, step_status_before FROM saga.saga_history "
            "WHERE actor <> :system AND event IN ('step_succeeded', 'step_compensated') "
            "ORDER BY id"
        ),
        {"system": SYSTEM_ACTOR},
    )
    return [(r[0], r[1], r[2], r[3], r[4]) for r in rows]


def history_bounds(conn: Connection) -> list[tuple[str, str, str | None, list[str]]]:
    """(saga id, status, first event, every distinct event) of every saga."""
    rows = conn.execute(
        text(
            """SELECT s.saga_id::text, s.status,
                      (SELECT event FROM saga.saga_history h WHERE h.saga_id = s.saga_id
                       ORDER BY id LIMIT 1),
                      (SELECT array_agg(DISTINCT event) FROM saga.saga_history h
                       WHERE h.saga_id = s.saga_id)
               FROM saga.saga_instance s"""
        )
    )
    return [(r[0], r[1], r[2], list(r[3] or [])) for r in rows]


def conflicting_replies(conn: Connection) -> list[tuple[str, str, str]]:
    rows = conn.execute(
        text(
            "SELECT saga_id::text, step, reason FROM saga.saga_history "
            "WHERE event = 'conflicting_reply'"
        )
    )
    return [(r[0], r[1], r[2]) for r in rows]


def unsigned_operator_entries(conn: Connection) -> list[tuple[str, str, str]]:
    rows = conn.execute(
        text(
            """SELECT saga_id::text, event, actor FROM saga.saga_history
               WHERE event LIKE 'operator%' AND (actor = :system OR coalesce(reason, '') = '')"""
        ),
        {"system": SYSTEM_ACTOR},
    )
    return [(r[0], r[1], r[2]) for r in rows]


def unpublished(conn: Connection, schema: str) -> int:
    sql = f"SELECT count(*) FROM {_schema(schema)}.outbox WHERE published_at IS NULL"  # noqa: S608
    return int(conn.execute(text(sql)).scalar_one())


def requested_without_outbox_row(conn: Connection) -> list[tuple[str, str, str, str]]:
    """(saga id, step, command or compensation, id) the state says was sent, with no row
    in the orchestrator's outbox, nor in flow control's (still waiting for capacity, or
    withdrawn before it was sent)."""
    rows = conn.execute(
        text(
            """SELECT st.saga_id::text, st.step, c.which, c.id::text FROM saga.saga_step st
               CROSS JOIN LATERAL (VALUES ('command', st.command_id),
                                          ('compensation', st.compensation_id)) AS c(which, id)
               WHERE c.id IS NOT NULL AND NOT EXISTS (
                   SELECT 1 FROM saga.outbox o WHERE o.headers->>'saga_command_id' = c.id::text)
               AND NOT EXISTS (
                   SELECT 1 FROM saga.saga_dispatch d
                   WHERE d.headers->>'saga_command_id' = c.id::text)"""
        )
    )
    return [(r[0], r[1], r[2], r[3]) for r in rows]


def on_record(conn: Connection) -> set[str]:
    """Ids of the messages held (dead-lettered, parked) or recorded as invalid."""
    rows = conn.execute(
        text(
            "SELECT message_id FROM saga.held_message WHERE message_id IS NOT NULL "
            "UNION SELECT message_id FROM saga.invalid_message WHERE message_id IS NOT NULL"
        )
    )
    return {str(r[0]) for r in rows}


def applied_replies(conn: Connection) -> set[str]:
    """Ids of the replies the orchestrator's inbox took."""
    rows = conn.execute(text("SELECT message_id FROM saga.inbox WHERE consumer = 'orchestrator'"))
    return {str(r[0]) for r in rows}


def published(conn: Connection, schema: str) -> list[tuple[str, str, str, str, str | None]]:
    """(saga id, message id, task, queue, command id) of every row published from
    ``schema``'s outbox (a participant's replies, or the orchestrator's commands)."""
    sql = f"""SELECT saga_id::text, message_id::text, task_name, queue,
                     headers->>'saga_command_id' FROM {_schema(schema)}.outbox
              WHERE published_at IS NOT NULL"""  # noqa: S608
    return [(r[0], r[1], r[2], r[3], r[4]) for r in conn.execute(text(sql))]


def claimed(conn: Connection, schema: str) -> set[str]:
    """Command ids in ``schema``'s command ledger (a participant's own database)."""
    sql = f"SELECT command_id::text FROM {_schema(schema)}.command_ledger"  # noqa: S608
    return {str(r[0]) for r in conn.execute(text(sql))}


def operator_entries(conn: Connection, saga_ids: Sequence[str]) -> dict[tuple[str, str, str], int]:
    """How many ``operator_*`` entries each (saga, event, actor) has."""
    rows = conn.execute(
        text(
            "SELECT saga_id::text, event, actor, count(*) FROM saga.saga_history "
            "WHERE event LIKE 'operator%' AND saga_id = ANY(CAST(:ids AS uuid[])) "
            "GROUP BY 1, 2, 3"
        ),
        {"ids": list(saga_ids)},
    )
    return {(r[0], r[1], r[2]): int(r[3]) for r in rows}


def step_evidence(conn: Connection, saga_id: str) -> tuple[Any, list[Any], list[Any]]:
    """A saga's head row, its steps and its history, as an incident review reads them."""
    head = conn.execute(
        text(
            "SELECT status, status_reason, version, business_key, next_wake_at "
            "FROM saga.saga_instance WHERE saga_id = CAST(:s AS uuid)"
        ),
        {"s": saga_id},
    ).first()
    steps = list(
        conn.execute(
            text(
                "SELECT step, status, attempt, compensation_attempt, generation, "
                "command_id, compensation_id FROM saga.saga_step "
                "WHERE saga_id = CAST(:s AS uuid) ORDER BY position"
            ),
            {"s": saga_id},
        )
    )
    history = list(
        conn.execute(
            text(
                "SELECT at, event, step, status_before, status_after, "
                "step_status_before, step_status_after, actor, reason "
                "FROM saga.saga_history WHERE saga_id = CAST(:s AS uuid) ORDER BY id"
            ),
            {"s": saga_id},
        )
    )
    return head, steps, history


def purged(conn: Connection) -> set[str]:
    """Ids of the sagas purged after their retention (``saga.purged_saga``)."""
    rows = conn.execute(text("SELECT saga_id::text FROM saga.purged_saga"))
    return {str(r) for r in rows.scalars()}
