"""The transactional shell around the decider: one transaction per event.

    dedup (inbox) and lock the saga row -> decide -> write state, history, outbox
    -> commit -> publish the outbox rows with confirms -> (the task acks)

Starting a saga is the same shell with a unique (type, business key) in place of
the inbox, and may join the caller's SQLAlchemy session so that an application's
own write and its saga start commit or roll back together.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine, event
from sqlalchemy.orm import Session

from saga_tasks.core.clock import Clock
from saga_tasks.core.decider import CommandIntent, Decision, decide, migrate
from saga_tasks.core.definitions import SagaDefinition
from saga_tasks.core.events import (
    DeadLettered,
    Event,
    OperatorAction,
    ReplyReceived,
    SignalReceived,
    Started,
)
from saga_tasks.core.messages import OutboundMessage, command_headers, parse_reply
from saga_tasks.core.model import SagaState, new_id_key
from saga_tasks.core.registry import Registry
from saga_tasks.core.senders import OPEN, Senders
from saga_tasks.core.states import TERMINAL_SAGA, Classification, SagaStatus
from saga_tasks.errors import (
    ActionRefused,
    BusinessKeyConflict,
    InputError,
    InvalidMessage,
    SagaNotFound,
    SenderRefused,
    ServiceUnavailable,
    VersionMismatch,
)
from saga_tasks.messaging.topology import REPLY_QUEUE, Topology
from saga_tasks.observability import logs, metrics, tracing
from saga_tasks.observability.tracing import OFF, Tracing
from saga_tasks.persistence import sagas, versions
from saga_tasks.persistence.db import translated
from saga_tasks.persistence.tables import ORCHESTRATOR, saga_outbox
from saga_tasks.runtime import invalid
from saga_tasks.runtime.admission import Admission
from saga_tasks.runtime.flow import FlowControl
from saga_tasks.runtime.hooks import NO_HOOKS, Hooks
from saga_tasks.runtime.outlet import Outlet

log = logging.getLogger("saga_tasks.orchestrator")

MAX_BUSINESS_KEY = 200
OVERDUE = frozenset({"step_overdue", "compensation_overdue", "signal_escalated"})
"""History events of a step or compensation sent again past its policy's attempts: an
alert (forward recovery goes on, but someone should look at the participant)."""
_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")


@dataclass(frozen=True)
class SagaHandle:
    """What ``start_saga`` returns: enough to find the saga again."""

    saga_id: str
    saga_type: str
    business_key: str
    status: SagaStatus
    created: bool
    """False when the business key named an existing saga, which is returned instead."""


@dataclass(frozen=True)
class DeliveredReply:
    """One reply as the worker received it, for ``Orchestrator.handle_replies``."""

    message_id: str
    headers: Mapping[str, Any] | None
    body: Any
    sender: str | None


@dataclass(frozen=True)
class _ReplyOutcome:
    """What one reply did in its transaction; ``decision`` None for a duplicate, ``state``
    None for an unknown saga, ``invalid`` the reason when the reply makes no sense."""

    message_id: str
    step: str
    saga_id: str
    state: SagaState | None
    decision: Decision | None = None
    messages: list[OutboundMessage] = field(default_factory=list)
    invalid: str | None = None


class Orchestrator:
    """Starts sagas and applies replies to them."""

    def __init__(
        self,
        *,
        engine: Callable[[], Engine],
        registry: Registry,
        topology: Topology,
        outlet: Callable[[], Outlet],
        clock: Clock,
        tracing: Tracing = OFF,
        hooks: Hooks = NO_HOOKS,
        senders: Senders = OPEN,
        flow: FlowControl | None = None,
        admission: Admission | None = None,
    ) -> None:
        self.hooks = hooks
        self.flow = flow or FlowControl({})
        self.admission = admission
        self.senders = senders
        self._engine = engine
        self.registry = registry
        self.topology = topology
        self._outlet = outlet
        self.clock = clock
        self.tracing = tracing

    @property
    def engine(self) -> Engine:
        return self._engine()

    # -- start ----------------------------------------------------------------------------

    def start(
        self,
        saga_type: str,
        business_key: str,
        payload: Any,
        *,
        session: Session | None = None,
        traceparent: str | None = None,
    ) -> SagaHandle:
        """Start a saga, or return the one already started for this business key."""
        definition = self.registry.latest(saga_type)
        if not isinstance(business_key, str) or not business_key.strip():
            raise InputError("business key must be a non-empty string")
        if len(business_key) > MAX_BUSINESS_KEY:
            raise InputError(f"business key is longer than {MAX_BUSINESS_KEY} characters")
        if traceparent is not None and not _TRACEPARENT.match(traceparent):
            raise InputError("traceparent is not a W3C trace context header")
        clean = definition.validate_payload(payload)
        if self.admission is not None:
            self.admission.admit(definition, business_key)
        self.hooks.starting(saga_type, clean)
        digest = sagas.payload_hash(clean)
        with self.tracing.span(
            f"saga.start {saga_type}", traceparent, **{"saga.type": saga_type}
        ) as tp:
            return self._start(
                definition, business_key, clean, digest=digest, traceparent=tp, session=session
            )

    def _start(
        self,
        definition: SagaDefinition,
        business_key: str,
        clean: dict[str, Any],
        *,
        digest: str,
        traceparent: str | None,
        session: Session | None,
    ) -> SagaHandle:
        now = self.clock.now()
        saga_id = str(uuid.uuid4())
        state = SagaState.new(
            definition,
            saga_id=saga_id,
            business_key=business_key,
            payload=clean,
            now=now,
            traceparent=traceparent,
            id_key=new_id_key(),
        )
        decision = decide(definition, state, Started(), now)
        if session is not None:
            return self._start_in_session(session, definition, decision, digest)
        with translated(self.engine.url), self.engine.begin() as conn:
            handle, messages, held = self._write_start(conn, definition, decision, digest)
            if held:
                messages += self.flow.release(conn, {m.queue for m in held})
        if handle.created:
            self._outlet().send(saga_outbox, messages)
        return handle

    def _start_in_session(
        self, session: Session, definition: SagaDefinition, decision: Decision, digest: str
    ) -> SagaHandle:
        conn = session.connection()
        handle, messages, held = self._write_start(conn, definition, decision, digest)
        if handle.created and (messages or held):
            self._publish_after_commit(session, conn, handle, messages, {m.queue for m in held})
        return handle

    def _publish_after_commit(
        self,
        session: Session,
        conn: Connection,
        handle: SagaHandle,
        messages: list[OutboundMessage],
        held: set[str],
    ) -> None:
        """Publish the start's first commands once the transaction that holds it commits;
        commands to ``held`` queues (flow control) are released in a transaction of their
        own then, so the caller's transaction never waits for a queue's release lock.

        ``after_commit`` also fires when a savepoint is released, and the caller's next
        commit may not hold the start at all (a savepoint around it, or the whole
        transaction, may have rolled back first). So the hook waits until no transaction
        is open, then looks the saga row up: a start that did not commit sends nothing.
        When the session joined a transaction of the caller's own connection, that
        commit is not the session's to see: outbox recovery sends the commands then, as
        it does when the look-up fails.
        """
        fields = {"saga_id": handle.saga_id, "saga_type": handle.saga_type}
        done: list[bool] = []  # a listener cannot remove itself while it is dispatched

        def publish_after_commit(_session: Session) -> None:
            if done or (not conn.closed and conn.in_transaction()):
                # Done already, or a savepoint was released (or the session joined a
                # transaction of the caller's connection, whose commit fires nothing
                # here: recovery sends).
                return
            done.append(True)
            try:
                with translated(self.engine.url), self.engine.begin() as check:
                    committed = sagas.exists(check, handle.saga_id)
                    released = self.flow.release(check, held) if committed and held else []
            except ServiceUnavailable:
                log.warning(
                    "saga start: cannot tell whether it committed; recovery sends its commands",
                    extra=fields,
                )
                return
            if not committed:
                log.info(
                    "saga start rolled back with the caller's transaction; nothing sent",
                    extra=fields,
                )
                return
            self._outlet().send(saga_outbox, [*messages, *released])

        event.listen(session, "after_commit", publish_after_commit)

    def _write_start(
        self, conn: Connection, definition: SagaDefinition, decision: Decision, digest: str
    ) -> tuple[SagaHandle, list[OutboundMessage], list[OutboundMessage]]:
        """The start's row, steps, history and commands; (handle, sent now, waiting)."""
        state = decision.state
        now = state.created_at
        messages, held = self.flow.split(
            [command_message(self.topology, state, c, causation_id=None) for c in decision.commands]
        )
        inserted = sagas.insert_new(
            conn,
            state,
            digest,
            now,
            [s.name for s in definition.steps],
            history=sagas.history_rows(state.saga_id, decision.history, now),
            messages=messages,
            held=held,
        )
        if not inserted:
            existing = sagas.find_by_key(conn, state.saga_type, state.business_key)
            if existing is None:  # deleted between the two statements
                raise InputError("the saga for this business key disappeared; try again")
            if existing.payload_hash != digest:
                raise BusinessKeyConflict(
                    f"business key {state.business_key!r} already started saga {existing.saga_id} "
                    "with a different payload",
                    saga_id=str(existing.saga_id),
                )
            return (
                SagaHandle(
                    str(existing.saga_id),
                    state.saga_type,
                    state.business_key,
                    SagaStatus(existing.status),
                    created=False,
                ),
                [],
                [],
            )
        metrics.SAGAS_STARTED.labels(saga_type=state.saga_type).inc()
        log.info(
            "saga started",
            extra=log_fields(state, None, status_before=None, status_after=state.status),
        )
        return (
            SagaHandle(
                state.saga_id, state.saga_type, state.business_key, state.status, created=True
            ),
            messages,
            held,
        )

    # -- replies --------------------------------------------------------------------------

    def handle_reply(
        self,
        message_id: str,
        headers: Mapping[str, Any] | None,
        body: Any,
        *,
        routing_key: str | None = None,
        redelivered: bool = False,
        raise_invalid: bool = False,
        sender: str | None = None,
    ) -> Classification:
        """Apply one reply; every outcome is written down.

        A message that makes no sense, or comes from a broker user (``sender``, its AMQP
        ``user_id``) that may not send it, is recorded and returns INVALID, or with
        ``raise_invalid`` raises ``InvalidMessage`` (so the worker parks it).
        """
        step = (headers or {}).get("saga_step")
        traceparent = (headers or {}).get("traceparent")
        with self.tracing.span(f"saga.reply {step}", traceparent, **tracing.attributes(headers)):
            try:
                self._refuse_sender(self.senders.stranger(sender, "reply"))
                saga_id, reply = parse_reply(message_id, headers, body)
                return self._handle_reply(
                    saga_id, reply, message_id, redelivered=redelivered, sender=sender
                )
            except InvalidMessage as exc:
                invalid.record(
                    self.engine,
                    consumer=ORCHESTRATOR,
                    reason=exc.reason,
                    queue=REPLY_QUEUE,
                    routing_key=routing_key,
                    task_name="saga_tasks.reply",
                    message_id=message_id,
                    headers=headers,
                    body=body,
                )
                if raise_invalid:
                    raise
                return Classification.INVALID

    @staticmethod
    def _refuse_sender(reason: str | None, *, count: bool = True) -> None:
        """Raise ``SenderRefused`` (counted, unless not ``count``) with ``reason``, if
        there is one."""
        if reason is not None:
            if count:
                metrics.SENDERS_REFUSED.labels(consumer=ORCHESTRATOR).inc()
            raise SenderRefused(reason)

    def step_queue(self, state: SagaState, step: str) -> str | None:
        """The queue of ``step`` in the saga's definition: its participant owns it."""
        definition = self.registry.get(state.saga_type, state.definition_version)
        found = definition.by_name.get(step)
        return found.queue if found is not None else None

    def _handle_reply(
        self,
        saga_id: str,
        reply: ReplyReceived,
        message_id: str,
        *,
        redelivered: bool,
        sender: str | None,
    ) -> Classification:
        """``handle_reply`` once the reply is read; a refused sender rolls back all it did."""
        now = self.clock.now()
        with translated(self.engine.url), self.engine.begin() as conn:
            outcome = self._decide_reply(conn, saga_id, reply, message_id, sender=sender, now=now)
        if outcome.invalid is not None:
            # Committed first: the inbox claim and the decider's note of it stay, so a
            # second delivery is a duplicate; handle_reply records the message.
            raise InvalidMessage(outcome.invalid)
        return self._after_replies([outcome], redelivered=redelivered)[0]

    def handle_replies(self, replies: Sequence[DeliveredReply]) -> list[Classification]:
        """Apply several replies in one transaction (group commit), or none of them.

        Each saga is locked in saga-id order (replies to one saga in arrival order), so two
        batches, or a batch and the sweeper, never wait on each other in a cycle. Anything
        but an accepted, stale or duplicate reply (a message that makes no sense, a refused
        sender, an unknown saga, the database away) raises and rolls the whole batch back:
        nothing of it was written, counted or sent, and the caller hands each message to the
        one-reply path, where it succeeds or fails alone. A batch of one is applied at once:
        group commit never waits for replies to arrive.
        """
        now = self.clock.now()
        read = []
        for delivered in replies:
            # Not counted here: the batch rolls back and the reply, applied alone, counts it.
            self._refuse_sender(self.senders.stranger(delivered.sender, "reply"), count=False)
            saga_id, reply = parse_reply(delivered.message_id, delivered.headers, delivered.body)
            read.append((saga_id, reply, delivered))
        in_lock_order = sorted(range(len(read)), key=lambda i: read[i][0])
        outcomes: list[_ReplyOutcome | None] = [None] * len(read)
        touched: set[str] = set()
        with translated(self.engine.url), self.engine.begin() as conn:
            for i in in_lock_order:
                saga_id, reply, delivered = read[i]
                headers = delivered.headers
                traceparent = (headers or {}).get("traceparent")
                attributes = tracing.attributes(headers)
                with self.tracing.span(f"saga.reply {reply.step}", traceparent, **attributes):
                    outcome = self._decide_reply(
                        conn,
                        saga_id,
                        reply,
                        delivered.message_id,
                        sender=delivered.sender,
                        now=now,
                        touched=touched,
                        count_refusal=False,
                    )
                if outcome.invalid is not None:
                    raise InvalidMessage(outcome.invalid)  # rolls the batch back
                outcomes[i] = outcome
            # The queues' releases once every saga is locked: saga locks first, queue locks
            # (in queue order) after, as in every other deciding transaction. A release per
            # reply would hold a queue's lock while waiting for the next saga: a cycle with
            # a transaction that holds that saga and releases the queue.
            released = self.flow.release(conn, touched) if touched else []
        decided = [o for o in outcomes if o is not None]
        return self._after_replies(decided, redelivered=False, released=released)

    def _decide_reply(
        self,
        conn: Connection,
        saga_id: str,
        reply: ReplyReceived,
        message_id: str,
        *,
        sender: str | None,
        now: datetime,
        touched: set[str] | None = None,
        count_refusal: bool = True,
    ) -> _ReplyOutcome:
        """Claim, lock, decide and write one reply in ``conn``'s transaction (its
        ``invalid`` names why a reply makes no sense); raises ``SenderRefused`` for a sender
        that may not send it. With ``touched``, the queues whose room may have changed are
        added to it, left for the caller to release, instead of released here; a refusal
        is counted unless ``count_refusal`` is False (a batch: its replies are applied
        again alone, and counted then)."""
        new, state = sagas.claim_and_lock(conn, ORCHESTRATOR, message_id, saga_id)
        if state is not None and self.senders.enforced:
            # The inbox claim and the lock roll back with this: a refused reply
            # leaves no trace but its record, and cannot pre-empt a real one.
            step_queue = self.step_queue(state, reply.step)
            what = f"reply for step {reply.step!r}"
            self._refuse_sender(self.senders.refusal(sender, step_queue, what), count=count_refusal)
        if not new:
            if state is not None:
                sagas.append_note(
                    conn,
                    state,
                    event="duplicate_message",
                    reason="message already consumed",
                    message_id=message_id,
                    now=now,
                )
            return _ReplyOutcome(message_id, reply.step, saga_id, state)
        if state is None:
            return _ReplyOutcome(
                message_id, reply.step, saga_id, None, invalid=f"reply for unknown saga {saga_id}"
            )
        decision, messages = self._apply(
            conn, state, reply, now, causation_id=message_id, touched=touched
        )
        invalid = None
        if decision.classification is Classification.INVALID:
            invalid = next((h.reason or "" for h in decision.history), "")
        return _ReplyOutcome(message_id, reply.step, saga_id, state, decision, messages, invalid)

    def _after_replies(
        self,
        outcomes: Sequence[_ReplyOutcome],
        *,
        redelivered: bool,
        released: Sequence[OutboundMessage] = (),
    ) -> list[Classification]:
        """Once the replies' transaction committed: count, log, probe, send (with the
        commands that transaction ``released``, when it released them itself)."""
        probes = []
        messages: list[OutboundMessage] = list(released)
        for o in outcomes:
            if o.decision is None or o.state is None:
                metrics.MESSAGES.labels(consumer=ORCHESTRATOR, classification="duplicate").inc()
                fields: dict[str, Any] = {"saga_id": o.saga_id, "message_id": o.message_id}
                if o.state is not None:
                    status = o.state.status
                    fields = log_fields(
                        o.state, o.message_id, status_before=status, status_after=status
                    )
                log.info("duplicate message ignored", extra={**fields, "step": o.step})
                continue
            observe(o.state, o.decision, o.message_id)
            messages += o.messages
            if not redelivered and o.decision.classification is Classification.ACCEPTED:
                fields = {"saga_id": o.state.saga_id, "message_id": o.message_id, "step": o.step}
                probe = self.hooks.reply(o.state, o.step, fields)
                if probe is not None:
                    probes.append(probe)
        for probe in probes:
            probe.committed()
        outlet = self._outlet()
        outlet.send(saga_outbox, messages)
        for probe in probes:
            probe.sent(outlet.flush)
        return [
            Classification.DUPLICATE if o.decision is None else o.decision.classification
            for o in outcomes
        ]

    def _apply(
        self,
        conn: Connection,
        state: SagaState,
        event: Event,
        now: datetime,
        *,
        causation_id: str | None = None,
        actor: str = sagas.SYSTEM_ACTOR,
        touched: set[str] | None = None,
    ) -> tuple[Decision, list[OutboundMessage]]:
        """The one path of every event but the start, the sweep and a signal (which
        decides before it checks the version): decide on the locked saga and write the
        decision in ``conn``'s transaction; the caller commits, then observes and sends."""
        definition = self.registry.get(state.saga_type, state.definition_version)
        decision = decide(definition, state, event, now)
        messages = self._write_decision(
            conn,
            definition,
            state,
            decision,
            now=now,
            causation_id=causation_id,
            actor=actor,
            touched=touched,
        )
        return decision, messages

    def _write_decision(
        self,
        conn: Connection,
        definition: SagaDefinition,
        state: SagaState,
        decision: Decision,
        *,
        now: datetime,
        causation_id: str | None,
        actor: str = sagas.SYSTEM_ACTOR,
        touched: set[str] | None = None,
    ) -> list[OutboundMessage]:
        """State (compare-and-set), history, outbox and commands waiting for capacity of
        one decision, in ``conn``'s tx: one statement, then the release of what fits in
        the queues it touched (two more, under flow control); with ``touched``, those
        queues are added to it for the caller to release once, after its last saga lock."""
        changes = sagas.Changes()
        if decision.changed:
            changes.save(state, decision.state, [s.name for s in definition.steps])
        changes.log(state.saga_id, decision.history, now, causation_id=causation_id, actor=actor)
        messages = [
            command_message(self.topology, decision.state, c, causation_id=causation_id)
            for c in decision.commands
        ]
        queues = self.flow.stage(
            conn, changes, definition=definition, old=state, new=decision.state, messages=messages
        )
        sagas.write_changes(conn, changes, now)
        if touched is not None:
            touched |= queues
            return changes.messages
        return changes.messages + self.flow.release(conn, queues)

    # -- operators and dead letters ---------------------------------------------------------

    def act(self, saga_id: str, action: OperatorAction, *, expect_version: int) -> SagaState:
        """Apply an operator's action if the saga is still at ``expect_version``.

        Raises ``SagaNotFound``, ``VersionMismatch`` (someone or something moved the saga
        since the operator looked) or ``ActionRefused`` (the action does not fit).
        """
        self.get(saga_id)  # a clear SagaNotFound for a bad id
        with translated(self.engine.url), self.engine.begin() as conn:
            messages, after = self.act_in(conn, saga_id, action, expect_version=expect_version)
        self._outlet().send(saga_outbox, messages)
        return after

    def act_in(
        self,
        conn: Connection,
        saga_id: str,
        action: OperatorAction,
        *,
        expect_version: int | None,
    ) -> tuple[list[OutboundMessage], SagaState]:
        """``act`` inside the caller's transaction; the caller publishes after commit."""
        now = self.clock.now()
        state = _lock_at(conn, saga_id, expect_version)
        decision, messages = self._apply(conn, state, action, now, actor=action.actor)
        observe(state, decision, None)
        log.warning(
            "operator %s by %s: %s",
            action.verb.value,
            action.actor,
            action.reason,
            extra=log_fields(
                decision.state, None, status_before=state.status, status_after=decision.state.status
            ),
        )
        return messages, decision.state

    def signal(
        self,
        saga_id: str,
        step: str,
        data: Any,
        *,
        actor: str,
        reason: str,
        expect_version: int | None = None,
    ) -> Decision:
        """A person's decision on a human step, and whether it was a duplicate (its
        ``classification``). The data is validated against the step's schema first
        (``InvalidPayload``: nothing changes); then as ``act``, but the same decision
        again is a duplicate whatever ``expect_version`` says: the version it was given
        at has passed by then, and a client retrying it must be safe. Only a decision
        that would change the saga is held to ``expect_version``."""
        now = self.clock.now()
        with translated(self.engine.url), self.engine.begin() as conn:
            state = _lock_at(conn, saga_id, None)
            definition = self.registry.get(state.saga_type, state.definition_version)
            target = definition.by_name.get(step)
            if target is not None and target.human is not None:
                data = target.human.validate(data)
            event = SignalReceived(step, data, actor=actor.strip(), reason=reason.strip())
            try:
                decision = decide(definition, state, event, now)
            except ActionRefused:
                _at_version(state, expect_version)  # a stale view is told to look again
                raise
            if decision.classification is not Classification.DUPLICATE:
                _at_version(state, expect_version)
            messages = self._write_decision(
                conn, definition, state, decision, now=now, causation_id=None, actor=event.actor
            )
        observe(state, decision, None)
        log.warning(
            "signal on step %s by %s: %s",
            step,
            event.actor,
            event.reason,
            extra={
                **log_fields(
                    decision.state,
                    None,
                    status_before=state.status,
                    status_after=decision.state.status,
                ),
                "step": step,
            },
        )
        self._outlet().send(saga_outbox, messages)
        return decision

    def migrate(
        self, saga_id: str, to_version: int, *, actor: str, reason: str, expect_version: int | None
    ) -> SagaState:
        """Move a saga to version ``to_version`` of its definition, as ``act`` applies an
        action: locked, at ``expect_version`` (None: whatever version it is at), written
        to its history with the actor, and what it sends then published after commit.

        Raises ``UnknownDefinitionVersion`` when this process does not load the saga's
        version or the target, and ``ActionRefused`` when the saga cannot move (see
        ``core.decider.migrate``).
        """
        self.get(saga_id)
        with translated(self.engine.url), self.engine.begin() as conn:
            state = _lock_at(conn, saga_id, expect_version)
            now = self.clock.now()
            old = self.registry.get(state.saga_type, state.definition_version)
            new = self.registry.get(state.saga_type, to_version)
            decision = migrate(old, new, state, actor=actor, reason=reason, now=now)
            messages = self._write_decision(
                conn, new, state, decision, now=now, causation_id=None, actor=actor
            )
            versions.lay_out_steps(conn, saga_id, [s.name for s in new.steps])
        observe(state, decision, None)
        log.warning(
            "saga moved from version %d to %d by %s: %s",
            old.version,
            new.version,
            actor,
            reason,
            extra=log_fields(
                decision.state, None, status_before=state.status, status_after=decision.state.status
            ),
        )
        self._outlet().send(saga_outbox, messages)
        return decision.state

    def dead_lettered(
        self, conn: Connection, saga_id: str, event: DeadLettered
    ) -> list[OutboundMessage]:
        """Feed a dead letter to its saga inside the intake's transaction; the messages to send."""
        state = sagas.lock(conn, saga_id)
        if state is None:
            return []
        decision, messages = self._apply(
            conn, state, event, self.clock.now(), causation_id=event.message_id
        )
        observe(state, decision, None)
        return messages

    def get(self, saga_id: str) -> SagaState:
        with translated(self.engine.url), self.engine.connect() as conn:
            return sagas.get(conn, saga_id)


