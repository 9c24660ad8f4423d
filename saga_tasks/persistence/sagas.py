"""Reading and writing saga state, steps and history: the only SQL the orchestrator runs on them.

Every write is a compare-and-set on ``version`` under a row lock, so a transition is
applied once even when two deliveries of one message race.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, Column, Connection, Row, func, insert, select, text

from saga_tasks.core.decider import HistoryEntry
from saga_tasks.core.messages import OutboundMessage
from saga_tasks.core.model import SagaState, StepState
from saga_tasks.core.states import ACTIVE_SAGA
from saga_tasks.errors import ConcurrencyConflict
from saga_tasks.persistence import dispatch, outbox, readsql, recordset
from saga_tasks.persistence.db import query_on
from saga_tasks.persistence.prepared import Prepared
from saga_tasks.persistence.tables import (
    saga_history,
    saga_instance,
    saga_outbox,
    saga_step,
)

SYSTEM_ACTOR = "system"


def payload_hash(payload: Mapping[str, Any]) -> str:
    """A stable digest of a payload, to tell a repeated start from a conflicting one."""
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


_SAGA_INSERT_COLUMNS = (
    "saga_id",
    "saga_type",
    "definition_version",
    "business_key",
    "status",
    "status_reason",
    "version",
    "payload",
    "payload_hash",
    "correlation_id",
    "traceparent",
    "deadline",
    "next_wake_at",
    "created_at",
    "updated_at",
    "finished_at",
    "id_key",
)
STEP_COLUMNS = (
    "saga_id",
    "step",
    "position",
    "status",
    "attempt",
    "compensation_attempt",
    "generation",
    "command_id",
    "compensation_id",
    "requested_at",
    "deadline",
    "finished_at",
    "result",
    "last_error",
    "given_up",
)
HISTORY_COLUMNS = (
    "saga_id",
    "at",
    "event",
    "step",
    "status_before",
    "status_after",
    "step_status_before",
    "step_status_after",
    "message_id",
    "causation_id",
    "actor",
    "reason",
    "detail",
)


def _pg_type(column: Column[Any]) -> str:
    return str(column.type.compile(dialect=recordset.DIALECT))


def _insert_started_sql() -> Prepared:
    cols = ", ".join(_SAGA_INSERT_COLUMNS)
    values = ", ".join(f":{c}" for c in _SAGA_INSERT_COLUMNS)
    steps = recordset.insert_from(saga_step, STEP_COLUMNS, "steps", also_from="started")
    history = recordset.insert_from(saga_history, HISTORY_COLUMNS, "history", also_from="started")
    commands = outbox.insert_sql(saga_outbox, "outbox", also_from="started")
    held = dispatch.insert_sql("dispatch", also_from="started")
    sql = f"""WITH started AS (
              INSERT INTO saga.saga_instance ({cols}) VALUES ({values})
              ON CONFLICT (saga_type, business_key) DO NOTHING RETURNING 1 AS one),
            steps AS ({steps} RETURNING 1),
            history AS ({history} RETURNING 1),
            commands AS ({commands} RETURNING 1),
            held AS ({held} RETURNING 1)
            SELECT count(*) FROM started"""  # noqa: S608 - identifiers are ours; values bound
    types = {c: _pg_type(saga_instance.c[c]) for c in _SAGA_INSERT_COLUMNS}
    types.update(steps="jsonb", history="jsonb", outbox="jsonb", dispatch="jsonb")
    return Prepared("saga_insert_started", sql, types)


_INSERT_STARTED = _insert_started_sql()


def insert_new(
    conn: Connection,
    state: SagaState,
    digest: str,
    now: datetime,
    step_order: Sequence[str],
    *,
    history: Sequence[Mapping[str, Any]],
    messages: Sequence[OutboundMessage],
    held: Sequence[OutboundMessage] = (),
) -> bool:
    """Insert a saga with its steps, first history lines and first commands, unless its
    (type, business key) exists; True when inserted. One statement. ``held``: commands
    to queues under flow control, which wait for capacity (``dispatch.release``).

    A concurrent start with the same key blocks on the unique index until the first
    transaction ends, then conflicts: exactly one saga per key, whatever the timing.
    """
    params = {
        "saga_id": state.saga_id,
        "saga_type": state.saga_type,
        "definition_version": state.definition_version,
        "business_key": state.business_key,
        "status": state.status.value,
        "status_reason": state.reason,
        "version": state.version,
        "payload": recordset.encode(state.payload),
        "payload_hash": digest,
        "correlation_id": state.correlation_id or state.saga_id,
        "traceparent": state.traceparent,
        "deadline": state.deadline,
        "next_wake_at": state.next_wake_at(),
        "created_at": now,
        "updated_at": now,
        "finished_at": state.finished_at,
        "id_key": state.id_key,
        "steps": recordset.encode(
            [_step_row(state.saga_id, n, i, state.steps[n]) for i, n in enumerate(step_order)]
        ),
        "history": recordset.encode(history),
        "outbox": outbox.rows(messages),
        "dispatch": dispatch.rows(held),
    }
    return bool(_INSERT_STARTED.execute(conn, params).scalar_one())


def find_by_key(conn: Connection, saga_type: str, business_key: str) -> Any:
    """``(saga_id, status, payload_hash)`` of the saga with this key, or None."""
    stmt = select(
        saga_instance.c.saga_id, saga_instance.c.status, saga_instance.c.payload_hash
    ).where(saga_instance.c.saga_type == saga_type, saga_instance.c.business_key == business_key)
    return conn.execute(stmt).first()


def exists(conn: Connection, saga_id: str) -> bool:
    """Whether a committed saga row has this id."""
    stmt = select(saga_instance.c.saga_id).where(saga_instance.c.saga_id == saga_id)
    return conn.execute(stmt).first() is not None


_STEP_COLUMNS = (
    saga_step.c.step,
    saga_step.c.status.label("step_status"),
    saga_step.c.attempt,
    saga_step.c.compensation_attempt,
    saga_step.c.generation,
    saga_step.c.command_id,
    saga_step.c.compensation_id,
    saga_step.c.requested_at,
    saga_step.c.deadline.label("step_deadline"),
    saga_step.c.finished_at.label("step_finished_at"),
    saga_step.c.result,
    saga_step.c.last_error,
    saga_step.c.given_up,
)


def _step_select() -> tuple[str, list[Column[Any]]]:
    """The select list of a saga's step rows, and their typed result columns."""
    names, columns = [], []
    for col in _STEP_COLUMNS:
        source = col.element if hasattr(col, "element") else col
        names.append(f"st.{source.name} AS {col.name}")
        columns.append(Column(col.name, source.type))
    return ", ".join(names), columns


