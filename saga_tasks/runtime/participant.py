"""The participant runtime: one command in one transaction of the participant's database.

For every command, in one transaction of the participant's own database:
the command ledger is claimed by command id (a duplicate re-sends the stored reply
and runs nothing), the business function runs, and the reply is stored in the ledger
and written to the participant's outbox. The reply is published after commit. A
``BusinessRejection`` rolls the whole transaction back, the function's partial
writes with it, and the refusal is claimed and queued in a transaction of its own.

A compensation whose forward command never ran leaves a tombstone in the ledger
under the forward command's id and succeeds; if the forward command arrives later,
it meets the tombstone and is refused, never executed.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine

from saga_tasks.core.clock import Clock
from saga_tasks.core.messages import (
    H_CAUSATION_ID,
    H_SAGA_TYPE,
    Command,
    OutboundMessage,
    parse_command,
    reply_message,
)
from saga_tasks.core.senders import OPEN, Senders
from saga_tasks.core.states import MessageKind, Outcome
from saga_tasks.errors import BusinessRejection, InvalidMessage, SenderRefused
from saga_tasks.messaging.publisher import Publisher
from saga_tasks.messaging.topology import REPLY_QUEUE
from saga_tasks.observability import metrics, tracing
from saga_tasks.observability.tracing import OFF, Tracing
from saga_tasks.participant import CommandContext, Handler, Participant
from saga_tasks.persistence import ledger as ledger_sql
from saga_tasks.persistence import redeliveries
from saga_tasks.persistence.db import translated
from saga_tasks.runtime import invalid
from saga_tasks.runtime.hooks import NO_HOOKS, CommandProbe, Hooks
from saga_tasks.runtime.outlet import Outlet, relay

log = logging.getLogger("saga_tasks.runtime.participant")

_REPLY_NAMESPACE = uuid.UUID("3f1e8f3c-55a7-4c4b-8f0e-2b8f7f8d9a10")
TOMBSTONED = "compensated_before_execution"
"""Error code of the reply to a forward command that arrived after its compensation."""
SUPERSEDED = "superseded"
"""Error code of the reply to a compensation that a newer generation fenced off."""


def reply_id_for(command_id: str) -> str:
    return str(uuid.uuid5(_REPLY_NAMESPACE, f"{command_id}/reply"))


class Unbatchable(Exception):
    """A command of a batch must run alone (a hook probes it): the batch rolls back."""


@dataclass(frozen=True)
class DeliveredCommand:
    """One command as the worker received it, for ``ParticipantRuntime.execute_batch``."""

    handler: Handler
    message_id: str
    headers: Mapping[str, Any] | None
    body: Any
    sender: str | None


@dataclass(frozen=True)
class _Reply:
    outcome: Outcome
    result: Mapping[str, Any] | None = None
    error_code: str | None = None
    error_message: str | None = None

    def stored(self) -> dict[str, Any]:
        return {
            "outcome": self.outcome.value,
            "result": dict(self.result) if self.result is not None else None,
            "error_code": self.error_code,
            "error_message": self.error_message,
        }

    @classmethod
    def from_stored(cls, value: Mapping[str, Any]) -> _Reply:
        return cls(
            Outcome(value["outcome"]),
            value.get("result"),
            value.get("error_code"),
            value.get("error_message"),
        )


class ParticipantRuntime:
    """Runs handlers of one participant: the ledger, the handler, the outbox, the publish."""

    def __init__(
        self,
        participant: Participant,
        *,
        engine: Callable[[], Engine],
        publisher: Callable[[], Publisher],
        outlet: Callable[[], Outlet],
        clock: Clock,
        tracing: Tracing = OFF,
        hooks: Hooks = NO_HOOKS,
        senders: Senders = OPEN,
    ) -> None:
        self.participant = participant
        self.senders = senders
        self._engine = engine
        self._publisher = publisher
        self._outlet = outlet
        self.clock = clock
        self.tracing = tracing
        self.hooks = hooks
        self._ledger = ledger_sql.Ledger(participant.ledger, participant.outbox)

    def execute(
        self,
        handler: Handler,
        *,
        message_id: str,
        headers: Mapping[str, Any] | None,
        body: Any,
        redelivered: bool,
        raise_invalid: bool = False,
        sender: str | None = None,
    ) -> str:
        """Handle one delivery; return what happened (for logs and tests).

        A message that makes no sense, or comes from a broker user (``sender``, its AMQP
        ``user_id``) other than the orchestrator's or this participant's own, is counted
        and logged and returns ``"invalid"``, or with ``raise_invalid`` raises
        ``InvalidMessage``: the worker parks it, and the orchestrator's intake keeps it with
        its reason; nothing runs.
        """
        traceparent = (headers or {}).get("traceparent")
        name = f"saga.command {handler.task_name}"
        with self.tracing.span(name, traceparent, **tracing.attributes(headers)):
            engine = self._engine()
            try:
                command, fields = self._read(handler, message_id, headers, body, sender)
            except InvalidMessage as exc:
                invalid.observe(
                    consumer=self.participant.name,
                    reason=exc.reason,
                    queue=self.participant.queue,
                    message_id=message_id,
                    headers=headers,
                )
                if raise_invalid:
                    raise
                return "invalid"
            retries = int((headers or {}).get("saga_retry") or 0)
            fresh = not redelivered and command.attempt == 1 and retries == 0
            probe = self.hooks.command(
                handler.task_name, command, fresh=fresh, retries=retries, fields=fields
            )
            if probe is not None:
                probe.received()
            try:
                with translated(engine.url), engine.begin() as conn:
                    if probe is not None:
                        probe.begun()
                    reply, duplicate = self._handle(conn, handler, command, probe, fields)
                    if probe is not None and not duplicate:
                        probe.before_commit()
            except BusinessRejection as rejection:
                # Rolled back whole, partial writes with it; the refusal in a transaction
                # of its own (a success needs no savepoint, which is two round trips).
                log.info(
                    "%s refused: %s",
                    handler.task_name,
                    rejection.code,
                    extra={**fields, "code": rejection.code},
                )
                with translated(engine.url), engine.begin() as conn:
                    reply, duplicate = self._refuse(conn, handler, command, rejection, fields)
                    if probe is not None and not duplicate:
                        probe.before_commit()
            if duplicate:
                probe = None  # probes follow the first execution of a command only
            if probe is not None:
                probe.committed()
            self._outlet().send(self.participant.outbox, [reply])
            if probe is not None:
                probe.sent(reply, self._publisher())
            return self._handled(handler, reply, duplicate=duplicate, fields=fields)

    def execute_batch(self, commands: Sequence[DeliveredCommand]) -> list[str]:
        """Run first deliveries of several commands in one transaction (group commit), or
        none of them: what each returned, as ``execute`` says it.

        Anything but a success or a duplicate (a refusal, an exception of a handler, a
        message that makes no sense, a refused sender, a command a hook wants to probe,
        the database away) raises and rolls the whole batch back; the caller then runs
        each command alone (``execute``), where it succeeds or fails as it would have.
        So a handler may run more than once before its effect commits, as after any
        crash: only a participant whose handlers touch nothing but its own database says
        ``batch=`` (``Participant``).
        """
        read = []
        for delivered in commands:
            command, fields = self._read(
                delivered.handler,
                delivered.message_id,
                delivered.headers,
                delivered.body,
                delivered.sender,
            )
            if self.hooks.command(
                delivered.handler.task_name, command, fresh=True, retries=0, fields=fields
            ):
                raise Unbatchable(f"a hook probes {delivered.handler.task_name}")
            read.append((delivered.handler, command, fields))
        engine = self._engine()
        done = []
        with translated(engine.url), engine.begin() as conn:
            for handler, command, fields in read:
                name = f"saga.command {handler.task_name}"
                attributes = tracing.attributes(command.headers)
                with self.tracing.span(name, command.traceparent, **attributes):
                    done.append(
                        (handler, fields, *self._handle(conn, handler, command, None, fields))
                    )
        self._outlet().send(self.participant.outbox, [reply for _, _, reply, _ in done])
        return [
            self._handled(handler, reply, duplicate=duplicate, fields=fields)
            for handler, fields, reply, duplicate in done
        ]

    def _read(
        self,
        handler: Handler,
        message_id: str,
        headers: Mapping[str, Any] | None,
        body: Any,
        sender: str | None,
    ) -> tuple[Command, dict[str, Any]]:
        """The command a delivery carries and its log fields; ``SenderRefused`` (counted)
        or ``InvalidMessage`` when it may not run here."""
        refused = self.senders.refusal(
            sender, self.participant.queue, f"command for {handler.task_name}"
        )
        if refused is not None:
            metrics.SENDERS_REFUSED.labels(consumer=self.participant.name).inc()
            raise SenderRefused(refused)
        command = parse_command(message_id, headers, body)
        if command.kind is not handler.kind:
            raise InvalidMessage(f"a {command.kind.value} message reached {handler.task_name}")
        fields = {
            "saga_id": command.saga_id,
            "saga_type": command.headers.get(H_SAGA_TYPE),
            "message_id": message_id,
            "causation_id": command.headers.get(H_CAUSATION_ID),
            "step": command.step,
            "command_id": command.command_id,
            "participant": self.participant.name,
            "correlation_id": command.correlation_id,
            "trace_id": tracing.trace_id(command.traceparent),
        }
        return command, fields

    def _handled(
        self,
        handler: Handler,
        reply: OutboundMessage,
        *,
        duplicate: bool,
        fields: Mapping[str, Any],
    ) -> str:
        """Count and log a command once its transaction committed; what happened."""
        outcome = "duplicate" if duplicate else str(reply.body.get("outcome"))
        metrics.MESSAGES.labels(
            consumer=self.participant.name,
            classification="duplicate" if duplicate else "accepted",
        ).inc()
        # The command's state in the ledger before and after this message.
        after = str(reply.body.get("outcome"))
        before = after if duplicate else "new"
        log.info(
            "%s handled: %s",
            handler.task_name,
            outcome,
            extra={**fields, "status_before": before, "status_after": after},
        )
        return outcome

    def recover_outbox(self, *, min_age: float, batch: int) -> int:
        """Publish this participant's replies whose publish-after-commit did not happen
        (a crash, an outage); the number published. Runs in the participant's own worker,
        on its own database and with its own broker user (``worker.upkeep``)."""
        report = relay(
            self._engine(),
            self.participant.outbox,
            self._publisher(),
            min_age_seconds=min_age,
            batch=batch,
        )
        return report.published

    def forget_redeliveries(self, keep: float) -> int:
        """Drop this participant's redelivery counts untouched for ``keep`` seconds."""
        engine = self._engine()
        before = self.clock.now() - timedelta(seconds=keep)
        with translated(engine.url), engine.begin() as conn:
            return redeliveries.forget(conn, before, self.participant.redelivery)

    def _claim(self, handler: Handler, command: Command) -> ledger_sql.Claim:
        return ledger_sql.Claim(
            command_id=command.command_id,
            saga_id=command.saga_id,
            step=command.step,
            kind=command.kind.value,
            task_name=handler.task_name,
            compensates=command.compensates,
        )

    def _handle(
        self,
        conn: Connection,
        handler: Handler,
        command: Command,
        probe: CommandProbe | None,
        fields: Mapping[str, Any],
    ) -> tuple[OutboundMessage, bool]:
        """Claim, run, store and queue the reply; ``BusinessRejection`` propagates so the
        caller rolls this transaction back and records the refusal in a new one."""
        if not self._ledger.claim(conn, self._claim(handler, command)):
            return self._stored(conn, command, fields), True
        if probe is not None:
            probe.claimed()  # slow work goes here: after the claim, so re-sends wait for it
        now = self.clock.now()
        nothing_to_undo = None
        if handler.kind is MessageKind.COMPENSATION:
            nothing_to_undo = self._undone_before(conn, handler, command, now)
            if nothing_to_undo is None and command.compensates is not None:
                nothing_to_undo = self._forward_never_took_effect(conn, handler, command, now)
        if nothing_to_undo is not None:
            reply = _Reply(Outcome.SUCCESS, {"nothing_to_undo": nothing_to_undo})
        else:
            reply = self._run(conn, handler, command, now, fields)
        message = self._reply_message(command, reply_id_for(command.command_id), reply)
        self._ledger.record_reply(
            conn,
            command.command_id,
            outcome=reply.outcome.value,
            reply=reply.stored(),
            message=message,
        )
        return message, False

    def _refuse(
        self,
        conn: Connection,
        handler: Handler,
        command: Command,
        rejection: BusinessRejection,
        fields: Mapping[str, Any],
    ) -> tuple[OutboundMessage, bool]:
        """Claim the command with its refusal and queue the reply, in one statement.

        Between the rollback and this claim a duplicate delivery may have claimed the
        command (and run it): then its stored reply is the answer, as for any duplicate.
        """
        reply = _Reply(Outcome.FAILURE, None, rejection.code, rejection.message)
        message = self._reply_message(command, reply_id_for(command.command_id), reply)
        claimed = self._ledger.claim_with_reply(
            conn,
            self._claim(handler, command),
            outcome=reply.outcome.value,
            reply=reply.stored(),
            message=message,
        )
        if not claimed:
            return self._stored(conn, command, fields), True
        return message, False

    def _stored(
        self, conn: Connection, command: Command, fields: Mapping[str, Any]
    ) -> OutboundMessage:
        """The reply the ledger holds for a command seen before (or a tombstone's refusal)."""
        row = self._ledger.stored(conn, command.command_id)
        if row.kind == ledger_sql.TOMBSTONE:
            log.warning("command refused: its compensation ran first", extra=dict(fields))
        else:
            log.info("duplicate command: re-sending the stored reply", extra=dict(fields))
        stored = _Reply.from_stored(row.reply)
        return self._reply_message(command, str(row.reply_message_id), stored)

    def _run(
        self,
        conn: Connection,
        handler: Handler,
        command: Command,
        now: datetime,
        fields: Mapping[str, Any],
    ) -> _Reply:
        ctx = CommandContext(conn=conn, command=command, now=now)
        try:
            result = handler(ctx)  # a payload= model is validated here
        except BusinessRejection:
            raise
        except Exception:
            log.exception(
                "%s raised; the transaction is rolled back", handler.task_name, extra=dict(fields)
            )
            raise
        if result is not None and not isinstance(result, Mapping):
            raise TypeError(
                f"{handler.task_name} must return a mapping or None, not {type(result).__name__}"
            )
        return _Reply(Outcome.SUCCESS, dict(result or {}))

    def _undone_before(
        self, conn: Connection, handler: Handler, command: Command, now: datetime
    ) -> str | None:
        """Fence the earlier generations of this compensation; say so if one undid it.

        Each superseded id gets a tombstone unless it was claimed already, so an old
        generation that arrives later runs nothing; one that ran and succeeded means
        the step is undone, and this generation must not undo it twice.
        """
        for superseded in command.supersedes:
            placed = self._tombstone(
                conn,
                command,
                superseded,
                task_name=handler.task_name,
                refusal=(SUPERSEDED, "a newer generation of it was sent"),
                now=now,
            )
            if not placed and self._ledger.outcome(conn, superseded) == Outcome.SUCCESS.value:
                return f"an earlier generation of this compensation ({superseded}) undid it"
        return None

    def _forward_never_took_effect(
        self, conn: Connection, handler: Handler, command: Command, now: datetime
    ) -> str | None:
        """Why there is nothing to undo, or None when the forward command took effect.

        Claims the forward command's ledger key with a tombstone; if the forward
        command is running right now, this waits for it on the key and then sees it.
        """
        forward_id = command.compensates
        assert forward_id is not None
        placed = self._tombstone(
            conn,
            command,
            forward_id,
            task_name=f"{self.participant.name}.{handler.undoes or '?'}",
            refusal=(TOMBSTONED, "the compensation of this command ran before it"),
            now=now,
        )
        if placed:
            return "the forward command never ran here; a tombstone now refuses it"
        if self._ledger.outcome(conn, forward_id) == Outcome.FAILURE.value:
            return "the forward command was refused, so it changed nothing"
        return None

    def _tombstone(
        self,
        conn: Connection,
        command: Command,
        target_id: str,
        *,
        task_name: str,
        refusal: tuple[str, str],
        now: datetime,
    ) -> bool:
        """Claim ``target_id`` with a refusal, so the command it names never runs here;
        False if that id was claimed already (it ran, or is running: this waited for it)."""
        code, text = refusal
        return self._ledger.place_tombstone(
            conn,
            ledger_sql.Claim(
                command_id=target_id,
                saga_id=command.saga_id,
                step=command.step,
                kind=ledger_sql.TOMBSTONE,
                task_name=task_name,
            ),
            reply=_Reply(Outcome.FAILURE, None, code, text).stored(),
            reply_message_id=reply_id_for(target_id),
            outcome=Outcome.FAILURE.value,
            now=now,
        )

    def _reply_message(self, command: Command, reply_id: str, reply: _Reply) -> OutboundMessage:
        return reply_message(
            command,
            reply_id=reply_id,
            reply_queue=REPLY_QUEUE,
            outcome=reply.outcome,
            result=reply.result,
            error_code=reply.error_code,
            error_message=reply.error_message,
        )
