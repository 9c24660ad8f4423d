"""The state of one saga as immutable values: what the decider reads and returns.

Persistence maps these to rows; nothing here knows about SQL or messages on the wire.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from saga_tasks.core.definitions import SagaDefinition
from saga_tasks.core.states import ACTIVE_SAGA, IN_FLIGHT, MessageKind, SagaStatus, StepStatus

# Every id the decider makes is derived from the saga, so deciding twice on the same
# input (a redelivered message after a crash) makes the same ids again. The derivation
# is keyed by the saga's own secret (``SagaState.id_key``, drawn at its start and kept in
# its row): the saga id is public (URLs, logs, the dashboard), and an id anyone could
# compute from it would let whoever can publish a reply answer for a step.
_ID_NAMESPACE = uuid.UUID("8d3c2a51-4a8e-4e39-9a55-6d1b3f0c7e21")


def new_id_key() -> str:
    """A saga's secret for its ids: 128 random bits, hex."""
    return secrets.token_hex(16)


def _derived(key: str | None, name: str) -> str:
    if key is None:  # a saga started before ids were keyed keeps its ids
        return str(uuid.uuid5(_ID_NAMESPACE, name))
    digest = hmac.new(bytes.fromhex(key), name.encode(), hashlib.sha256).digest()
    return str(uuid.UUID(bytes=digest[:16], version=4))


def command_id(saga: SagaState, step: str, kind: MessageKind, generation: int) -> str:
    """The id a participant deduplicates on; the same for every re-send of one command."""
    name = f"{saga.saga_id}/{step}/{kind.value}/{generation}/command"
    return _derived(saga.id_key, name)


def message_id(saga: SagaState, step: str, kind: MessageKind, generation: int, attempt: int) -> str:
    """The id of one send of a command; a re-send gets a new one."""
    name = f"{saga.saga_id}/{step}/{kind.value}/{generation}/{attempt}/message"
    return _derived(saga.id_key, name)


LATE_SUCCESS = "late_success"
"""``StepState.error`` of a given-up step whose command answered success after all."""
LATE_FAILURE = "late_failure"
"""``StepState.error`` of a given-up step whose command answered failure after all."""
NOT_TAKEN = "not_taken"
"""``StepStatus.SKIPPED`` step's error when its condition did not hold (or none of the
steps it depends on was taken), as opposed to one skipped because the saga failed first."""
NO_SIGNAL = "no_signal"
"""``StepState.error`` of a human step whose deadline passed with no decision."""
ESCALATED = "escalated"
"""``StepState.error`` of a human step still waiting after its escalation alert."""
FENCE_FAILED = "fence_failed"
"""``StepState.error`` of a step done by hand whose fence was refused, dead-lettered or never
answered: the command then in flight may have taken effect too, so a person decides."""
SKIPPED_BY = "skipped_by"
"""The one key of the result of a step done by hand (``skip-step``): who did it. The step
has no result of its own."""
FENCING = "fencing"
"""``StepState.error`` of a step done by hand while its command was in flight: the
compensation that fences that command (undoes it, or leaves a tombstone) is awaited."""