def _locking_statements() -> tuple[Prepared, Prepared, Prepared]:
    """Lock the saga row, then read its steps in a statement of their own.

    Under READ COMMITTED a locking read that had to wait re-reads only the row it
    locks; anything joined to it keeps the snapshot from before the wait. A reply
    that queued behind a sweep would see the sweep's version with the steps from
    before it, and write them back. The steps' own statement starts after the lock
    is held, so it sees whatever the holder committed (every step write also
    updates, so locks, the saga row).
    """
    sagas_cols = ", ".join(f"s.{c.name}" for c in saga_instance.columns)
    saga_columns = [Column(c.name, c.type) for c in saga_instance.columns]
    claim = Prepared(
        "saga_claim_and_lock",
        f"""WITH claimed AS (
            INSERT INTO saga.inbox (consumer, message_id, saga_id)
            VALUES (:consumer, :message_id, :saga_id)
            ON CONFLICT (consumer, message_id) DO NOTHING RETURNING message_id)
        SELECT (SELECT count(*) FROM claimed) AS new_message, {sagas_cols}
        FROM saga.saga_instance s WHERE s.saga_id = :saga_id
        FOR UPDATE""",  # noqa: S608 - identifiers are ours; values bound
        {"consumer": "text", "message_id": "text", "saga_id": "uuid"},
        [Column("new_message", BigInteger), *saga_columns],
    )
    lock = Prepared(
        "saga_lock",
        f"SELECT {sagas_cols} FROM saga.saga_instance s WHERE s.saga_id = :saga_id "  # noqa: S608
        "FOR UPDATE",
        {"saga_id": "uuid"},
        saga_columns,
    )
    picked, step_columns = _step_select()
    steps = Prepared(
        "saga_steps",
        f"SELECT {picked} FROM saga.saga_step st WHERE st.saga_id = :saga_id "  # noqa: S608
        "ORDER BY st.position",
        {"saga_id": "uuid"},
        step_columns,
    )
    return claim, lock, steps


