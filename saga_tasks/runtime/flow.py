"""Flow control in the orchestrator: how many commands each participant queue may have out.

A decision's commands to a queue with a limit wait in PostgreSQL (``saga_dispatch``)
until the queue has room, instead of piling up in RabbitMQ where a backlog turns into
timeouts, re-sends and compensations. Room frees when a step answers, is given up, or its
saga stops waiting on it, whatever the limits then (``core.capacity`` holds that rule);
each transaction that frees room or holds a command releases what fits, and every sweep
releases too (rate limits refill with time).

Limits come from the deployment (``SAGA_MAX_IN_FLIGHT``, ``SAGA_RATE_LIMIT``: a number for
every queue, or entries naming a participant or a queue), then from the participant's
definition (``Participant(max_in_flight=, rate_limit=)``), then the deployment's default.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence

from sqlalchemy import Connection

from saga_tasks.core import capacity
from saga_tasks.core.clock import Clock, SystemClock
from saga_tasks.core.definitions import SagaDefinition
from saga_tasks.core.messages import H_STEP, OutboundMessage
from saga_tasks.core.model import SagaState
from saga_tasks.observability import metrics
from saga_tasks.persistence import dispatch
from saga_tasks.persistence.dispatch import QueueLimit
from saga_tasks.persistence.sagas import Changes

__all__ = ["FlowControl", "QueueLimit", "resolve_limits"]


def resolve_limits(
    queues: Iterable[str],
    owners: Mapping[str, tuple[str, int | None, float | None]],
    max_in_flight: Mapping[str, float],
    rate_limit: Mapping[str, float],
) -> dict[str, QueueLimit]:
    """Each command queue's limit. ``owners``: queue -> (participant name, its
    ``max_in_flight``, its ``rate_limit``); the two mappings are the settings, by
    participant or queue name, ``*`` for every other."""
    limits: dict[str, QueueLimit] = {}
    for queue in queues:
        name, own_max, own_rate = owners.get(queue, (queue, None, None))
        limits[queue] = QueueLimit(
            max_in_flight=int(_pick(max_in_flight, (queue, name), own_max)),
            rate_limit=float(_pick(rate_limit, (queue, name), own_rate)),
        )
    return limits


def _pick(setting: Mapping[str, float], names: Iterable[str], own: float | None) -> float:
    """A deployment's entry naming the queue or its participant, else the definition's
    own value, else the deployment's default."""
    for key in names:
        if key in setting:
            return setting[key]
    if own is not None:
        return own
    return setting.get("*", 0.0)


class FlowControl:
    """Splits a decision's commands into those sent now and those that wait, and releases
    waiting ones as room frees."""

    def __init__(self, limits: Mapping[str, QueueLimit], clock: Clock | None = None) -> None:
        self.limits = {q: limit for q, limit in limits.items() if limit.active}
        self.clock = clock or SystemClock()

    @property
    def enabled(self) -> bool:
        return bool(self.limits)

    def split(
        self, messages: Sequence[OutboundMessage]
    ) -> tuple[list[OutboundMessage], list[OutboundMessage]]:
        """(sent now, waiting for capacity)."""
        now = [m for m in messages if m.queue not in self.limits]
        held = [m for m in messages if m.queue in self.limits]
        return now, held

    def stage(
        self,
        conn: Connection,
        changes: Changes,
        *,
        definition: SagaDefinition | None,
        old: SagaState,
        new: SagaState,
        messages: Sequence[OutboundMessage],
    ) -> set[str]:
        """Add one decision's commands to ``changes`` (the outbox, or waiting), and the
        steps that give their place back or are sent again; the queues where room may
        have changed. The places are given back whatever the limits now
        (``core.capacity``): a command held under a deployment with a limit may be
        answered under one without."""
        again = capacity.held_again(self.limits, old, messages)
        out = {step for _, step in dispatch.out(conn, [(old.saga_id, s) for s in again])}
        staged = capacity.stage(
            self.limits, definition, old=old, new=new, messages=messages, out=out
        )
        changes.messages += staged.sent
        changes.held += staged.held
        changes.freed += [(old.saga_id, step) for step in staged.freed]
        changes.superseded += [(old.saga_id, step) for step in staged.superseded]
        for step in staged.retaken:
            self._retake(conn, definition, new, step)
        return set(staged.touched)

    def _retake(
        self, conn: Connection, definition: SagaDefinition | None, new: SagaState, step: str
    ) -> None:
        """The copy out of ``step`` holds its place again in a saga a late answer reopened
        (``Staged.retaken``): a sent row, paused with the saga by the decision's write.
        Only the count needs it; nothing releases a sent row."""
        found = definition.by_name.get(step) if definition is not None else None
        if found is None:
            return
        queue = found.queue  # a step's compensation goes to its queue too
        message = OutboundMessage(
            message_id=str(uuid.uuid4()),
            task_name="",
            queue=queue,
            headers={H_STEP: step},
            body={},
            saga_id=new.saga_id,
            routing_key=queue,
        )
        dispatch.take_place(conn, message, step, now=self.clock.now())

    def release(
        self, conn: Connection, queues: Iterable[str] | None = None
    ) -> list[OutboundMessage]:
        """Release what fits in ``queues`` (by default every queue that has a limit or
        holds waiting commands), in ``conn``'s transaction; the messages to publish after
        its commit."""
        if queues is None:
            # Every queue with a limit, and any other holding waiting commands (its limit
            # lifted by a redeploy): those go out at once.
            chosen = dict(self.limits)
            for queue in dispatch.waiting_queues(conn):
                chosen.setdefault(queue, QueueLimit())
        else:
            chosen = {q: self.limits[q] for q in queues if q in self.limits}
        if not chosen:
            return []
        released = dispatch.release(conn, chosen, self.clock.now())
        for m in released:
            metrics.DISPATCHED.labels(queue=m.queue).inc()
        return released