def _lock_at(conn: Connection, saga_id: str, expect_version: int | None) -> SagaState:
    """Lock a saga an operator acts on; refuse if it moved since they looked."""
    state = sagas.lock(conn, saga_id)
    if state is None:
        sagas.get(conn, saga_id)  # SagaPurged for a purged saga, else SagaNotFound
        raise SagaNotFound(f"no saga {saga_id}")
    _at_version(state, expect_version)
    return state


def _at_version(state: SagaState, expect_version: int | None) -> None:
    """Refuse to act on a saga that moved since the operator looked."""
    if expect_version is not None and state.version != expect_version:
        raise VersionMismatch(
            f"saga {state.saga_id} is at version {state.version}, not {expect_version}; "
            "look at it again before acting",
            current=state.version,
        )


def observe(before: SagaState, decision: Decision, message_id: str | None) -> None:
    """Metrics and log lines of one decision, after its transaction committed."""
    after = decision.state

    def step_latency(step: str) -> float | None:
        st = after.steps.get(step)
        if st is None or st.requested_at is None or st.finished_at is None:
            return None
        return (st.finished_at - st.requested_at).total_seconds()

    metrics.observe_history(after.saga_type, decision.history, step_latency)
    if message_id is not None:
        metrics.MESSAGES.labels(
            consumer=ORCHESTRATOR, classification=decision.classification.value
        ).inc()
    if (
        decision.changed
        and after.status != before.status
        and (after.status in TERMINAL_SAGA or after.status is SagaStatus.MANUAL_REVIEW)
    ):
        metrics.SAGAS_FINISHED.labels(saga_type=after.saga_type, status=after.status.value).inc()
    level = logging.INFO if decision.classification is Classification.ACCEPTED else logging.WARNING
    if (
        decision.changed
        and after.status is SagaStatus.MANUAL_REVIEW
        and before.status is not SagaStatus.MANUAL_REVIEW
    ):
        logs.alert(
            log,
            "saga needs manual review: %s",
            after.reason,
            **log_fields(after, message_id, status_before=before.status, status_after=after.status),
        )
    for entry in decision.history:
        if entry.event in OVERDUE:
            logs.alert(
                log,
                "step %s overdue: %s",
                entry.step,
                entry.reason,
                **{**log_fields(after, message_id, status_before=before.status,
                                status_after=after.status), "step": entry.step},
            )  # fmt: skip
    if not log.isEnabledFor(level):
        return
    for entry in decision.history:
        log.log(
            level,
            entry.event,
            extra={
                **log_fields(
                    after, message_id, status_before=before.status, status_after=after.status
                ),
                "step": entry.step,
                "step_status_before": entry.step_status_before,
                "step_status_after": entry.step_status_after,
                "reason": entry.reason,
            },
        )