_CLAIM_AND_LOCK, _LOCK, _STEPS = _locking_statements()
_INBOX_ROW_IS_MINE = text(
    "SELECT xmin = pg_current_xact_id()::xid FROM saga.inbox "
    "WHERE consumer = :c AND message_id = :m"
)


def lock(conn: Connection, saga_id: str) -> SagaState | None:
    """Load one saga with its steps and hold its row lock until the transaction ends."""
    head = _LOCK.execute(conn, {"saga_id": saga_id}).first()
    if head is None:
        return None
    return _to_state(_STEPS.execute(conn, {"saga_id": saga_id}).all(), head._mapping)


def claim_and_lock(
    conn: Connection, consumer: str, message_id: str, saga_id: str
) -> tuple[bool, SagaState | None]:
    """Record a message in the inbox and lock its saga (one statement), then read its
    steps (a second: see ``_locking_statements`` for why not the same one).

    Returns (new, state): ``new`` is False for a message consumed before (a duplicate),
    ``state`` None for an unknown saga. A concurrent delivery of the same message
    blocks on the inbox key until the first transaction ends, then sees the conflict.
    """
    params = {"consumer": consumer, "message_id": message_id, "saga_id": saga_id}
    head = _CLAIM_AND_LOCK.execute(conn, params).first()
    if head is None:
        # No such saga (rare): the inbox row is new if this transaction wrote it.
        mine = conn.execute(_INBOX_ROW_IS_MINE, {"c": consumer, "m": message_id}).scalar_one()
        return bool(mine), None
    if not head.new_message:
        return False, _to_state([], head._mapping)  # a duplicate: its steps are not needed
    steps = _STEPS.execute(conn, {"saga_id": saga_id}).all()
    return True, _to_state(steps, head._mapping)


