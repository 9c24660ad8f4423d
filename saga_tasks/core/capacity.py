"""Flow control's bookkeeping as a rule on saga states: which of a decision's commands wait
for capacity at their queue, and which steps give back the place they hold there.

A step holds one place at its queue from when its command leaves until the step stops
awaiting it (it answers, is given up or done by hand, or its saga ends; a late answer
that reopens an ended saga takes the places of its steps still awaited again); a command
sent again while a copy is out goes at once, in that copy's place. Giving a place back depends
on the saga's states alone, never on the limits in force: a command held under one
deployment's limits may be answered under another's that has none, and if its place were
kept then, it would count in flight under the next deployment that has a limit, for good.
Only whether a command waits depends on the limits.

``runtime.flow`` writes what this decides (``persistence.dispatch``); the stateful world of
the unit tests drives the same rule through deploys that change the limits.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from saga_tasks.core.definitions import SagaDefinition
from saga_tasks.core.messages import H_STEP, OutboundMessage
from saga_tasks.core.model import SagaState
from saga_tasks.core.states import ACTIVE_SAGA, TERMINAL_SAGA

__all__ = ["Staged", "held_again", "stage", "takes_place"]


@dataclass(frozen=True)
class Staged:
    """One decision's commands and places, as flow control writes them."""

    sent: tuple[OutboundMessage, ...]
    """To the outbox now: a queue without a limit, or a step's copy out (its place)."""
    held: tuple[OutboundMessage, ...]
    """Wait for capacity at their queue."""
    freed: tuple[str, ...]
    """Steps that stop awaiting their command: the place a sent copy holds is given back,
    and a copy still waiting is withdrawn, whatever the limits."""
    superseded: tuple[str, ...]
    """Steps sent again while awaited: a copy still waiting is withdrawn, one sent keeps
    the place until the step answers."""
    touched: frozenset[str]
    """Limited queues where room may have changed: release what fits there."""
    retaken: tuple[str, ...] = ()
    """Steps of an ended saga that a late answer reopens (into review) and that still
    await their command: the copy out holds its place again, paused as the saga is, so
    that a person sending the saga on finds it counted. Their places were given back when
    the saga ended, whatever the limits; they are taken again whatever the limits too."""


def held_again(
    limited: Collection[str], old: SagaState, messages: Sequence[OutboundMessage]
) -> list[str]:
    """The steps whose command to a limited queue is sent again while awaited: those with
    a copy out (which the caller looks up) go at once, in that copy's place."""
    return [
        step
        for m in messages
        if m.queue in limited
        and (before := old.steps.get(step := m.headers[H_STEP])) is not None
        and before.in_flight
    ]


def stage(
    limited: Collection[str],
    definition: SagaDefinition | None,
    *,
    old: SagaState,
    new: SagaState,
    messages: Sequence[OutboundMessage],
    out: Collection[str] = (),
) -> Staged:
    """What flow control writes for the decision from ``old`` to ``new`` (of
    ``definition``, None when it is not loaded) that sends ``messages``: ``limited``, the
    queues with a limit now; ``out``, the steps of ``held_again`` with a copy out.

    A step that a migration adds is not in ``old``: it awaits nothing yet, so its command
    is a first one."""
    sent: list[OutboundMessage] = []
    held: list[OutboundMessage] = []
    for m in messages:
        step = m.headers[H_STEP]
        before = old.steps.get(step)
        copy_out = before is not None and before.in_flight and step in out
        (held if m.queue in limited and not copy_out else sent).append(m)
    resent = {m.headers[H_STEP] for m in messages}
    moved = new.status != old.status
    ends = moved and new.status in TERMINAL_SAGA
    freed: list[str] = []
    superseded: list[str] = []
    touched = {m.queue for m in held}
    # A saga that stops waiting (review, or an end) frees its room and one taken out of
    # review takes it again (the paused mark, written with the status); an ended one also
    # withdraws what never left. One in review keeps its rows: a person may send it on.
    for name, before in old.steps.items():
        after = new.steps.get(name)
        answered = before.in_flight and (after is None or not after.in_flight)
        if answered or ends:
            freed.append(name)
        elif before.in_flight and name in resent:
            superseded.append(name)
        queue = _queue(definition, name)
        if (
            queue is not None
            and queue in limited
            and (
                answered
                or (moved and (before.in_flight or (after is not None and after.in_flight)))
            )
        ):
            touched.add(queue)
    reopens = moved and old.status in TERMINAL_SAGA and new.status not in TERMINAL_SAGA
    retaken = (
        tuple(n for n, after in new.steps.items() if after.in_flight and n not in resent)
        if reopens
        else ()
    )
    return Staged(
        tuple(sent), tuple(held), tuple(freed), tuple(superseded), frozenset(touched), retaken
    )


def takes_place(limited: Collection[str], queue: str | None, after: SagaState, step: str) -> bool:
    """Whether a held message replayed to ``queue`` by hand (not through the outbox) takes
    the place of its step: the queue has a limit and the replay left the step awaiting it
    in a running or compensating saga (a forced replay into an ended saga awaits nothing,
    and a place taken there would never be given back). It goes out at once, as an
    operator's re-send; a step that already holds a place keeps that one."""
    st = after.steps.get(step)
    return (
        queue is not None
        and queue in limited
        and after.status in ACTIVE_SAGA
        and st is not None
        and st.in_flight
    )


def _queue(definition: SagaDefinition | None, step: str) -> str | None:
    if definition is None:
        return None
    found = definition.by_name.get(step)
    return found.queue if found is not None else None
