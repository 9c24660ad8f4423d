"""Operators replay or discard held messages.

A replay first runs the checks an incident review asks for (the saga's state, the
message's kind and age, its failure reason and death count, whether it is a duplicate
or late, whether its effect already happened) and refuses when one fails, unless forced
with a reason of its own. A replay publishes the stored message again under its own
message id, so consumers deduplicate: replaying twice has one effect.

A command or compensation replayed to a queue under flow control goes out at once, as an
operator's re-send does, and takes its step's place there (``core.capacity.takes_place``):
the step gave its place back when it was given up or its compensation died, and the
replay, which does not pass through the outbox, must count in flight until it answers.
"""

from __future__ import annotations

import base64
import json
import logging
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from sqlalchemy import Connection, Engine, Table

from saga_tasks.core import capacity
from saga_tasks.core.clock import Clock
from saga_tasks.core.decider import replay_awaits
from saga_tasks.core.events import OperatorAction, OperatorVerb
from saga_tasks.core.gate import TaskGate
from saga_tasks.core.messages import H_COMMAND_ID, OutboundMessage
from saga_tasks.core.model import SagaState
from saga_tasks.core.senders import H_SENT_BY, publisher
from saga_tasks.core.states import TERMINAL_SAGA, MessageKind
from saga_tasks.errors import ActionRefused, ConfigurationError, InputError, ServiceUnavailable
from saga_tasks.messaging.publisher import Publisher
from saga_tasks.persistence import dispatch, sagas
from saga_tasks.persistence import held as held_sql
from saga_tasks.persistence.db import translated
from saga_tasks.persistence.tables import saga_outbox
from saga_tasks.runtime.holding import (
    DEAD_LETTER,
    H_REPLAYED_FROM,
    H_STORED_ESCAPED,
    PARKING,
    POISON,
    clean_headers,
    header_count,
)
from saga_tasks.runtime.outlet import deliver

log = logging.getLogger("saga_tasks.runtime.replay")


class ActIn(Protocol):
    """The orchestrator's operator action inside the caller's transaction."""

    def __call__(
        self,
        conn: Connection,
        saga_id: str,
        action: OperatorAction,
        *,
        expect_version: int | None,
    ) -> tuple[list[OutboundMessage], SagaState]: ...


@dataclass(frozen=True)
class Check:
    """One replay pre-check: what was looked at, what was found, whether it blocks."""

    name: str
    finding: str
    blocks: bool
    final: bool = False
    """No force overrides it: the message would be refused wherever it went."""


@dataclass(frozen=True)
class ReplayResult:
    held_id: int
    replayed: bool
    forced: bool
    checks: Sequence[Check]