@dataclass(frozen=True)
class StepState:
    """Where one step of one saga is."""

    status: StepStatus = StepStatus.PENDING
    attempt: int = 0
    """Sends of the forward command so far."""
    compensation_attempt: int = 0
    """Sends of the compensation so far."""
    generation: int = 1
    """Bumped when an operator retry needs a command the participant runs afresh (a
    refused compensation or command, a fence): ids derive from it, so the retry is a new
    command, and the ids of earlier generations are known to be superseded."""
    command_id: str | None = None
    compensation_id: str | None = None
    requested_at: datetime | None = None
    deadline: datetime | None = None
    finished_at: datetime | None = None
    """When the step settled. For a human step still waiting while its saga is in review:
    when that wait stopped (``wait_stopped``)."""
    result: Mapping[str, Any] | None = None
    error: str | None = None
    given_up: bool = False
    """The forward command got no answer in time; its outcome is unknown."""

    def evolve(self, **changes: Any) -> StepState:
        return replace(self, **changes)

    @property
    def fencing(self) -> bool:
        """Done by hand while its command was in flight; the fence has not answered yet."""
        return self.status is StepStatus.SUCCEEDED and self.error == FENCING

    @property
    def unfenced(self) -> bool:
        """Done by hand, and the fence of the command then in flight failed: its effect
        may be doubled, so the saga cannot complete until a person settles it."""
        return self.status is StepStatus.SUCCEEDED and self.error == FENCE_FAILED

    @property
    def in_flight(self) -> bool:
        """A message is out for this step and its answer is awaited."""
        return self.status in IN_FLIGHT or self.fencing

    @property
    def by_hand(self) -> bool:
        """Done by an operator (``skip-step``): its result names who, not what it did."""
        return self.result is not None and SKIPPED_BY in self.result

    @property
    def not_taken(self) -> bool:
        """Skipped because its condition did not hold: the branch was not taken."""
        return self.status is StepStatus.SKIPPED and self.error == NOT_TAKEN

    @property
    def awaits_signal(self) -> bool:
        """A human step waiting for a person's decision: requested, with no command."""
        return self.status is StepStatus.REQUESTED and self.command_id is None

    def wait_stopped(self, now: datetime) -> StepState:
        """The saga went to review, where no decision can be given: a person's wait stops,
        so the time in review does not count against its deadline."""
        if not self.awaits_signal or self.finished_at is not None:
            return self
        return self.evolve(finished_at=now)

    def wait_resumed(self, now: datetime) -> StepState:
        """The saga left review: a person's wait goes on, its deadline moved on by the time
        the wait was stopped."""
        if not self.awaits_signal or self.finished_at is None or self.deadline is None:
            return self
        return self.evolve(deadline=self.deadline + (now - self.finished_at), finished_at=None)

    @property
    def awaits_retry(self) -> bool:
        """Failed after the saga's pivot: sent again as a new command at its deadline."""
        return self.status is StepStatus.FAILED and self.deadline is not None

    @property
    def pending(self) -> bool:
        """Something will still move this step: an answer, or a retry at its deadline."""
        return self.in_flight or self.awaits_retry


@dataclass(frozen=True)
class SagaState:
    """Where one saga is. ``version`` grows by one with every change that is written."""

    saga_id: str
    saga_type: str
    definition_version: int
    business_key: str
    status: SagaStatus
    version: int
    payload: Mapping[str, Any]
    steps: Mapping[str, StepState]
    created_at: datetime
    deadline: datetime | None = None
    reason: str | None = None
    finished_at: datetime | None = None
    correlation_id: str | None = None
    traceparent: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    id_key: str | None = field(default=None, repr=False)
    """The secret the saga's command and message ids are derived with; never shown."""

    @classmethod
    def new(
        cls,
        definition: SagaDefinition,
        *,
        saga_id: str,
        business_key: str,
        payload: Mapping[str, Any],
        now: datetime,
        correlation_id: str | None = None,
        traceparent: str | None = None,
        id_key: str | None = None,
    ) -> SagaState:
        """A saga before its ``Started`` event: version 0, every step pending; ``id_key``
        keys its ids (``new_id_key()``; the caller draws it, the core stays pure)."""
        return cls(
            saga_id=saga_id,
            saga_type=definition.saga_type,
            definition_version=definition.version,
            business_key=business_key,
            status=SagaStatus.RUNNING,
            version=0,
            payload=dict(payload),
            steps={s.name: StepState() for s in definition.steps},
            created_at=now,
            correlation_id=correlation_id or saga_id,
            traceparent=traceparent,
            id_key=id_key,
        )

    def results(self) -> dict[str, Mapping[str, Any]]:
        """What the succeeded steps returned, by step name: the context later steps read."""
        return {name: st.result for name, st in self.steps.items() if st.result is not None}

    def next_wake_at(self) -> datetime | None:
        """The earliest deadline the sweeper must look at, or None when nothing waits.

        The saga's own deadline counts only while it runs: a compensating saga has
        already given up on it, and a wake-up the decider would not act on would be
        claimed by every sweep again.
        """
        if self.status not in ACTIVE_SAGA:
            return None
        times = [st.deadline for st in self.steps.values() if st.pending and st.deadline]
        if self.status is SagaStatus.RUNNING and self.deadline is not None:
            times.append(self.deadline)
        return min(times) if times else None
