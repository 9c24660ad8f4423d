"""Replay: what a held message (a dead letter kept for a person) is to its saga if it is
published again."""

from __future__ import annotations

from saga_tasks.core.decider.commands import fence_id
from saga_tasks.core.model import FENCE_FAILED, LATE_FAILURE, LATE_SUCCESS, SagaState, StepState
from saga_tasks.core.states import TERMINAL_SAGA, MessageKind, SagaStatus, StepStatus

_FORWARD_ONLY = (
    StepStatus.PENDING,
    StepStatus.REQUESTED,
    StepStatus.SUCCEEDED,
    StepStatus.TIMED_OUT,
    StepStatus.FAILED,
)
"""Step statuses that tell no compensation has begun."""


def replay_awaits(
    state: SagaState, step: str | None, kind: MessageKind | None, cid: str | None
) -> str | None:
    """What a held message of ``state`` is to the saga if published again: ``"in flight"``
    (its step awaits it now), ``"a dead compensation"``, ``"a given-up command"`` or ``"a
    fence"`` (awaited again once replayed), or None (the step has moved on). The replay
    checks and the decider's replay both ask this, so they cannot disagree."""
    st = state.steps.get(step or "")
    if st is None or state.status in TERMINAL_SAGA or kind is None:
        return None
    if kind is MessageKind.COMMAND and cid in (None, st.command_id):
        return _command_awaits(state, st)
    if kind is MessageKind.COMPENSATION:
        return _compensation_awaits(state, step or "", st, cid)
    return None


def _command_awaits(state: SagaState, st: StepState) -> str | None:
    if st.status is StepStatus.REQUESTED:
        return "in flight"
    # (A step not taken is SKIPPED by its condition, not by a compensation.)
    compensation_begun = any(
        x.status not in _FORWARD_ONLY and not x.not_taken for x in state.steps.values()
    )
    if (
        st.status is StepStatus.TIMED_OUT
        and st.error not in (LATE_SUCCESS, LATE_FAILURE)
        and state.status in (SagaStatus.RUNNING, SagaStatus.MANUAL_REVIEW)
        and not compensation_begun
    ):
        return "a given-up command"
    return None


def _compensation_awaits(state: SagaState, step: str, st: StepState, cid: str | None) -> str | None:
    if cid in (None, st.compensation_id):
        if st.status is StepStatus.COMPENSATING:
            return "in flight"
        if st.status is StepStatus.COMPENSATION_FAILED and st.error == "dead_lettered":
            return "a dead compensation"
    if cid == fence_id(state, step, st) and st.status is StepStatus.SUCCEEDED:
        if st.fencing:
            return "in flight"
        if st.error == FENCE_FAILED:
            return "a fence"
    return None