def claim_due(conn: Connection, now: datetime, limit: int) -> list[SagaState]:
    """Lock up to ``limit`` active sagas whose next deadline has passed, earliest first.

    The partial index on ``next_wake_at`` (active sagas only) makes this cost grow with
    the number of due sagas, not with the table. SKIP LOCKED lets sweepers run side by
    side, and leaves alone a saga a reply is being applied to right now.
    """
    due = (
        select(saga_instance.c.saga_id)
        .where(
            saga_instance.c.status.in_([s.value for s in ACTIVE_SAGA]),
            saga_instance.c.next_wake_at <= now,
        )
        .order_by(saga_instance.c.next_wake_at)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
    ids = [row.saga_id for row in conn.execute(due)]
    if not ids:
        return []
    stmt = (
        select(saga_instance, *_STEP_COLUMNS)
        .select_from(
            saga_instance.outerjoin(saga_step, saga_step.c.saga_id == saga_instance.c.saga_id)
        )
        .where(saga_instance.c.saga_id.in_(ids))
        .order_by(saga_instance.c.saga_id, saga_step.c.position)
    )
    groups: dict[str, list[Row[Any]]] = {}
    for row in conn.execute(stmt):
        groups.setdefault(row.saga_id, []).append(row)
    return [_to_state(rows) for rows in groups.values()]


def get(conn: Connection, saga_id: str) -> SagaState:
    """``load``, or ``SagaNotFound`` naming what was asked (a bad id says so too)."""
    return readsql.get(query_on(conn), saga_id)


def load(conn: Connection, saga_id: str) -> SagaState | None:
    """Like ``lock`` without the lock: for reading tools."""
    return readsql.load(query_on(conn), saga_id)


def _to_state(rows: Sequence[Row[Any]], head: Mapping[Any, Any] | None = None) -> SagaState:
    """A saga from its step rows (joined with the saga's columns, or ``head`` given)."""
    return readsql.to_state([r._mapping for r in rows], head)


def _write_changes_sql() -> Prepared:
    cas = """UPDATE saga.saga_instance AS s
       SET status = v.status, status_reason = v.status_reason, version = v.version,
           definition_version = v.definition_version,
           deadline = v.deadline, next_wake_at = v.next_wake_at,
           updated_at = coalesce(v.updated_at, :now),
           finished_at = v.finished_at
       FROM jsonb_to_recordset(CAST(:sagas AS jsonb)) AS v(
           saga_id uuid, old_version bigint, status text, status_reason text,
           version bigint, definition_version integer, deadline timestamptz,
           next_wake_at timestamptz, finished_at timestamptz, updated_at timestamptz)
       WHERE s.saga_id = ANY(CAST(:saga_ids AS uuid[]))
         AND s.saga_id = v.saga_id AND s.version = v.old_version
       RETURNING 1"""
    # Nothing else is written unless every compare-and-set matched: the caller rolls
    # back on ConcurrencyConflict anyway, and the statement does not depend on it.
    saved_all = "(SELECT count(*) FROM saved) = :expected"
    steps = recordset.insert_from(saga_step, STEP_COLUMNS, "steps", where=saved_all)
    updated = ", ".join(f"{c} = excluded.{c}" for c in STEP_COLUMNS[3:])
    history = recordset.insert_from(saga_history, HISTORY_COLUMNS, "history", where=saved_all)
    commands = outbox.insert_sql(saga_outbox, "outbox", where=saved_all)
    held = dispatch.insert_sql("dispatch", where=saved_all)
    freed, withdrawn = dispatch.free_sql(where=saved_all)
    paused = dispatch.pause_sql(where=saved_all)
    sql = f"""WITH saved AS ({cas}),
            steps AS ({steps} ON CONFLICT ON CONSTRAINT pk_saga_step DO UPDATE SET {updated}
                      RETURNING 1),
            history AS ({history} RETURNING 1),
            commands AS ({commands} RETURNING 1),
            held AS ({held} RETURNING 1),
            freed AS ({freed} RETURNING 1),
            withdrawn AS ({withdrawn} RETURNING 1),
            paused AS ({paused} RETURNING 1)
            SELECT count(*) FROM saved"""  # noqa: S608 - identifiers are ours; values bound
    json_params = dict.fromkeys(
        ("sagas", "steps", "history", "outbox", "dispatch", "freed", "superseded"), "jsonb"
    )
    return Prepared(
        "saga_write_changes",
        sql,
        {
            "now": "timestamptz",
            "saga_ids": "uuid[]",
            "freed_sagas": "uuid[]",
            "expected": "bigint",
            **json_params,
        },
    )


_WRITE_CHANGES = _write_changes_sql()
_ACTIVE_VALUES = frozenset(s.value for s in ACTIVE_SAGA)


@dataclass
class Changes:
    """What one transaction writes for one decision or a batch of them (the sweeper)."""

    sagas: list[dict[str, Any]] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)
    history: list[dict[str, Any]] = field(default_factory=list)
    messages: list[OutboundMessage] = field(default_factory=list)
    held: list[OutboundMessage] = field(default_factory=list)
    """Commands to queues under flow control: they wait for capacity, not in the outbox."""
    freed: list[tuple[str, str]] = field(default_factory=list)
    """(saga id, step) that answered, or whose saga ended: their commands stop counting
    against their queue's limit, and those never sent are withdrawn."""
    superseded: list[tuple[str, str]] = field(default_factory=list)
    """(saga id, step) sent again: a copy still waiting is withdrawn; one sent keeps its
    room until the step answers."""

    def save(
        self,
        old: SagaState,
        new: SagaState,
        step_order: Sequence[str],
        *,
        touch: bool = True,
    ) -> None:
        """Write ``new`` over ``old``: a compare-and-set on ``old.version``. ``touch``
        False keeps ``updated_at`` (a repair is not progress: a stuck saga stays stuck)."""
        self.sagas.append(
            {
                "saga_id": old.saga_id,
                "old_version": old.version,
                "status": new.status.value,
                "status_reason": new.reason,
                "version": new.version,
                "definition_version": new.definition_version,  # moved only by a migration
                "deadline": new.deadline,
                "next_wake_at": new.next_wake_at(),
                "finished_at": new.finished_at,
                "updated_at": None if touch else old.extra.get("updated_at"),
            }
        )
        self.steps += _changed_steps(old, new, step_order)

    def log(
        self,
        saga_id: str,
        entries: Iterable[HistoryEntry],
        now: datetime,
        *,
        causation_id: str | None = None,
        actor: str = SYSTEM_ACTOR,
    ) -> None:
        self.history += history_rows(saga_id, entries, now, causation_id=causation_id, actor=actor)


