"""The pure decider: ``decide(definition, state, event, now) -> Decision``.

All saga logic lives in this package and nowhere else. It reads no clock, touches no database
and sends nothing: it returns the new state, the commands to send, and the history
entries that explain the change. Every way an event can be classified (accepted,
duplicate, late, conflicting, invalid) is an explicit branch with a history entry.

Rules, in short:
- steps whose parents have all succeeded are sent together (fan-out); a step waits
  for all of its parents (fan-in);
- a failed step turns the saga to COMPENSATING: steps never sent are skipped, every
  succeeded step is undone, children before parents, and a step still in flight is
  undone once it answers;
- a step without a compensation stays done (COMPENSATION_SKIPPED);
- a refused compensation, or an answer that contradicts an earlier one, puts the
  saga in MANUAL_REVIEW with the reason; only an operator takes it out.

Time (``DeadlinePassed``, from the sweeper):
- a step with no answer by its deadline is sent again, same command id, until its
  retry policy is spent; then it is given up, its outcome unknown. By its late-reply
  policy it is compensated at once (``compensate``: the compensation either undoes a
  late effect or leaves a tombstone that refuses the command) or left ``TIMED_OUT``
  (``ignore``, ``manual_review``); the saga compensates the rest. A step that cannot be
  undone and gives no answer puts the saga in MANUAL_REVIEW: nothing safe remains.
- a compensation with no answer is sent again until its policy is spent; then the
  saga goes to MANUAL_REVIEW;
- the saga's own deadline turns a RUNNING saga to compensation, giving up what is
  in flight.
A reply to a step that was given up is late: it is written down, and with the
``manual_review`` policy a late success puts the saga in MANUAL_REVIEW.

Dead letters (``DeadLettered``, from the intake): a step's command in the dead-letter
queue gives the step up by its ``on_dead_letter`` policy (compensate, or manual
review); a dead compensation or a dead reply needs a person.

Branches, pivot, people: a step whose condition (``when=``) does not hold is not taken
(``SKIPPED``), nor is one none of whose parents was taken. Once the pivot succeeded the
saga only goes forward: a later step's failure sends it again as a new command (by its
retry policy, then a person), silence sends it again, and nothing is compensated. A
human step sends nothing: it waits for a person's signal (``SignalReceived``), with an
escalation alert and a deadline whose policy fails the step or calls a reviewer.

Operators (``OperatorAction``): retry a step or its compensation, skip a step (done
or undone by hand), compensate, or resolve a saga in MANUAL_REVIEW to a final status.
An action the saga's state does not allow raises ``ActionRefused`` with the reason;
nothing is written.

Versions (``migrate``): an operator moves an unfinished saga to another version of its
definition when every step it has begun is there unchanged; a running saga goes on under
the new version at once.

The modules: one for each family of events (``start``, ``replies``, ``deadlines``,
``dead_letters``, ``operator``), each writing through the one transition builder
(``transitions``) that ``decision()`` freezes into the values of ``decision``; ``migrate``
moves a saga to another version of its definition;
``progress`` moves a saga forward or back as far as its steps allow, ``commands`` sends a
step's command, compensation or fence, and ``replay`` says what a held message is to its
saga.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from saga_tasks.core.decider.dead_letters import on_dead_letter
from saga_tasks.core.decider.deadlines import on_deadline
from saga_tasks.core.decider.decision import CommandIntent, Decision, HistoryEntry
from saga_tasks.core.decider.migrate import migrate
from saga_tasks.core.decider.operator import on_operator
from saga_tasks.core.decider.replay import replay_awaits
from saga_tasks.core.decider.replies import on_reply
from saga_tasks.core.decider.signals import on_signal
from saga_tasks.core.decider.start import on_started
from saga_tasks.core.decider.transitions import REVIEW_STOPS_WAIT, Transition
from saga_tasks.core.definitions import SagaDefinition
from saga_tasks.core.events import (
    DeadLettered,
    DeadlinePassed,
    Event,
    OperatorAction,
    ReplyReceived,
    SignalReceived,
    Started,
)
from saga_tasks.core.model import SagaState
from saga_tasks.core.states import Classification, SagaStatus

__all__ = [
    "CommandIntent",
    "Decision",
    "HistoryEntry",
    "decide",
    "hand_over",
    "migrate",
    "replay_awaits",
]


def decide(definition: SagaDefinition, state: SagaState, event: Event, now: datetime) -> Decision:
    """Apply one event to one saga."""
    if state.saga_type != definition.saga_type or state.definition_version != definition.version:
        raise ValueError(
            f"definition {definition.saga_type} v{definition.version} does not match saga "
            f"{state.saga_id} ({state.saga_type} v{state.definition_version})"
        )
    tx = Transition(definition, state, now)
    if isinstance(event, Started):
        on_started(tx)
    elif isinstance(event, ReplyReceived):
        on_reply(tx, event)
    elif isinstance(event, DeadlinePassed):
        on_deadline(tx, event.backlog, event.dispatch)
    elif isinstance(event, DeadLettered):
        on_dead_letter(tx, event)
    elif isinstance(event, OperatorAction):
        on_operator(tx, event)
    elif isinstance(event, SignalReceived):
        on_signal(tx, event)
    else:  # pragma: no cover - the Event union is closed
        raise TypeError(f"unknown event {event!r}")
    return tx.decision()


def hand_over(state: SagaState, reason: str, *, now: datetime) -> Decision:
    """A saga the shell could not decide (its definition is not loaded, the decider
    failed, or it found nothing to do at a deadline that passed) goes to a person with
    the reason, so it is never picked up again and again. A person's wait stops there,
    as in any review."""
    review = SagaStatus.MANUAL_REVIEW
    entries = [HistoryEntry("manual_review", state.status, review, reason=reason)]
    steps = dict(state.steps)
    for name, st in state.steps.items():
        stopped = st if state.status is review else st.wait_stopped(now)
        if stopped != st:
            steps[name] = stopped
            entries.append(
                HistoryEntry(
                    "signal_wait_stopped",
                    state.status,
                    review,
                    name,
                    st.status,
                    st.status,
                    reason=REVIEW_STOPS_WAIT,
                )
            )
    after = replace(state, status=review, reason=reason, steps=steps, version=state.version + 1)
    return Decision(after, (), tuple(entries), Classification.ACCEPTED, changed=True)