class Replayer:
    """Replays and discards held messages, on record, after the checks."""

    def __init__(
        self,
        *,
        engine: Callable[[], Engine],
        publisher: Callable[[], Publisher],
        act_in: ActIn,
        ledgers: Mapping[str, tuple[Callable[[], Engine], Table]],
        max_age: float,
        clock: Clock,
        gate: TaskGate | None = None,
        limited: Collection[str] = (),
    ) -> None:
        self.limited = frozenset(limited)
        """The command queues under flow control: a replay to one takes its step's place."""
        self.gate = gate
        """Which task runs on which queue: a replay the worker would refuse is refused."""
        self._engine = engine
        self._publisher = publisher
        self._act_in = act_in
        self.ledgers = ledgers
        """Each participant's database and command ledger by name (the effect check)."""
        self.max_age = max_age
        self.clock = clock

    def checks(self, conn: Connection, row: Mapping[str, Any]) -> list[Check]:
        """The checks a replay must pass; see the module docstring."""
        checks: list[Check] = []
        if row["status"] != "pending":
            checks.append(
                Check(
                    "status",
                    f"already {row['status']} by {row['resolved_by']} at {row['resolved_at']}",
                    True,
                )
            )
        checks.append(Check("failure", f"held because: {row['reason']}", False))
        sent_by = publisher(row.get("published_by"))
        if row.get("attested", True) is False:
            checks.append(
                Check(
                    "sender",
                    f"not attested: published by {sent_by}, which may not speak for its step "
                    "(the broker did not dead-letter it from a service's message, and no "
                    "service held it); it moved no saga: check what it claims, then force",
                    True,
                )
            )
        else:
            checks.append(Check("sender", f"published by {sent_by}", False))
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
        elif self.gate is not None:
            checks.append(self._task(row))
        if row["holding"] == PARKING:
            checks.append(
                Check(
                    "parked", "a parked message made no sense once; fix the cause, then force", True
                )
            )
        age = (self.clock.now() - row["received_at"]).total_seconds()
        checks.append(Check("age", f"held for {age / 3600:.1f} h", age > self.max_age))
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
            seen = held_sql.reply_applied(conn, row["message_id"])
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
            checks.append(self._effect(conn, row["task_name"], command_id))
        return checks

    def _task(self, row: Mapping[str, Any]) -> Check:
        """Whether the worker of its queue would run it at all (``core.gate``): a replay
        goes out as the operator's process, so it must not carry what no worker runs."""
        assert self.gate is not None
        queue = row["original_queue"]
        refused = self.gate.refusal(queue, row["headers"] or {}, _decoded(row))
        if refused is not None:
            finding = f"the worker of {queue} would refuse it: {refused}"
            return Check("task", finding, True, final=True)
        return Check("task", f"{queue} runs {row['task_name']}", False)

    def _effect(self, conn: Connection, task_name: str | None, command_id: str | None) -> Check:
        """What the participant that owns the task recorded for the command, asked in its
        own database (``SAGA_PARTICIPANT_DATABASE_URL``); a participant whose database
        cannot be asked from here is said so, and does not block the replay: its ledger
        refuses a command it ran already. In the orchestrator's own database it is asked
        on ``conn``: a second connection from the pool ``conn`` came from would wait on
        every other reader doing the same."""
        owner = task_name.split(".", 1)[0] if task_name else None
        found = self.ledgers.get(owner or "")
        if found is None or not command_id:
            return Check("effect", "the participant has no record of it", False)
        engine_of, ledger = found
        try:
            engine = engine_of()
            if engine is conn.engine:
                with translated(engine.url):
                    done = held_sql.executed(conn, ledger, command_id)
            else:
                with translated(engine.url), engine.connect() as own:
                    done = held_sql.executed(own, ledger, command_id)
        except (ServiceUnavailable, ConfigurationError, InputError) as exc:
            return Check("effect", f"{owner}'s ledger could not be asked from here: {exc}", False)
        if done:
            return Check("effect", f"the participant already executed it ({done})", True)
        return Check("effect", "the participant has no record of it", False)

    def replay(
        self,
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
        engine = self._engine()
        with translated(engine.url), engine.begin() as conn:
            row = held_sql.get(conn, held_id, lock=True)
            checks = self.checks(conn, row)
            blocking = [c for c in checks if c.blocks]
            final = [c for c in blocking if c.final]
            stopping = final if force else blocking
            refused = "; ".join(c.finding for c in stopping) if stopping else None
            messages: list[OutboundMessage] = []
            if refused is None:
                said = reason if not force else f"{reason}; forced: {force_reason}"
                if row["saga_id"] is not None and sagas.load(conn, str(row["saga_id"])) is not None:
                    action = OperatorAction(
                        OperatorVerb.REPLAY,
                        actor,
                        f"held message {held_id}: {said}",
                        step=row["step"],
                        message_kind=_kind(row["kind"]),
                        command_id=(row["headers"] or {}).get(H_COMMAND_ID),
                    )
                    messages, after = self._act_in(
                        conn, str(row["saga_id"]), action, expect_version=expect_version
                    )
                    self._take_place(conn, row, after)
                self._publish_held(conn, row, actor=actor, said=said)
        if refused is not None:
            with translated(engine.url), engine.begin() as conn:
                held_sql.note(
                    conn,
                    row,
                    "replay_refused",
                    at=self.clock.now(),
                    actor=actor,
                    reason=f"{reason}; refused: {refused}",
                )
            raise ActionRefused(f"replay refused: {refused}")
        if messages:
            deliver(engine, saga_outbox, self._publisher(), messages)
        log.warning(
            "held message %s replayed by %s%s", held_id, actor, " (forced)" if force else "",
            extra={"saga_id": row["saga_id"], "message_id": row["message_id"]},
        )  # fmt: skip
        return ReplayResult(held_id, True, bool(blocking), checks)

    def _take_place(self, conn: Connection, row: Mapping[str, Any], after: SagaState) -> None:
        """Count a replayed command or compensation in flight at its queue, if it has a
        limit and the replay left the step awaiting it (see the module docstring)."""
        kind, step, queue = row["kind"], row["step"], row["original_queue"]
        commands = (MessageKind.COMMAND.value, MessageKind.COMPENSATION.value)
        if kind not in commands or not step or not row["task_name"]:
            return
        if not capacity.takes_place(self.limited, queue, after, step):
            return
        decoded = _decoded(row)  # a task message: [args, kwargs, embed]
        kwargs = decoded[1] if isinstance(decoded, list) and len(decoded) == 3 else None
        message = OutboundMessage(
            message_id=_uuid_or_new(row["message_id"]),
            task_name=row["task_name"],
            queue=queue,
            headers=row["headers"] or {},
            body=kwargs if isinstance(kwargs, dict) else {},
            saga_id=after.saga_id,
            routing_key=queue,
        )
        dispatch.take_place(conn, message, step, now=self.clock.now())

    def _publish_held(
        self, conn: Connection, row: Mapping[str, Any], *, actor: str, said: str
    ) -> None:
        held_id = row["id"]
        body = base64.b64decode(row["body"]) if row["body_base64"] else (row["body"] or "").encode()
        # Sent again as the operator's process: it vouches for the message now.
        headers = {
            **{k: v for k, v in clean_headers(row["headers"]).items() if k != H_SENT_BY},
            H_REPLAYED_FROM: str(held_id),
        }
        self._publisher().publish_raw(
            exchange="",
            routing_key=row["original_queue"],
            body=body,
            headers=headers,
            content_type=row["content_type"],
            content_encoding=row["content_encoding"],
        )
        held_sql.resolve(
            conn, held_id, status="replayed", at=self.clock.now(), actor=actor, resolution=said
        )

    def discard(self, held_id: int, *, actor: str, reason: str) -> None:
        """Close a held message without sending it; the decision stays on record."""
        _need(actor, reason)
        engine = self._engine()
        with translated(engine.url), engine.begin() as conn:
            row = held_sql.get(conn, held_id, lock=True)
            if row["status"] != "pending":
                raise ActionRefused(f"held message {held_id} is already {row['status']}")
            now = self.clock.now()
            held_sql.resolve(
                conn, held_id, status="discarded", at=now, actor=actor, resolution=reason
            )
            said = f"held message {held_id} discarded: {reason}"
            held_sql.note(conn, row, "operator_discard", at=now, actor=actor, reason=said)


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
    retries = header_count((row["headers"] or {}).get("saga_retry"))
    if reason.startswith("retries exhausted"):
        return Check(
            "deaths",
            f"not poison: its {retries} retries were spent ({reason}); a replay is one more try",
            False,
        )
    return Check("deaths", f"not poison: dead-lettered {deaths} times ({reason})", False)


def _decoded(row: Mapping[str, Any]) -> Any:
    """A held message's body as a worker would decode it (JSON); None when it is not."""
    if row["body_base64"] or "json" not in str(row["content_type"] or ""):
        return None
    try:
        return json.loads(row["body"] or "")
    except ValueError:
        return None


def _uuid_or_new(value: Any) -> str:
    """The held message's id as its dispatch row's key, or a new one if it is no UUID."""
    try:
        return str(uuid.UUID(str(value)))
    except ValueError:
        return str(uuid.uuid4())


def _need(actor: str, reason: str) -> None:
    if not actor.strip() or not reason.strip():
        raise InputError("an operator action needs --actor and --reason")


def _kind(value: Any) -> MessageKind | None:
    try:
        return MessageKind(value)
    except ValueError:
        return None
