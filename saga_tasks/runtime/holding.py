"""Messages that left the normal path: dead letters and parked messages, and what operators do.

The broker's ``saga.dead_letter`` and ``saga.parking_lot`` queues are transit, not
storage: a beat task (the intake) moves each message into ``saga.held_message`` with
what is known of its failure (reason, x-death count, first and last death, original
queue and routing key, message id), and feeds a dead letter to its saga as an event,
in the same transaction; the message is acked after that commits. A held message is
never the end of the story: the saga's history and ``show`` name it.

Operators list, show, replay and discard held messages. A replay first runs the checks
an incident review asks for (the saga's state, the message's kind and age, its failure
reason and death count, whether it is a duplicate or late, whether its effect already
happened) and refuses when one fails, unless forced with a reason of its own. A replay
publishes the stored message again under its own message id, so consumers deduplicate:
replaying twice has one effect.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, insert, select, update
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects.postgresql import insert as pg_insert

from saga_tasks.core.decider import replay_awaits
from saga_tasks.core.events import DeadLettered
from saga_tasks.core.messages import (
    H_COMMAND_ID,
    H_KIND,
    H_REPLY_TO_KIND,
    H_SAGA_ID,
    H_STEP,
    OutboundMessage,
)
from saga_tasks.core.states import TERMINAL_SAGA, MessageKind
from saga_tasks.errors import ActionRefused, ConcurrencyConflict, InputError, ServiceUnavailable
from saga_tasks.messaging.taker import RawMessage
from saga_tasks.messaging.topology import (
    DEAD_LETTER_QUEUE,
    PARKING_EXCHANGE,
    PARKING_QUEUE,
    QUORUM_DELIVERY_LIMIT,
)
from saga_tasks.observability import metrics
from saga_tasks.persistence import sagas, storable
from saga_tasks.persistence.db import translated
from saga_tasks.persistence.tables import ORCHESTRATOR, held_message, inbox, saga_outbox

if TYPE_CHECKING:
    from saga_tasks.app import SagaApp

log = logging.getLogger("saga_tasks.runtime.holding")

DEAD_LETTER = "dead_letter"
PARKING = "parking"
HOLDINGS = {DEAD_LETTER: DEAD_LETTER_QUEUE, PARKING: PARKING_QUEUE}

H_DEAD_REASON = "saga_dead_reason"
H_DEAD_DEATHS = "saga_dead_deaths"
"""On a poison message we dead-letter ourselves: how many times its worker died on it."""
H_DEAD_FROM = "saga_dead_from"
H_PARKED_REASON = "saga_parked_reason"
H_PARKED_FROM = "saga_parked_from"
H_HELD_AT = "saga_held_at"
H_REPLAYED_FROM = "saga_replayed_from"
H_OUTAGE = "saga_outage"
"""Times a message was sent back for an outage of our database (``tasks.failures``):
picks its delay tier; never a retry, and dropped from any other copy of the message."""
H_STORED_ESCAPED = "saga_stored_escaped"
"""In a held message's stored headers: what was escaped (or reduced) to store it."""
_TRANSIENT = (
    H_DEAD_REASON,
    H_DEAD_DEATHS,
    H_DEAD_FROM,
    H_PARKED_REASON,
    H_PARKED_FROM,
    H_HELD_AT,
    H_OUTAGE,
    H_STORED_ESCAPED,
)


def clean_headers(headers: Mapping[str, Any] | None) -> dict[str, Any]:
    """The message's own headers: without the broker's x-death and our holding marks."""
    return {
        k: v
        for k, v in (headers or {}).items()
        if not k.startswith("x-") and k not in _TRANSIENT and k != H_REPLAYED_FROM
    }


# -- into holding ---------------------------------------------------------------------------


