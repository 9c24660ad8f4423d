"""Technical faults for demos and tests, asked for in a saga payload, injected through
the runtime's hooks (``DemoFaults``, which the example app installs).

A payload may carry ``"demo_faults": {"<where>": "<fault>"}``. Starting such a saga
is refused, and workers ignore the field, unless ``SAGA_TASKS_DEMO_FAULTS=1`` is set
for the process: a payload can never crash a production worker. ``<where>`` is

- a participant task (``inventory.reserve``): the fault acts on the first execution
  of the command, never on a duplicate or a redelivery;
- ``saga_tasks.reply@<step>``: the orchestrator, on the first delivery of that step's
  reply (``crash_after_commit``: commands committed, not published; ``crash_after_publish``:
  published, not acknowledged);
- ``saga_tasks.relay``: outbox recovery, once per saga (``crash_after_publish``:
  published, not marked published); the history records that it fired.

So a redelivery after the crash a fault causes runs normally: that is what the
recovery paths are shown on.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from sqlalchemy import Engine

from saga_tasks.core.clock import Clock
from saga_tasks.core.messages import Command, OutboundMessage
from saga_tasks.core.model import SagaState
from saga_tasks.errors import BusinessRejection, InvalidPayload, TransientError
from saga_tasks.messaging.publisher import Publisher
from saga_tasks.persistence import sagas
from saga_tasks.runtime.hooks import CommandProbe, Hooks, ReplyProbe
from saga_tasks.runtime.outlet import AfterPublish

FIELD = "demo_faults"
log = logging.getLogger("participants.faults")
ENABLE = "SAGA_TASKS_DEMO_FAULTS"


class FaultKind(StrEnum):
    CRASH_BEFORE_COMMIT = "crash_before_commit"
    """SIGKILL the worker process inside the transaction: nothing is written."""
    CRASH_AFTER_COMMIT = "crash_after_commit"
    """SIGKILL after commit, before the reply is published: only the outbox has it."""
    SLOW = "slow"
    """``slow:<seconds>``: the work takes that long, so the reply comes late."""
    DUPLICATE_REPLY = "duplicate_reply"
    """Publish the reply twice."""
    RAISE = "raise"
    """Raise an unexpected exception on every try of the command's first send."""
    CRASH_AFTER_PUBLISH = "crash_after_publish"
    """SIGKILL after publishing, before the ack or the outbox mark."""
    TRANSIENT = "transient"
    """``transient:<n>``: raise ``TransientError`` on the first n tries (retries included)."""
    POISON = "poison"
    """SIGKILL the worker on every delivery, redeliveries and retries included."""
    REFUSE = "refuse"
    """A business refusal of the command's first generation; an operator's retry (a new
    generation, which names the first as superseded) runs."""


RELAY = "saga_tasks.relay"


def reply_key(step: str) -> str:
    return f"saga_tasks.reply@{step}"


@dataclass(frozen=True)
class Fault:
    kind: FaultKind
    seconds: float = 0.0


def parse(spec: str) -> Fault:
    name, _, arg = spec.partition(":")
    try:
        kind = FaultKind(name)
    except ValueError:
        valid = ", ".join(k.value for k in FaultKind)
        raise ValueError(f"unknown fault {name!r}; expected one of {valid}") from None
    if kind is FaultKind.TRANSIENT:
        try:
            count = int(arg)
        except ValueError:
            raise ValueError("transient needs a count, e.g. 'transient:2'") from None
        if not 1 <= count <= 100:
            raise ValueError("transient takes between 1 and 100 tries")
        return Fault(kind, float(count))
    if kind is FaultKind.SLOW:
        try:
            seconds = float(arg)
        except ValueError:
            raise ValueError("slow needs seconds, e.g. 'slow:2.5'") from None
        if not 0 < seconds <= 600:
            raise ValueError("slow takes between 0 and 600 seconds")
        return Fault(kind, seconds)
    if arg:
        raise ValueError(f"fault {name!r} takes no argument")
    return Fault(kind)


def validate_payload_faults(payload: Mapping[str, Any], enabled: bool) -> None:
    """Refuse a start whose payload asks for faults the deployment does not allow."""
    spec = payload.get(FIELD)
    if spec is None:
        return
    if not enabled:
        raise InvalidPayload(f"{FIELD} is accepted only when {ENABLE}=1")
    if not isinstance(spec, Mapping):
        raise InvalidPayload(f"{FIELD} must map task names to faults")
    for task, fault in spec.items():
        if not isinstance(fault, str):
            raise InvalidPayload(f"{FIELD}.{task}: fault must be a string")
        try:
            parse(fault)
        except ValueError as exc:
            raise InvalidPayload(f"{FIELD}.{task}: {exc}") from None


def fault_for(payload: Mapping[str, Any], task_name: str, enabled: bool) -> Fault | None:
    if not enabled:
        return None
    spec = payload.get(FIELD)
    if not isinstance(spec, Mapping) or task_name not in spec:
        return None
    try:
        return parse(str(spec[task_name]))
    except ValueError:
        return None


def crash(reason: str, **fields: Any) -> None:
    """Die the way an OOM kill or a power cut does: no cleanup, no ack."""
    log.warning("demo fault: SIGKILL %s", reason, extra=fields)
    for handler in logging.getLogger().handlers:
        handler.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def pause(seconds: float) -> None:
    time.sleep(seconds)


