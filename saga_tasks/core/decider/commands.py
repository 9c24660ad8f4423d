"""The commands a decision sends for a step, and their ids over the step's generations.

A step has three kinds of command: its forward action, its compensation, and the fence
(the compensation sent when the step is done by hand while its command was in flight).
Ids derive from the saga, the step and its generation, so a re-send keeps its command
id, and an operator's retry that needs a command run afresh moves to a new generation
whose compensation names the ids of the earlier ones as superseded.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from enum import Enum
from typing import Any

from saga_tasks.core.decider.decision import CommandIntent
from saga_tasks.core.decider.transitions import Transition
from saga_tasks.core.definitions import Step
from saga_tasks.core.messages import MAX_GENERATIONS
from saga_tasks.core.model import ESCALATED, SagaState, StepState, command_id, message_id
from saga_tasks.core.states import MessageKind, StepStatus
from saga_tasks.errors import ActionRefused

UNANSWERED_COMPENSATION = frozenset({"no_answer", "dead_lettered"})
"""Errors of a compensation given up without an answer: a success later completes it."""


class Send(Enum):
    """Which of a step's commands ``send`` sends."""

    FORWARD = "forward"
    COMPENSATION = "compensation"
    FENCE = "fence"
    """The compensation that fences the command of a step done by hand. It takes the
    compensation id of the step's current generation and moves the step to the next one,
    so a later compensation of the step is a new command."""


_HISTORY_EVENTS = {
    Send.FORWARD: ("step_requested", "step_resent"),
    Send.COMPENSATION: ("compensation_requested", "compensation_resent"),
    Send.FENCE: ("fence_requested", "fence_resent"),
}
"""The history event of a first send and of a re-send (one with a reason)."""


def send(tx: Transition, s: Step, st: StepState, what: Send, reason: str | None = None) -> None:
    """Send (again) one of the step's commands: the step awaits its answer until a new
    deadline, and a re-send keeps the command id under a new message id."""
    saga = tx.before
    if s.human is not None:
        _await_signal(tx, s, st, reason)
        return
    saga_id = saga.saga_id
    compensates: str | None = None
    supersedes: tuple[str, ...] = ()
    if what is Send.FORWARD:
        kind, task = MessageKind.COMMAND, s.action
        generation = st.generation
        cid = st.command_id or command_id(saga, s.name, kind, generation)
        attempt = st.attempt + 1
        new = st.evolve(status=StepStatus.REQUESTED, attempt=attempt, command_id=cid)
    else:
        assert s.compensation is not None
        kind, task = MessageKind.COMPENSATION, s.compensation
        attempt = st.compensation_attempt + 1
        if what is Send.COMPENSATION:
            generation = st.generation
            cid = st.compensation_id or command_id(saga, s.name, kind, generation)
            new = st.evolve(
                status=StepStatus.COMPENSATING,
                error=None,
                compensation_attempt=attempt,
                compensation_id=cid,
            )
        else:
            # A re-sent fence has already moved the step on: it keeps the id it had.
            generation = st.generation if st.compensation_attempt == 0 else st.generation - 1
            cid = command_id(saga, s.name, kind, generation)
            new = st.evolve(
                generation=generation + 1, compensation_id=None, compensation_attempt=attempt
            )
        compensates = st.command_id
        supersedes = tuple(command_id(saga, s.name, kind, g) for g in range(1, generation))
    new = new.evolve(requested_at=tx.now, deadline=tx.now + attempt_wait(s, what, attempt, cid))
    tx.set_step(
        s.name,
        new,
        _HISTORY_EVENTS[what][1 if reason else 0],
        reason=reason,
        detail={"attempt": attempt},
    )
    tx.emit(
        CommandIntent(
            saga_id=saga_id,
            step=s.name,
            kind=kind,
            task_name=task,
            queue=s.queue,
            command_id=cid,
            message_id=message_id(saga, s.name, kind, generation, attempt),
            attempt=attempt,
            body=_body(tx),
            compensates=compensates,
            supersedes=supersedes,
        )
    )


def _await_signal(tx: Transition, s: Step, st: StepState, reason: str | None) -> None:
    """A human step sends nothing: it waits for a person's signal until its deadline,
    with a first wake-up at its escalation."""
    assert s.human is not None
    final = tx.now + s.timeout
    escalate = s.human.escalate_after
    wake = tx.now + escalate if escalate is not None and escalate < s.timeout else final
    tx.set_step(
        s.name,
        st.evolve(
            status=StepStatus.REQUESTED,
            attempt=st.attempt + 1,
            requested_at=tx.now,
            deadline=wake,
            finished_at=None,
            error=None,
            given_up=False,
        ),
        "signal_awaited",
        reason=reason,
        detail={"decide_by": final.isoformat(), "escalate_at": wake.isoformat()}
        if wake != final
        else {"decide_by": final.isoformat()},
    )


def decide_by(s: Step, st: StepState) -> datetime:
    """When a waiting human step's decision is due: its deadline once escalated (or with no
    escalation); before that, the escalation plus what the step's timeout leaves after it.
    It follows the deadline, not ``requested_at``: time in review moves the deadline on."""
    assert s.human is not None and st.deadline is not None
    escalate = s.human.escalate_after
    if st.error == ESCALATED or escalate is None or escalate >= s.timeout:
        return st.deadline
    return st.deadline + (s.timeout - escalate)


def attempt_wait(s: Step, what: Send, attempt: int, cid: str) -> timedelta:
    """How long attempt ``attempt`` of one of the step's commands waits for its answer."""
    policy = s.retry if what is Send.FORWARD else s.compensation_retry
    return policy.wait(s.timeout, attempt, cid)


def current_wait(saga: SagaState, s: Step, st: StepState) -> timedelta:
    """How long the step's latest command (forward, compensation or fence) waits for its
    answer: what ``send`` gave it."""
    if st.fencing:
        return attempt_wait(s, Send.FENCE, st.compensation_attempt, fence_id(saga, s.name, st))
    if st.status is StepStatus.COMPENSATING:
        return attempt_wait(s, Send.COMPENSATION, st.compensation_attempt, st.compensation_id or "")
    return attempt_wait(s, Send.FORWARD, st.attempt, st.command_id or "")


def _body(tx: Transition) -> dict[str, Any]:
    results = {n: dict(st.result) for n, st in tx.steps.items() if st.result is not None}
    return {"saga_payload": dict(tx.before.payload), "results": results}


def next_generation(st: StepState, *, forward: bool = False) -> StepState:
    """The step's next generation: its compensation (and with ``forward`` its command)
    gets a new id, which the participant runs afresh."""
    if st.generation >= MAX_GENERATIONS:
        raise ActionRefused(
            f"the step was retried {st.generation} times, the most a command may name as "
            "superseded; resolve the saga"
        )
    new = st.evolve(generation=st.generation + 1, compensation_id=None, compensation_attempt=0)
    if forward:
        new = new.evolve(command_id=None, attempt=0, error=None, result=None)
    return new


def superseded(
    saga: SagaState, step: str, kind: MessageKind, cid: str, st: StepState
) -> int | None:
    """The earlier generation whose id ``cid`` is, or None when it is no id of ours."""
    for generation in range(1, st.generation):
        if cid == command_id(saga, step, kind, generation):
            return generation
    return None


def fence_id(saga: SagaState, step: str, st: StepState) -> str:
    """The id of the fence a step done by hand sent (or would have sent): the compensation
    id of the generation before the step's current one."""
    return command_id(saga, step, MessageKind.COMPENSATION, st.generation - 1)