def hold(
    app: SagaApp,
    message: OutboundMessage,
    *,
    holding: str,
    reason: str,
    from_queue: str,
    worker_deaths: int | None = None,
) -> None:
    """Send a task message to the dead-letter or parking queue with the reason attached.

    ``worker_deaths``: the message is poison, its worker died on it that many times
    (its reason then starts with ``poison:``, which is what blocks a replay).
    """
    marks: dict[str, Any] = {H_HELD_AT: datetime.now(UTC).isoformat()}
    if holding == DEAD_LETTER:
        marks |= {H_DEAD_REASON: reason[:500], H_DEAD_FROM: from_queue}
        if worker_deaths is not None:
            marks[H_DEAD_DEATHS] = worker_deaths
        queue = DEAD_LETTER_QUEUE
    else:
        marks |= {H_PARKED_REASON: reason[:500], H_PARKED_FROM: from_queue}
        queue = PARKING_QUEUE
    held = OutboundMessage(
        message_id=message.message_id,
        task_name=message.task_name,
        queue=queue,
        headers={**clean_headers(message.headers), **marks},
        body=message.body,
        saga_id=message.saga_id,
        # The dead-letter exchange takes any key (it keeps the origin visible); parking one.
        routing_key=from_queue if holding == DEAD_LETTER else PARKING_QUEUE,
    )
    result = app.publisher.publish([held])
    if result.error is not None:
        raise result.error


def park_raw(
    app: SagaApp,
    *,
    body: bytes,
    headers: Mapping[str, Any],
    content_type: str | None,
    content_encoding: str | None,
    reason: str,
    from_queue: str,
) -> None:
    """Park bytes that could not even be read as a task message."""
    marks = {
        H_PARKED_REASON: reason[:500],
        H_PARKED_FROM: from_queue,
        H_HELD_AT: datetime.now(UTC).isoformat(),
    }
    app.publisher.publish_raw(
        exchange=PARKING_EXCHANGE.name,
        routing_key=PARKING_QUEUE,
        body=body,
        headers={**clean_headers(dict(headers)), **marks},
        content_type=content_type,
        content_encoding=content_encoding,
    )


# -- intake ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class IntakeReport:
    holding: str
    taken: int
    recorded: int
    fed_to_sagas: int


INTAKE = "intake"
"""The ``consumer`` label of the intake's metrics."""


def intake(app: SagaApp, holding: str, *, limit: int = 500) -> IntakeReport:
    """Move up to ``limit`` messages from a holding queue into the database.

    Every message leaves the queue once it is stored: as it arrived; escaped, when a
    value in it cannot be stored as it is (the reason says so); without being fed to
    its saga, when its saga cannot take it (the reason and the saga's history say
    why); or, if even that fails, reduced to what can be stored. A message is left
    in the queue only while the database is away (``ServiceUnavailable``, which ends
    the pass) or, after all of the above failed, with an error logged; in both cases
    the messages behind it are still taken.
    """
    from saga_tasks.messaging.taker import take

    queue = HOLDINGS[holding]
    counts = {"recorded": 0, "fed": 0}

    def handle(message: RawMessage) -> bool:
        try:
            was_new, was_fed = _take(app, holding, message)
        except (ServiceUnavailable, ConcurrencyConflict):
            raise  # the database is away or busy: the message waits for the next pass
        except Exception:
            # Every storable form was refused: a bug. Leave the message (unacked, so it
            # returns to the queue) and take the ones behind it.
            metrics.MESSAGES.labels(consumer=INTAKE, classification="held_left").inc()
            log.exception(
                "a held message could not be stored in any form; left in %s",
                queue,
                extra=_log_fields(message.headers),
            )
            return False
        counts["recorded"] += was_new
        counts["fed"] += was_fed
        return True

    taken = take(app.settings.broker_url, queue, handle, limit=limit)
    if taken:
        log.info("intake moved %d messages from %s (%d new)", taken, queue, counts["recorded"])
    return IntakeReport(holding, taken, counts["recorded"], counts["fed"])