def relay_crash_hook(engine: Engine, clock: Clock) -> AfterPublish:
    """The ``saga_tasks.relay`` fault: outbox recovery dies after publishing, before
    marking, once per saga (its history says so first)."""

    def after_publish(published: Sequence[OutboundMessage]) -> None:
        saga_ids = sorted({m.saga_id for m in published if m.saga_id})
        if not saga_ids:
            return
        with engine.connect() as conn:
            for saga_id, payload in sagas.payloads(conn, saga_ids):
                fault = fault_for(payload, RELAY, enabled=True)
                if fault is None or fault.kind is not FaultKind.CRASH_AFTER_PUBLISH:
                    continue
                if sagas.has_event(conn, saga_id, "demo_fault"):
                    continue
                sagas.append_note_if_exists(
                    conn,
                    saga_id,
                    event="demo_fault",
                    reason="outbox recovery killed after publishing, before marking published",
                    message_id=None,
                    now=clock.now(),
                )
                conn.commit()
                crash("outbox recovery after publishing, before marking", saga_id=saga_id)

    return after_publish


def enabled_in(environ: Mapping[str, str]) -> bool:
    return environ.get(ENABLE, "").strip().lower() in ("1", "true", "yes", "on")


class DemoFaults(Hooks):
    """The payload's faults, acted on at the runtime's hook points when ``enabled``."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> DemoFaults:
        return cls(enabled_in(os.environ if environ is None else environ))

    def starting(self, saga_type: str, payload: Mapping[str, Any]) -> None:
        validate_payload_faults(payload, self.enabled)

    def command(
        self, task_name: str, command: Command, *, fresh: bool, retries: int,
        fields: Mapping[str, Any],
    ) -> CommandProbe | None:  # fmt: skip
        fault = fault_for(command.payload, task_name, self.enabled)
        if fault is None:
            return None
        return _CommandFault(
            fault,
            task_name=task_name,
            command=command,
            fresh=fresh,
            retries=retries,
            fields=fields,
        )

    def reply(self, state: SagaState, step: str, fields: Mapping[str, Any]) -> ReplyProbe | None:
        fault = fault_for(state.payload, reply_key(step), self.enabled)
        return None if fault is None else _ReplyFault(fault, fields)

    def relay(self, engine: Engine, clock: Clock) -> AfterPublish | None:
        return relay_crash_hook(engine, clock) if self.enabled else None


class _CommandFault:
    """A fault acts on the first execution of a command only, except poison (every
    delivery) and transient (its first n tries, retries counted)."""

    def __init__(
        self,
        fault: Fault,
        *,
        task_name: str,
        command: Command,
        fresh: bool,
        retries: int,
        fields: Mapping[str, Any],
    ) -> None:
        self.fault: Fault | None = fault
        self.task_name = task_name
        self.command = command
        self.fresh = fresh
        self.retries = retries
        self.fields = dict(fields)

    def _is(self, kind: FaultKind) -> bool:
        return self.fault is not None and self.fault.kind is kind

    def received(self) -> None:
        fault = self.fault
        if fault is None:
            return
        if fault.kind is FaultKind.POISON:
            crash("poison: every delivery", **self.fields)
        if fault.kind is FaultKind.TRANSIENT:
            if self.command.attempt == 1 and self.retries < fault.seconds:
                raise TransientError(f"demo fault: transient failure {self.retries + 1}")
            self.fault = None
        elif fault.kind is FaultKind.RAISE:
            if self.command.attempt == 1:
                raise RuntimeError(f"demo fault in {self.task_name}")
            self.fault = None
        elif not self.fresh:
            self.fault = None

    def begun(self) -> None:
        if self._is(FaultKind.REFUSE):
            if not self.command.supersedes:
                raise BusinessRejection("demo_refusal", "refused by a demo fault")
            self.fault = None

    def claimed(self) -> None:
        if self.fault is not None and self.fault.kind is FaultKind.SLOW:
            pause(self.fault.seconds)

    def before_commit(self) -> None:
        if self._is(FaultKind.CRASH_BEFORE_COMMIT):
            crash("inside the transaction, before commit", **self.fields)

    def committed(self) -> None:
        if self._is(FaultKind.CRASH_AFTER_COMMIT):
            crash("after commit, before the reply is published", **self.fields)

    def sent(self, reply: OutboundMessage, publisher: Publisher) -> None:
        if self._is(FaultKind.DUPLICATE_REPLY):
            publisher.publish([reply])


class _ReplyFault:
    def __init__(self, fault: Fault, fields: Mapping[str, Any]) -> None:
        self.fault = fault
        self.fields = dict(fields)

    def committed(self) -> None:
        if self.fault.kind is FaultKind.CRASH_AFTER_COMMIT:
            crash("orchestrator after commit, before publishing", **self.fields)

    def sent(self, flush: Callable[[float], bool]) -> None:
        if self.fault.kind is FaultKind.CRASH_AFTER_PUBLISH:
            flush(5.0)  # the crash point is after the broker has the messages
            crash("orchestrator after publishing, before the ack", **self.fields)
