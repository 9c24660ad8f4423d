"""Saga and step statuses, and the groups the rest of the code reasons with."""

from __future__ import annotations

from enum import StrEnum


class SagaStatus(StrEnum):
    """Where a saga is. ``MANUAL_REVIEW`` is neither active nor terminal: it waits for a person."""

    RUNNING = "RUNNING"
    COMPENSATING = "COMPENSATING"
    COMPLETED = "COMPLETED"
    COMPENSATED = "COMPENSATED"
    MANUAL_REVIEW = "MANUAL_REVIEW"
    FAILED = "FAILED"


ACTIVE_SAGA = frozenset({SagaStatus.RUNNING, SagaStatus.COMPENSATING})
TERMINAL_SAGA = frozenset({SagaStatus.COMPLETED, SagaStatus.COMPENSATED, SagaStatus.FAILED})


class StepStatus(StrEnum):
    """Where one step is.

    ``SKIPPED``: never dispatched because the saga failed first.
    ``COMPENSATION_SKIPPED``: succeeded, and has no compensation, so it stays done.
    ``COMPENSATION_FAILED``: the participant refused to undo it, or never answered; the
    saga needs a person.
    ``TIMED_OUT``: given up after its attempts, outcome unknown, and by its late-reply
    policy not compensated.
    """

    PENDING = "PENDING"
    REQUESTED = "REQUESTED"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    COMPENSATING = "COMPENSATING"
    COMPENSATED = "COMPENSATED"
    COMPENSATION_FAILED = "COMPENSATION_FAILED"
    COMPENSATION_SKIPPED = "COMPENSATION_SKIPPED"
    SKIPPED = "SKIPPED"
    TIMED_OUT = "TIMED_OUT"


# The forward action is known to have taken effect.
FORWARD_SUCCEEDED = frozenset(
    {
        StepStatus.SUCCEEDED,
        StepStatus.COMPENSATING,
        StepStatus.COMPENSATED,
        StepStatus.COMPENSATION_FAILED,
        StepStatus.COMPENSATION_SKIPPED,
    }
)
# A message is out for this step and its answer is awaited.
IN_FLIGHT = frozenset({StepStatus.REQUESTED, StepStatus.COMPENSATING})


def saga_status(value: str) -> SagaStatus:
    """Parse a status given by a person, with the list of valid ones in the error."""
    try:
        return SagaStatus(value.upper())
    except ValueError:
        valid = ", ".join(s.value for s in SagaStatus)
        raise ValueError(f"unknown status {value!r}; expected one of {valid}") from None


class MessageKind(StrEnum):
    """The kinds of message that travel between the orchestrator and participants."""

    COMMAND = "command"
    COMPENSATION = "compensation"
    REPLY = "reply"


class Outcome(StrEnum):
    """What a participant says of a command."""

    SUCCESS = "success"
    FAILURE = "failure"


class Classification(StrEnum):
    """How the decider classified an event; every value has a history entry."""

    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"
    LATE = "late"
    CONFLICTING = "conflicting"
    INVALID = "invalid"