def write_changes(conn: Connection, changes: Changes, now: datetime) -> None:
    """Every saga, step, history line and outbox row of ``changes`` in one statement.

    Each saga is a compare-and-set on the version it was read at; if any moved
    meanwhile, ``ConcurrencyConflict`` (the caller's transaction rolls back, and the
    message is retried or the sweep batch swept again).
    """
    if not (changes.sagas or changes.history or changes.messages or changes.held):
        return
    saved = _WRITE_CHANGES.execute(
        conn,
        {
            "now": now,
            # The ids again as an array: the primary key finds the rows, where a join
            # with the recordset alone is planned as a scan of the whole table.
            "saga_ids": [c["saga_id"] for c in changes.sagas],
            "expected": len(changes.sagas),
            "sagas": recordset.encode(changes.sagas),
            "steps": recordset.encode(changes.steps),
            "history": recordset.encode(changes.history),
            "outbox": outbox.rows(changes.messages),
            **dispatch.params(
                changes.held,
                changes.freed,
                changes.superseded,
                paused=[c["saga_id"] for c in changes.sagas if c["status"] not in _ACTIVE_VALUES],
            ),
        },
    ).scalar_one()
    if saved != len(changes.sagas):
        raise ConcurrencyConflict(
            f"{len(changes.sagas) - saved} of {len(changes.sagas)} sagas moved since they "
            "were read; the transaction is rolled back and its work retried"
        )


def _changed_steps(
    old: SagaState, new: SagaState, step_order: Sequence[str]
) -> list[dict[str, Any]]:
    return [
        _step_row(new.saga_id, name, i, new.steps[name])
        for i, name in enumerate(step_order)
        if old.steps.get(name) != new.steps[name]
    ]


def _step_row(saga_id: str, name: str, position: int, st: StepState) -> dict[str, Any]:
    return {
        "saga_id": saga_id,
        "step": name,
        "position": position,
        "status": st.status.value,
        "attempt": st.attempt,
        "compensation_attempt": st.compensation_attempt,
        "generation": st.generation,
        "command_id": st.command_id,
        "compensation_id": st.compensation_id,
        "requested_at": st.requested_at,
        "deadline": st.deadline,
        "finished_at": st.finished_at,
        "result": dict(st.result) if st.result is not None else None,
        "last_error": st.error,
        "given_up": st.given_up,
    }


def history_rows(
    saga_id: str,
    entries: Iterable[HistoryEntry],
    now: datetime,
    *,
    causation_id: str | None = None,
    actor: str = SYSTEM_ACTOR,
) -> list[dict[str, Any]]:
    """History entries as rows, for one insert of many sagas' entries."""
    return [
        {
            "saga_id": saga_id,
            "at": now,
            "event": e.event,
            "step": e.step,
            "status_before": e.saga_status_before.value if e.saga_status_before else None,
            "status_after": e.saga_status_after.value,
            "step_status_before": e.step_status_before.value if e.step_status_before else None,
            "step_status_after": e.step_status_after.value if e.step_status_after else None,
            "message_id": e.message_id,
            "causation_id": causation_id,
            "actor": actor,
            "reason": e.reason,
            "detail": dict(e.detail),
        }
        for e in entries
    ]