def _take(app: SagaApp, holding: str, message: RawMessage) -> tuple[bool, bool]:
    """Store one held message (and feed a dead letter to its saga): (new, fed)."""
    raw_headers = storable.plain(dict(message.headers))
    headers = storable.storable(raw_headers)
    escaped = storable.escaped_keys(raw_headers, headers)
    content_type = storable.optional_text(message.content_type)
    content_encoding = storable.optional_text(message.content_encoding)
    if content_type != message.content_type:
        escaped.append("content_type")
    if content_encoding != message.content_encoding:
        escaped.append("content_encoding")
    facts = _facts(holding, headers)
    if escaped:
        # What a replay would send is no longer what arrived: replay_checks blocks it.
        headers[H_STORED_ESCAPED] = ", ".join(escaped)[:500]
        facts["reason"] = (
            f"{facts['reason']}; stored escaped: NUL or invalid characters in {', '.join(escaped)}"
        )[:1000]
    body = message.body
    key = hashlib.sha256(
        json.dumps(
            [facts["message_id"], headers.get("x-death"), headers.get(H_HELD_AT)], default=str
        ).encode()
        + hashlib.sha256(body).digest()
    ).hexdigest()
    try:
        text_body, is_b64 = body.decode("utf-8"), False
        if "\x00" in text_body:  # PostgreSQL text cannot hold NUL: keep such bodies as base64
            raise UnicodeDecodeError("utf-8", body, 0, 1, "NUL byte")
    except UnicodeDecodeError:
        text_body, is_b64 = base64.b64encode(body).decode(), True
    values = {
        "holding": holding,
        "delivery_key": key,
        "message_id": facts["message_id"],
        "step": facts["step"],
        "kind": facts["kind"],
        "task_name": storable.optional_text(headers.get("task")),
        "original_queue": facts["queue"],
        "original_routing_key": facts["routing_key"],
        "original_exchange": facts["exchange"],
        "reason": facts["reason"],
        "death_count": facts["death_count"],
        "first_death_at": facts["first_death_at"],
        "last_death_at": facts["last_death_at"],
        "content_type": content_type,
        "content_encoding": content_encoding,
        "headers": headers,
        "body": text_body,
        "body_base64": is_b64,
    }
    if escaped:
        metrics.MESSAGES.labels(consumer=INTAKE, classification="held_escaped").inc()
        log.warning(
            "held message stored escaped: %s", ", ".join(escaped), extra=_log_fields(headers)
        )
    try:
        return _store(app, holding, values, facts)
    except (ServiceUnavailable, ConcurrencyConflict):
        raise
    except Exception as exc:
        # Not storable even escaped (a number out of range, a bug): keep what surely is.
        why = f"{type(exc).__name__}: {_first_line(exc)}"
        metrics.MESSAGES.labels(consumer=INTAKE, classification="held_reduced").inc()
        log.error("held message stored reduced: %s", why, exc_info=True, extra=_log_fields(headers))
        reduced = {
            "holding": holding,
            "delivery_key": key,
            "reason": f"{facts['reason']}; stored reduced: {why}"[:1000],
            "headers": {H_STORED_ESCAPED: f"reduced: {why}"[:500]},
            "body": base64.b64encode(body).decode(),
            "body_base64": True,
        }
        return _store(app, holding, reduced, None)


def _store(
    app: SagaApp, holding: str, values: dict[str, Any], facts: Mapping[str, Any] | None
) -> tuple[bool, bool]:
    """Insert the row; feed a dead letter to its saga, or note a parked one on it."""
    saga_id = facts["saga_id"] if facts is not None else None
    messages: list[OutboundMessage] = []
    fed = False
    with translated(app.settings.database_url), app.engine.begin() as conn:
        if saga_id is not None and sagas.load(conn, saga_id) is None:
            saga_id = None
        row = conn.execute(
            pg_insert(held_message)
            .values(**values, saga_id=saga_id)
            .on_conflict_do_nothing(constraint="uq_held_delivery")
            .returning(held_message.c.id)
        ).first()
        if row is None:
            return False, False  # taken before, and acked too late: nothing more to do
        if facts is None or saga_id is None:
            pass
        elif holding == DEAD_LETTER and facts["kind"] is not None:
            messages, fed = _feed(app, conn, saga_id, row.id, facts)
        else:
            sagas.append_note_if_exists(
                conn,
                saga_id,
                event="message_parked",
                reason=f"held message {row.id} parked: {facts['reason']}",
                message_id=facts["message_id"],
                now=app.clock.now(),
            )
    if messages:
        from saga_tasks.runtime.outlet import deliver

        deliver(app.engine, saga_outbox, app.publisher, messages)
    return True, fed


