"""Signals (``SignalReceived``): a person's decision on a human step.

The decision becomes the step's result, which later steps and conditions read. A signal
the step does not await is refused with the reason (``ActionRefused``), and nothing is
written; the same decision given twice is a duplicate, so a client may safely retry.
"""

from __future__ import annotations

from saga_tasks.core.decider.progress import advance
from saga_tasks.core.decider.transitions import Transition
from saga_tasks.core.documents import same_json
from saga_tasks.core.events import SignalReceived
from saga_tasks.core.states import ACTIVE_SAGA, FORWARD_SUCCEEDED, Classification, StepStatus
from saga_tasks.errors import ActionRefused


def on_signal(tx: Transition, e: SignalReceived) -> None:
    if not e.actor.strip() or not e.reason.strip():
        raise ActionRefused("a signal needs an actor and a reason")
    s = tx.definition.by_name.get(e.step)
    if s is None:
        known = ", ".join(n for n, x in tx.definition.by_name.items() if x.human is not None)
        raise ActionRefused(f"unknown step {e.step!r}; human steps: {known or 'none'}")
    if s.human is None:
        raise ActionRefused(f"step {e.step!r} waits for its participant, not for a signal")
    st = tx.steps[e.step]
    # The decision taken stays the step's result after the saga moved on (a compensation
    # leaves a person's decision COMPENSATION_SKIPPED): the same one again is a duplicate.
    if st.status in FORWARD_SUCCEEDED and same_json(st.result or {}, e.data):
        tx.classification = Classification.DUPLICATE
        tx.note("duplicate_signal", step=e.step, reason=f"by {e.actor}: the same decision again")
        return
    if st.status is not StepStatus.REQUESTED or tx.status not in ACTIVE_SAGA:
        hint = "; retry the step to wait again" if st.status is StepStatus.TIMED_OUT else ""
        raise ActionRefused(
            f"step {e.step!r} does not wait for a signal: it is {st.status.value} and the "
            f"saga {tx.status.value}{hint}"
        )
    tx.set_step(
        e.step,
        st.evolve(
            status=StepStatus.SUCCEEDED,
            finished_at=tx.now,
            result=dict(e.data),
            deadline=None,
            error=None,
        ),
        "step_signalled",
        reason=f"person {e.actor}: {e.reason}",
        detail={"actor": e.actor, "fields": sorted(e.data)},
    )
    advance(tx, trigger="")