def command_message(
    topology: Topology, state: SagaState, intent: CommandIntent, causation_id: str | None
) -> OutboundMessage:
    """The outbox message of one command the decider asked for."""
    return OutboundMessage(
        message_id=intent.message_id,
        task_name=intent.task_name,
        queue=intent.queue,
        headers=command_headers(
            saga_id=state.saga_id,
            saga_type=state.saga_type,
            step=intent.step,
            kind=intent.kind,
            command_id=intent.command_id,
            attempt=intent.attempt,
            correlation_id=state.correlation_id or state.saga_id,
            causation_id=causation_id,
            compensates=intent.compensates,
            traceparent=state.traceparent,
            supersedes=intent.supersedes,
        ),
        body=intent.body,
        saga_id=state.saga_id,
        routing_key=topology.routing_key(intent.queue, intent.task_name),
    )


# -- reading --------------------------------------------------------------------------


def log_fields(
    state: SagaState,
    message_id: str | None,
    *,
    status_before: SagaStatus | None,
    status_after: SagaStatus,
) -> dict[str, Any]:
    return {
        "saga_id": state.saga_id,
        "saga_type": state.saga_type,
        "trace_id": tracing.trace_id(state.traceparent),
        "correlation_id": state.correlation_id,
        "causation_id": message_id,
        "message_id": message_id,
        "status_before": status_before,
        "status_after": status_after,
    }