def _feed(
    app: SagaApp, conn: Connection, saga_id: str, held_id: int, facts: Mapping[str, Any]
) -> tuple[list[OutboundMessage], bool]:
    """Tell the saga about its dead letter, in a savepoint: if the saga cannot take it
    (its definition version is not loaded, its decision fails), the held message stays
    recorded with why, and the saga's history says so; the intake goes on."""
    event = DeadLettered(
        kind=MessageKind(facts["kind"]),
        step=facts["step"],
        command_id=facts["command_id"],
        message_id=facts["message_id"] or f"held-{held_id}",
        reason=facts["reason"],
        held_id=held_id,
    )
    try:
        with conn.begin_nested():
            return app.orchestrator.dead_lettered(conn, saga_id, event), True
    except (
        sa_exc.OperationalError,
        sa_exc.InterfaceError,
        ServiceUnavailable,
        ConcurrencyConflict,
    ):
        raise  # the database, not the saga: the whole message waits for the next pass
    except Exception as error:
        why = f"{type(error).__name__}: {_first_line(error)}"
        fields = {"saga_id": saga_id, "message_id": facts["message_id"], "held_id": held_id}
        metrics.MESSAGES.labels(consumer=INTAKE, classification="held_not_fed").inc()
        log.error("a dead letter could not be fed to its saga: %s", why, exc_info=True,
                  extra=fields)  # fmt: skip
        conn.execute(
            update(held_message)
            .where(held_message.c.id == held_id)
            .values(reason=f"{facts['reason']}; not fed to its saga: {why}"[:1000])
        )
        sagas.append_note_if_exists(
            conn,
            saga_id,
            event="dead_letter_not_fed",
            reason=f"held message {held_id} could not be fed to the saga: {why}"[:1000],
            message_id=facts["message_id"],
            now=app.clock.now(),
        )
        return [], False


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return storable.text(lines[0] if lines else "")[:300]


def _log_fields(headers: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "saga_id": storable.optional_text(headers.get(H_SAGA_ID)),
        "message_id": storable.optional_text(headers.get("id")),
    }


def _facts(holding: str, headers: Mapping[str, Any]) -> dict[str, Any]:
    """What the headers (already storable) tell of a held message; never raises."""
    deaths = [d for d in _as_list(headers.get("x-death")) if isinstance(d, Mapping)]
    latest: Mapping[str, Any] = deaths[0] if deaths else {}
    times = [t for t in (_when(d.get("time")) for d in deaths) if t is not None]
    kind = headers.get(H_KIND)
    if kind not in {k.value for k in MessageKind}:
        kind = None
    saga_id = headers.get(H_SAGA_ID)
    try:
        saga_id = str(uuid.UUID(str(saga_id))) if saga_id else None
    except ValueError:
        saga_id = None
    # Deaths on work queues: a retry tier's expiry (back to work) is no death.
    work_deaths = sum(_count(d.get("count")) for d in deaths if d.get("reason") != "expired")
    if holding == PARKING:
        reason = str(headers.get(H_PARKED_REASON) or "parked")
        queue = headers.get(H_PARKED_FROM)
        death_count = 0
    else:
        reason, death_count = _dead_reason(headers, latest, work_deaths)
        queue = headers.get(H_DEAD_FROM) or latest.get("queue")
    routing_keys = _as_list(latest.get("routing-keys"))
    queue = storable.optional_text(queue)
    return {
        "message_id": storable.optional_text(headers.get("id")),
        "saga_id": saga_id,
        "step": storable.optional_text(headers.get(H_STEP)),
        "kind": kind,
        # A reply's command id names the command it answers; it is not the dead message's.
        "command_id": storable.optional_text(headers.get(H_COMMAND_ID))
        if kind != MessageKind.REPLY.value
        else None,
        "reply_to_kind": headers.get(H_REPLY_TO_KIND),
        "reason": reason[:500],
        "queue": queue,
        "routing_key": storable.optional_text(routing_keys[0]) if routing_keys else queue,
        "exchange": storable.optional_text(latest.get("exchange")),
        "death_count": death_count,
        "first_death_at": min(times) if times else None,
        "last_death_at": max(times) if times else None,
    }