def append_note(
    conn: Connection,
    state: SagaState,
    *,
    event: str,
    reason: str,
    message_id: str | None,
    now: datetime,
) -> None:
    """A history line that changes nothing, for a saga already loaded."""
    _note(
        conn,
        state.saga_id,
        state.status.value,
        event=event,
        reason=reason,
        message_id=message_id,
        now=now,
    )


NOTES = ("held_not_attested", "message_parked", "dead_letter_not_fed")
"""The notes a held message leaves on its saga (``append_note_if_exists``)."""
NOTES_KEPT = 5
"""How many notes of each kind in ``NOTES`` a saga's history keeps, the newest: a held
message may come from anyone who can publish (a forged dead letter, a parked message),
and 2,000 of them would otherwise be 2,000 history lines. ``saga_note_tally`` counts
them all and those dropped."""

_TALLY = text(
    """INSERT INTO saga.saga_note_tally AS t (saga_id, event, noted, dropped, last_at)
    VALUES (:s, :e, 1, 0, :now)
    ON CONFLICT (saga_id, event) DO UPDATE SET noted = t.noted + 1, last_at = excluded.last_at
    RETURNING t.noted - t.dropped"""
)
_DROP_OLDEST = text(
    """WITH gone AS (
        DELETE FROM saga.saga_history WHERE id = ANY(ARRAY(
            SELECT id FROM saga.saga_history WHERE saga_id = :s AND event = :e
            ORDER BY id DESC OFFSET :keep))
        RETURNING 1)
    UPDATE saga.saga_note_tally SET dropped = dropped + (SELECT count(*) FROM gone)
    WHERE saga_id = :s AND event = :e"""
)


def append_note_if_exists(
    conn: Connection,
    saga_id: str,
    *,
    event: str,
    reason: str,
    message_id: str | None,
    now: datetime,
) -> bool:
    """A held message's note (one of ``NOTES``) on a saga that may not exist; True if
    written. The saga's row is locked (as a decision locks it, so a later lock in this
    transaction is no upgrade to deadlock on), and a purge is waited for: a note never
    outlives the saga it names. The saga keeps the newest
    ``NOTES_KEPT`` of its kind: the oldest beyond go, counted (the tally's row lock orders
    two notes at once)."""
    status = conn.execute(
        select(saga_instance.c.status).where(saga_instance.c.saga_id == saga_id).with_for_update()
    ).scalar_one_or_none()
    if status is None:
        return False
    _note(conn, saga_id, status, event=event, reason=reason, message_id=message_id, now=now)
    kept = conn.execute(_TALLY, {"s": saga_id, "e": event, "now": now}).scalar_one()
    if kept > NOTES_KEPT:
        conn.execute(_DROP_OLDEST, {"s": saga_id, "e": event, "keep": NOTES_KEPT})
    return True


def _note(
    conn: Connection,
    saga_id: str,
    status: str,
    *,
    event: str,
    reason: str,
    message_id: str | None,
    now: datetime,
) -> None:
    conn.execute(
        insert(saga_history).values(
            saga_id=saga_id,
            at=now,
            event=event,
            status_before=status,
            status_after=status,
            message_id=message_id,
            actor=SYSTEM_ACTOR,
            reason=reason,
            detail={},
        )
    )


def has_event(conn: Connection, saga_id: str, event: str) -> bool:
    stmt = select(saga_history.c.id).where(
        saga_history.c.saga_id == saga_id, saga_history.c.event == event
    )
    return conn.execute(stmt.limit(1)).first() is not None


def payloads(conn: Connection, saga_ids: Sequence[str]) -> list[tuple[str, Mapping[str, Any]]]:
    stmt = select(saga_instance.c.saga_id, saga_instance.c.payload).where(
        saga_instance.c.saga_id.in_(saga_ids)
    )
    return [(str(r.saga_id), r.payload) for r in conn.execute(stmt)]


def active_counts(conn: Connection) -> dict[str, int]:
    """Active sagas (running or compensating) per type: admission control's measure."""
    stmt = (
        select(saga_instance.c.saga_type, func.count())
        .where(saga_instance.c.status.in_([s.value for s in ACTIVE_SAGA]))
        .group_by(saga_instance.c.saga_type)
    )
    return {row[0]: int(row[1]) for row in conn.execute(stmt)}
