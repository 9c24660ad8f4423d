"""The transition builder: the one place where a decision accumulates its state changes,
history entries, commands and wake-ups before ``decision()`` freezes them.

Every event handler of the decider receives a ``Transition`` and changes the saga only
through it, so each change is written down by the entry that made it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any

from saga_tasks.core.decider.decision import CommandIntent, Decision, HistoryEntry
from saga_tasks.core.definitions import SagaDefinition
from saga_tasks.core.model import SagaState, StepState
from saga_tasks.core.states import ACTIVE_SAGA, TERMINAL_SAGA, Classification, SagaStatus


class Transition:
    """The mutable scratch space of one decision; ``decision()`` freezes it."""

    def __init__(self, definition: SagaDefinition, state: SagaState, now: datetime) -> None:
        self.definition = definition
        self.before = state
        self.now = now
        self.status = state.status
        self.reason = state.reason
        self.deadline = state.deadline
        """The saga's own wake-up; each step carries its own."""
        self.finished_at = state.finished_at
        self.steps: dict[str, StepState] = dict(state.steps)
        self.commands: list[CommandIntent] = []
        self.history: list[HistoryEntry] = []
        self.classification = Classification.ACCEPTED
        self.changed = False

    def set_status(self, status: SagaStatus, reason: str | None) -> None:
        self.changed = True
        self.status = status
        self.reason = reason
        if status not in TERMINAL_SAGA:
            self.finished_at = None

    def set_step(
        self,
        name: str,
        new: StepState,
        event: str,
        *,
        message_id: str | None = None,
        reason: str | None = None,
        detail: Mapping[str, Any] | None = None,
    ) -> None:
        old = self.steps[name]
        self.steps[name] = new
        self.changed = True
        self.history.append(
            HistoryEntry(
                event=event,
                saga_status_before=self.status,
                saga_status_after=self.status,
                step=name,
                step_status_before=old.status,
                step_status_after=new.status,
                message_id=message_id,
                reason=reason,
                detail=dict(detail or {}),
            )
        )

    def put_step(self, name: str, new: StepState) -> None:
        """Change a step without an entry of its own: the entry that follows tells it."""
        self.steps[name] = new

    def note(
        self,
        event: str,
        *,
        step: str | None = None,
        message_id: str | None = None,
        reason: str | None = None,
        detail: Mapping[str, Any] | None = None,
    ) -> None:
        st = self.steps.get(step) if step else None
        self.history.append(
            HistoryEntry(
                event=event,
                saga_status_before=self.status,
                saga_status_after=self.status,
                step=step,
                step_status_before=st.status if st else None,
                step_status_after=st.status if st else None,
                message_id=message_id,
                reason=reason,
                detail=dict(detail or {}),
            )
        )

    def emit(self, command: CommandIntent) -> None:
        """A command to send once the decision is committed."""
        self.commands.append(command)

    def manual_review(self, reason: str) -> None:
        if self.status in TERMINAL_SAGA and self.classification is Classification.ACCEPTED:
            self.classification = Classification.LATE  # it reopens a saga that had ended
        self.changed = True
        self.set_status(SagaStatus.MANUAL_REVIEW, reason)
        self.note("manual_review", reason=reason)

    def decision(self) -> Decision:
        if (
            self.changed
            and self.status in ACTIVE_SAGA
            and not any(st.pending for st in self.steps.values())
        ):
            # No reply and no deadline would ever move this saga again. The rules are
            # meant to leave no such state; should one be reached, a person sees it.
            stuck = ", ".join(f"{n} {st.status.value}" for n, st in self.steps.items())
            self.note("no_way_forward", reason=f"nothing is in flight ({stuck})")
            self.manual_review(f"the saga has no way forward: nothing is in flight ({stuck})")
        self._stop_or_resume_waits()
        # History entries say the saga status before and after the whole decision,
        # so a reader sees each transition once, on the entry that made it.
        entries = tuple(_fix_status(h, self.before.status, self.status) for h in self.history)
        if not self.changed:
            return Decision(self.before, (), entries, self.classification, changed=False)
        state = replace(
            self.before,
            status=self.status,
            reason=self.reason,
            deadline=self.deadline,
            finished_at=self.finished_at,
            steps=dict(self.steps),
            version=self.before.version + 1,
        )
        return Decision(state, tuple(self.commands), entries, self.classification, changed=True)

    def _stop_or_resume_waits(self) -> None:
        """Time in review does not count against a person: no decision can be given there.
        A human step's wait stops when the saga goes to review and resumes, its deadline
        moved on by as long, when the saga leaves it."""
        into = self.status is SagaStatus.MANUAL_REVIEW
        was = self.before.status is SagaStatus.MANUAL_REVIEW
        if into == was or not (into or self.status in ACTIVE_SAGA):
            return
        for name, st in list(self.steps.items()):
            if into:
                new = st.wait_stopped(self.now)
                event, reason = "signal_wait_stopped", REVIEW_STOPS_WAIT
            else:
                new = st.wait_resumed(self.now)
                event, reason = "signal_wait_resumed", WAIT_RESUMED
            if new != st:
                due = {"next_look_at": new.deadline.isoformat()} if new.deadline else {}
                self.set_step(name, new, event, reason=reason, detail=due)


REVIEW_STOPS_WAIT = (
    "the saga is in review, where no decision can be given: the wait stops, and its deadline "
    "moves on by the time in review"
)
WAIT_RESUMED = "the saga left review: the wait goes on, its deadline moved on by the time in review"


def _fix_status(entry: HistoryEntry, before: SagaStatus, after: SagaStatus) -> HistoryEntry:
    return replace(entry, saga_status_before=before, saga_status_after=after)