_INT_MAX = 2**31 - 1
POISON = "poison: "
"""How a held message's reason starts when its worker died on it: only that blocks a replay."""


def _dead_reason(
    headers: Mapping[str, Any], latest: Mapping[str, Any], work_deaths: int
) -> tuple[str, int]:
    """Why a dead letter died, saying whether it is poison, and how many times it died.

    Poison is a message its worker died on (SIGKILL, OOM, a segfault), whoever
    noticed: our redelivery counter (``poison: redelivered ...``), Celery re-sending
    a task whose pool child was lost until ``max_retries`` and then rejecting it, or a
    quorum queue's ``x-delivery-limit``. Spent retries (``retries exhausted (n) after
    ...``) and other rejections are not poison: the message did not hurt its worker.
    """
    if headers.get(H_DEAD_REASON):
        reason = str(headers[H_DEAD_REASON])
        if reason.startswith(POISON):
            return reason, _count(headers.get(H_DEAD_DEATHS)) or max(work_deaths, 1)
        return reason, max(work_deaths, 1)
    died = str(latest.get("reason") or headers.get("x-first-death-reason") or "unknown")
    if died == "delivery_limit":
        # The dead-lettered copy's x-delivery-count starts again at 0: the count is ours.
        deliveries = QUORUM_DELIVERY_LIMIT + 1
        return (
            f"{POISON}{died} by the broker: delivered {deliveries} times, never acked "
            "(its worker died or lost its connection each time)",
            deliveries,
        )
    resent = _count(headers.get("retries"))
    if resent:
        # Celery re-sends a task whose pool child was lost, then lets it die here.
        return (
            f"{POISON}{died} by the broker after {resent} re-sends for lost worker processes",
            min(resent + 1, _INT_MAX),
        )
    return f"{died} by the broker", max(work_deaths, 1)


def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else []


def _count(value: Any) -> int:
    """A count from a header: a whole number from 0 up; anything else is 0."""
    try:
        return min(max(int(value or 0), 0), _INT_MAX)
    except (TypeError, ValueError, OverflowError):
        return 0


