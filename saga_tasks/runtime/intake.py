"""The intake: dead letters and parked messages moved off the broker into the database.

A beat task moves each message of ``saga.dead_letter`` and ``saga.parking_lot`` into
``saga.held_message`` with what is known of its failure (reason, x-death count, first
and last death, original queue and routing key, message id, the broker user that
published it), and feeds a dead letter to its saga as an event, in the same transaction;
the message is acked after that commits. A held message is never the end of the story:
the saga's history and ``show`` name it.

What a held message says of itself (``x-death``, ``saga_dead_reason``) is only as good as
its publisher: RabbitMQ 3.10 lets any publisher set those headers. What the broker does
vouch for is the publisher's user (``user_id``, checked at publish). So with one broker
user per service a held message moves its saga only when it is *attested*: published by
the orchestrator's user (the broker dead-lettered one of its commands, or it held a
message itself) or by the user of the participant that owns the step (its own holds, or
its reply dead-lettered), and, for a service's hold, only when what it held came from
such a sender too (``saga_sent_by``). Any other is stored with ``attested`` false, its
reason shown as the publisher's claim, and a note in the saga's history; it moves nothing
until an operator replays or discards it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, Engine
from sqlalchemy import exc as sa_exc

from saga_tasks.core.clock import Clock
from saga_tasks.core.events import DeadLettered
from saga_tasks.core.messages import (
    H_COMMAND_ID,
    H_KIND,
    H_REPLY_TO_KIND,
    H_SAGA_ID,
    H_STEP,
    OutboundMessage,
)
from saga_tasks.core.model import SagaState
from saga_tasks.core.senders import H_SENT_BY, OPEN, Senders, publisher
from saga_tasks.core.states import MessageKind
from saga_tasks.errors import ConcurrencyConflict, ServiceUnavailable, UnknownDefinitionVersion
from saga_tasks.messaging.publisher import Publisher
from saga_tasks.messaging.taker import RawMessage, take
from saga_tasks.messaging.topology import QUORUM_DELIVERY_LIMIT
from saga_tasks.observability import metrics
from saga_tasks.persistence import held as held_sql
from saga_tasks.persistence import sagas, storable
from saga_tasks.persistence.db import translated
from saga_tasks.persistence.tables import saga_outbox
from saga_tasks.runtime.holding import (
    DEAD_LETTER,
    H_DEAD_DEATHS,
    H_DEAD_FROM,
    H_DEAD_REASON,
    H_PARKED_FROM,
    H_PARKED_REASON,
    H_STORED_ESCAPED,
    HOLDINGS,
    INT_MAX,
    PARKING,
    POISON,
    header_count,
)
from saga_tasks.runtime.outlet import deliver

log = logging.getLogger("saga_tasks.runtime.intake")

DeadLetterSink = Callable[[Connection, str, DeadLettered], list[OutboundMessage]]
"""Feeds a dead letter to its saga inside the intake's transaction (the orchestrator's)."""
StepQueue = Callable[[SagaState, str], "str | None"]
"""The queue of a saga's step (its participant owns it); None for no such step."""


@dataclass(frozen=True)
class IntakeReport:
    holding: str
    taken: int
    recorded: int
    fed_to_sagas: int


INTAKE = "intake"
"""The ``consumer`` label of the intake's metrics."""