def _when(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        found = value
    else:
        try:
            found = datetime.fromisoformat(str(value))
        except ValueError:
            return None
    return found if found.tzinfo else found.replace(tzinfo=UTC)


# -- operators ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Check:
    """One replay pre-check: what was looked at, what was found, whether it blocks."""

    name: str
    finding: str
    blocks: bool


def held(conn: Connection, held_id: int, *, lock: bool = False) -> dict[str, Any]:
    stmt = select(held_message).where(held_message.c.id == held_id)
    row = conn.execute(stmt.with_for_update() if lock else stmt).first()
    if row is None:
        raise InputError(f"no held message {held_id}")
    return dict(row._mapping)


def replay_checks(app: SagaApp, conn: Connection, row: Mapping[str, Any]) -> list[Check]:
    """The checks a replay must pass; see the module docstring."""
    checks: list[Check] = []
    settings = app.settings
    if row["status"] != "pending":
        checks.append(
            Check(
                "status",
                f"already {row['status']} by {row['resolved_by']} at {row['resolved_at']}",
                True,
            )
        )
    checks.append(Check("failure", f"held because: {row['reason']}", False))
    stored_as = (row["headers"] or {}).get(H_STORED_ESCAPED)
    if stored_as:
        checks.append(
            Check(
                "stored",
                f"stored escaped ({stored_as}): a replay would send that, not what arrived",
                True,
            )
        )
    if not row["original_queue"]:
        checks.append(Check("destination", "its original queue is unknown", True))
    if row["holding"] == PARKING:
        checks.append(
            Check("parked", "a parked message made no sense once; fix the cause, then force", True)
        )
    age = (app.clock.now() - row["received_at"]).total_seconds()
    checks.append(Check("age", f"held for {age / 3600:.1f} h", age > settings.replay_max_age))
    checks.append(_deaths(row))
    saga_id = row["saga_id"]
    if saga_id is None:
        checks.append(Check("saga", "belongs to no known saga", row["holding"] == DEAD_LETTER))
        return checks
    state = sagas.load(conn, str(saga_id))
    if state is None:
        checks.append(Check("saga", f"saga {saga_id} no longer exists", True))
        return checks
    if state.status in TERMINAL_SAGA:
        checks.append(Check("saga", f"the saga is {state.status.value}", True))
    else:
        checks.append(
            Check("saga", f"the saga is {state.status.value}, version {state.version}", False)
        )
    kind, step = row["kind"], row["step"]
    st = state.steps.get(step) if step else None
    command_id = (row["headers"] or {}).get(H_COMMAND_ID)
    if kind == MessageKind.REPLY.value:
        seen = conn.execute(
            select(inbox.c.message_id).where(
                inbox.c.consumer == ORCHESTRATOR, inbox.c.message_id == row["message_id"]
            )
        ).first()
        checks.append(
            Check("duplicate", "the orchestrator already applied this reply", True)
            if seen
            else Check("duplicate", "the orchestrator has not applied this reply", False)
        )
    elif kind in (MessageKind.COMMAND.value, MessageKind.COMPENSATION.value) and st is not None:
        awaited = replay_awaits(state, step, MessageKind(kind), command_id)
        checks.append(
            Check("late", f"step {step!r} awaits it: {awaited} ({st.status.value})", False)
            if awaited
            else Check("late", f"step {step!r} has moved on ({st.status.value})", True)
        )
        done = _effect(app, conn, row["task_name"], command_id)
        checks.append(
            Check("effect", f"the participant already executed it ({done})", True)
            if done
            else Check("effect", "the participant has no record of it", False)
        )
    return checks


def _deaths(row: Mapping[str, Any]) -> Check:
    """Poison blocks a replay (it may kill a worker again); spent retries do not."""
    reason, deaths = str(row["reason"]), row["death_count"]
    if reason.startswith(POISON):
        return Check(
            "deaths",
            f"poison: its worker died on it {deaths} times; a replay may kill a worker again",
            True,
        )
    if row["holding"] == PARKING:
        return Check("deaths", "not poison: parked, it was never tried", False)
    retries = _count((row["headers"] or {}).get("saga_retry"))
    if reason.startswith("retries exhausted"):
        return Check(
            "deaths",
            f"not poison: its {retries} retries were spent ({reason}); a replay is one more try",
            False,
        )
    return Check("deaths", f"not poison: dead-lettered {deaths} times ({reason})", False)


def _effect(
    app: SagaApp, conn: Connection, task_name: str | None, command_id: str | None
) -> str | None:
    if not task_name or not command_id:
        return None
    participant = app.participants.get(task_name.split(".", 1)[0])
    if participant is None:
        return None
    ledger = participant.ledger
    row = conn.execute(
        select(ledger.c.kind, ledger.c.outcome).where(ledger.c.command_id == command_id)
    ).first()
    return f"{row.kind}, {row.outcome}" if row else None


@dataclass(frozen=True)
class ReplayResult:
    held_id: int
    replayed: bool
    forced: bool
    checks: Sequence[Check]


def replay(
    app: SagaApp,
    held_id: int,
    *,
    actor: str,
    reason: str,
    force: bool = False,
    force_reason: str | None = None,
    expect_version: int | None = None,
) -> ReplayResult:
    """Publish a held message again to its original queue, if the checks allow it.

    The replay is an operator action on the message's saga too: it is written to its
    history, a saga in MANUAL_REVIEW resumes, and ``expect_version``, when given, must
    be the saga's version.
    """
    _need(actor, reason)
    if force and not (force_reason or "").strip():
        raise InputError("a forced replay needs a reason of its own (--force-reason)")
    with translated(app.settings.database_url), app.engine.begin() as conn:
        row = held(conn, held_id, lock=True)
        checks = replay_checks(app, conn, row)
        blocking = [c for c in checks if c.blocks]
        refused = "; ".join(c.finding for c in blocking) if blocking and not force else None
        messages: list[OutboundMessage] = []
        if refused is None:
            said = reason if not force else f"{reason}; forced: {force_reason}"
            if row["saga_id"] is not None and sagas.load(conn, str(row["saga_id"])) is not None:
                from saga_tasks.core.events import OperatorAction, OperatorVerb

                action = OperatorAction(
                    OperatorVerb.REPLAY,
                    actor,
                    f"held message {held_id}: {said}",
                    step=row["step"],
                    message_kind=_kind(row["kind"]),
                    command_id=(row["headers"] or {}).get(H_COMMAND_ID),
                )
                messages, _ = app.orchestrator.act_in(
                    conn, str(row["saga_id"]), action, expect_version=expect_version
                )
            _publish_held(app, conn, row, actor=actor, said=said)
    if refused is not None:
        with translated(app.settings.database_url), app.engine.begin() as conn:
            _note(
                app,
                conn,
                row,
                "replay_refused",
                actor=actor,
                reason=f"{reason}; refused: {refused}",
            )
        raise ActionRefused(f"replay refused: {refused}")
    if messages:
        from saga_tasks.runtime.outlet import deliver

        deliver(app.engine, saga_outbox, app.publisher, messages)
    log.warning(
        "held message %s replayed by %s%s", held_id, actor, " (forced)" if force else "",
        extra={"saga_id": row["saga_id"], "message_id": row["message_id"]},
    )  # fmt: skip
    return ReplayResult(held_id, True, bool(blocking), checks)


def _publish_held(
    app: SagaApp, conn: Connection, row: Mapping[str, Any], *, actor: str, said: str
) -> None:
    held_id = row["id"]
    body = base64.b64decode(row["body"]) if row["body_base64"] else (row["body"] or "").encode()
    headers = {**clean_headers(row["headers"]), H_REPLAYED_FROM: str(held_id)}
    app.publisher.publish_raw(
        exchange="",
        routing_key=row["original_queue"],
        body=body,
        headers=headers,
        content_type=row["content_type"],
        content_encoding=row["content_encoding"],
    )
    conn.execute(
        update(held_message)
        .where(held_message.c.id == held_id)
        .values(status="replayed", resolved_at=app.clock.now(), resolved_by=actor, resolution=said)
    )


def discard(app: SagaApp, held_id: int, *, actor: str, reason: str) -> None:
    """Close a held message without sending it; the decision stays on record."""
    _need(actor, reason)
    with translated(app.settings.database_url), app.engine.begin() as conn:
        row = held(conn, held_id, lock=True)
        if row["status"] != "pending":
            raise ActionRefused(f"held message {held_id} is already {row['status']}")
        conn.execute(
            update(held_message)
            .where(held_message.c.id == held_id)
            .values(
                status="discarded",
                resolved_at=app.clock.now(),
                resolved_by=actor,
                resolution=reason,
            )
        )
        said = f"held message {held_id} discarded: {reason}"
        _note(app, conn, row, "operator_discard", actor=actor, reason=said)


def _need(actor: str, reason: str) -> None:
    if not actor.strip() or not reason.strip():
        raise InputError("an operator action needs --actor and --reason")


def _note(
    app: SagaApp, conn: Connection, row: Mapping[str, Any], event: str, *, actor: str, reason: str
) -> None:
    if row["saga_id"] is None:
        return
    from saga_tasks.persistence.tables import saga_history, saga_instance

    status = conn.execute(
        select(saga_instance.c.status).where(saga_instance.c.saga_id == row["saga_id"])
    ).scalar_one_or_none()
    if status is None:
        return
    conn.execute(
        insert(saga_history).values(
            saga_id=row["saga_id"],
            at=app.clock.now(),
            event=event,
            step=row["step"],
            status_before=status,
            status_after=status,
            message_id=row["message_id"],
            actor=actor,
            reason=reason[:1000],
            detail={"held_id": row["id"]},
        )
    )


def _kind(value: Any) -> MessageKind | None:
    try:
        return MessageKind(value)
    except ValueError:
        return None