class Intake:
    """Takes held messages off their queues into the database, one pass at a time."""

    def __init__(
        self,
        *,
        engine: Callable[[], Engine],
        publisher: Callable[[], Publisher],
        broker_url: str,
        dead_lettered: DeadLetterSink,
        clock: Clock,
        senders: Senders = OPEN,
        step_queue: StepQueue = lambda _state, _step: None,
    ) -> None:
        self._engine = engine
        self._publisher = publisher
        self.broker_url = broker_url
        self._dead_lettered = dead_lettered
        self.clock = clock
        self.senders = senders
        self._step_queue = step_queue
        self._lock = threading.Lock()
        self._unmarked: list[int] = []
        """Rows whose acks the broker processed, not yet marked so (the database was away)."""

    def take(self, holding: str, *, limit: int = 500) -> IntakeReport:
        """Move up to ``limit`` messages from a holding queue into the database.

        Every message leaves the queue once it is stored: as it arrived; escaped, when a
        value in it cannot be stored as it is (the reason says so); without being fed to
        its saga, when its saga cannot take it (the reason and the saga's history say
        why); or, if even that fails, reduced to what can be stored. A message is left
        in the queue only while the database is away (``ServiceUnavailable``, which ends
        the pass) or, after all of the above failed, with an error logged; in both cases
        the messages behind it are still taken. Each delivery is a row of its own (two
        publishes are two rows, alike in every byte or not), except a message delivered
        again after an earlier pass stored it and lost its ack: it is stored once.
        """
        queue = HOLDINGS[holding]
        counts = {"recorded": 0, "fed": 0}
        self._mark_acked()  # rows of a pass whose marking failed: before any is claimed
        stored: list[int] = []

        def handle(message: RawMessage) -> bool:
            try:
                held_id, was_fed = self._take(holding, message, stored)
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
            if held_id is not None:
                stored.append(held_id)  # acked next, once this returns
            counts["recorded"] += held_id is not None
            counts["fed"] += was_fed
            return True

        def acked() -> None:
            with self._lock:
                self._unmarked.extend(stored)
            try:
                self._mark_acked()
            except Exception:  # the database went away: the next pass marks them first
                log.warning("held messages acked but not yet marked so", exc_info=True)

        taken = take(self.broker_url, queue, handle, limit=limit, acked=acked)
        if taken:
            log.info("intake moved %d messages from %s (%d new)", taken, queue, counts["recorded"])
        return IntakeReport(holding, taken, counts["recorded"], counts["fed"])

    def _mark_acked(self) -> None:
        """Mark the rows whose acks the broker processed (``held.mark_acked``)."""
        with self._lock:
            ids = list(self._unmarked)
        if not ids:
            return
        engine = self._engine()
        with translated(engine.url), engine.begin() as conn:
            held_sql.mark_acked(conn, ids)
        done = set(ids)
        with self._lock:
            self._unmarked = [i for i in self._unmarked if i not in done]

    def _take(
        self, holding: str, message: RawMessage, stored: Sequence[int]
    ) -> tuple[int | None, bool]:
        """Store one held message (and feed a dead letter to its saga): (the new row's id,
        or None when it was stored before; fed). ``stored``: this pass's rows, acked."""
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
            where = ", ".join(escaped)
            facts["reason"] = (
                f"{facts['reason']}; stored escaped: NUL or invalid characters in {where}"
            )[:1000]
        body = message.body
        key = delivery_key(message)
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
            return self._store(holding, values, facts, message, stored)
        except (ServiceUnavailable, ConcurrencyConflict):
            raise
        except Exception as exc:
            # Not storable even escaped (a number out of range, a bug): keep what surely is.
            why = f"{type(exc).__name__}: {_first_line(exc)}"
            metrics.MESSAGES.labels(consumer=INTAKE, classification="held_reduced").inc()
            log.error(
                "held message stored reduced: %s", why, exc_info=True, extra=_log_fields(headers)
            )
            reduced = {
                "holding": holding,
                "delivery_key": key,
                "reason": f"{facts['reason']}; stored reduced: {why}"[:1000],
                "headers": {H_STORED_ESCAPED: f"reduced: {why}"[:500]},
                "body": base64.b64encode(body).decode(),
                "body_base64": True,
            }
            return self._store(holding, reduced, None, message, stored)

    def _store(
        self,
        holding: str,
        values: dict[str, Any],
        facts: Mapping[str, Any] | None,
        message: RawMessage,
        stored: Sequence[int],
    ) -> tuple[int | None, bool]:
        """Insert the row; feed a dead letter to its saga, or note a parked one on it.

        A message RabbitMQ did not flag as redelivered was never delivered before: it is a
        row of its own, whatever it has in common with others. One flagged may be one an
        earlier pass stored and whose ack was lost (a crash, a dropped connection): it
        takes that pass's unacked row of the same delivery key, if there is one."""
        saga_id = facts["saga_id"] if facts is not None else None
        sender = message.user_id
        messages: list[OutboundMessage] = []
        fed = False
        engine = self._engine()
        with translated(engine.url), engine.begin() as conn:
            if message.redelivered and (
                held_sql.claim_unacked(conn, holding, values["delivery_key"], exclude=stored)
                is not None
            ):
                return None, False  # stored before, and its ack was lost: nothing more to do
            # Locked, so a purge of the saga cannot run between this read and the held
            # row's write (the row would outlive the saga it names).
            state = sagas.lock(conn, saga_id) if saga_id is not None else None
            if state is None:
                saga_id = None
            doubt = self._doubt(holding, sender, state, facts)
            values = {
                **values,
                "published_by": storable.optional_text(sender),
                "attested": doubt is None,
            }
            if doubt is not None:
                values["reason"] = f"not attested: {doubt}; it claims: {values['reason']}"[:1000]
            held_id = held_sql.store(conn, values, saga_id)
            if facts is None or saga_id is None:
                pass
            elif doubt is not None:
                self._not_attested(conn, saga_id, held_id, doubt, facts)
            elif holding == DEAD_LETTER and facts["kind"] is not None:
                messages, fed = self._feed(conn, saga_id, held_id, facts)
            else:
                sagas.append_note_if_exists(
                    conn,
                    saga_id,
                    event="message_parked",
                    reason=f"held message {held_id} parked: {facts['reason']}",
                    message_id=facts["message_id"],
                    now=self.clock.now(),
                )
        if messages:
            deliver(engine, saga_outbox, self._publisher(), messages)
        return held_id, fed

    def _doubt(
        self,
        holding: str,
        sender: str | None,
        state: SagaState | None,
        facts: Mapping[str, Any] | None,
    ) -> str | None:
        """Why a held message is not attested (see the module docstring); None if it is."""
        what = "dead letter" if holding == DEAD_LETTER else "parked message"
        if state is None or facts is None:
            return self.senders.stranger(sender, what)
        step = facts["step"]
        try:
            queue = self._step_queue(state, step) if step else None
        except UnknownDefinitionVersion:
            queue = None  # who owns the step is unknown here: only the orchestrator counts
        if step:
            what = f"{what} of step {step!r}"
        doubt = self.senders.refusal(sender, queue, what)
        if doubt is None and holding == DEAD_LETTER and facts["sent_by"] is not None:
            # Held by a service that may speak for the step: the message it held must
            # have come from a sender that may too, or the hold would launder it.
            held_by = f"{what}, held by {publisher(sender)},"
            doubt = self.senders.refusal(facts["sent_by"] or None, queue, held_by)
        return doubt

    def _not_attested(
        self,
        conn: Connection,
        saga_id: str,
        held_id: int,
        doubt: str,
        facts: Mapping[str, Any],
    ) -> None:
        """A held message the broker does not vouch for: a note on its saga, nothing more."""
        fields = {"saga_id": saga_id, "message_id": facts["message_id"], "held_id": held_id}
        metrics.SENDERS_REFUSED.labels(consumer=INTAKE).inc()
        metrics.MESSAGES.labels(consumer=INTAKE, classification="held_not_attested").inc()
        log.warning("held message not attested; it moves no saga: %s", doubt, extra=fields)
        sagas.append_note_if_exists(
            conn,
            saga_id,
            event="held_not_attested",
            reason=(
                f"held message {held_id} not attested, so not fed to the saga (an operator "
                f"replays or discards it): {doubt}"
            )[:1000],
            message_id=facts["message_id"],
            now=self.clock.now(),
        )

    def _feed(
        self, conn: Connection, saga_id: str, held_id: int, facts: Mapping[str, Any]
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
                return self._dead_lettered(conn, saga_id, event), True
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
            held_sql.set_reason(conn, held_id, f"{facts['reason']}; not fed to its saga: {why}")
            sagas.append_note_if_exists(
                conn,
                saga_id,
                event="dead_letter_not_fed",
                reason=f"held message {held_id} could not be fed to the saga: {why}"[:1000],
                message_id=facts["message_id"],
                now=self.clock.now(),
            )
            return [], False


REDELIVERY_HEADERS = frozenset({"x-delivery-count"})
"""Headers RabbitMQ changes when it delivers a message again (a quorum queue counts)."""


def delivery_key(message: RawMessage) -> str:
    """A digest of what tells one delivery from another publish and stays as it was when
    RabbitMQ delivers the message again: the exchange and routing key it came by, every
    AMQP property (message id, timestamp, correlation id, ...), every header but
    ``REDELIVERY_HEADERS``, and the body."""
    headers = {k: v for k, v in message.headers.items() if k not in REDELIVERY_HEADERS}
    described = [
        message.exchange,
        message.routing_key,
        storable.plain(dict(message.properties)),
        storable.plain(headers),
    ]
    return hashlib.sha256(
        json.dumps(described, sort_keys=True, default=str).encode()
        + hashlib.sha256(message.body).digest()
    ).hexdigest()


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
    work_deaths = sum(header_count(d.get("count")) for d in deaths if d.get("reason") != "expired")
    if holding == PARKING:
        reason = str(headers.get(H_PARKED_REASON) or "parked")
        queue = headers.get(H_PARKED_FROM)
        death_count = 0
    else:
        reason, death_count = _dead_reason(headers, latest, work_deaths)
        queue = headers.get(H_DEAD_FROM) or latest.get("queue")
    routing_keys = _as_list(latest.get("routing-keys"))
    queue = storable.optional_text(queue)
    sent_by = headers.get(H_SENT_BY)
    return {
        "message_id": storable.optional_text(headers.get("id")),
        # A service's hold names who sent what it held (None: not a service's copy).
        "sent_by": None if sent_by is None else str(sent_by),
        "saga_id": saga_id,
        "step": storable.optional_text(headers.get(H_STEP)),
        "kind": kind,
        # A command's own id; a reply's names the command it answers (``DeadLettered``).
        "command_id": storable.optional_text(headers.get(H_COMMAND_ID)),
        "reply_to_kind": headers.get(H_REPLY_TO_KIND),
        "reason": reason[:500],
        "queue": queue,
        "routing_key": storable.optional_text(routing_keys[0]) if routing_keys else queue,
        "exchange": storable.optional_text(latest.get("exchange")),
        "death_count": death_count,
        "first_death_at": min(times) if times else None,
        "last_death_at": max(times) if times else None,
    }


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
            return reason, header_count(headers.get(H_DEAD_DEATHS)) or max(work_deaths, 1)
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
    resent = header_count(headers.get("retries"))
    if resent:
        # Celery re-sends a task whose pool child was lost, then lets it die here.
        return (
            f"{POISON}{died} by the broker after {resent} re-sends for lost worker processes",
            min(resent + 1, INT_MAX),
        )
    return f"{died} by the broker", max(work_deaths, 1)


def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else []


def _when(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        found = value
    else:
        try:
            found = datetime.fromisoformat(str(value))
        except ValueError:
            return None
    return found if found.tzinfo else found.replace(tzinfo=UTC)
