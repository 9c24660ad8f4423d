"""Flow control in the orchestrator: how many commands each participant queue may have out.

A decision's commands to a queue with a limit wait in PostgreSQL (``saga_dispatch``)
until the queue has room, instead of piling up in RabbitMQ where a backlog turns into
timeouts, re-sends and compensations. Room frees when a step answers, is sent again or
given up, or its saga stops waiting on it; each transaction that frees room or holds a
command releases what fits, and every sweep releases too (rate limits refill with time).

Limits come from the deployment (``SAGA_MAX_IN_FLIGHT``, ``SAGA_RATE_LIMIT``: a number for
every queue, or entries naming a participant or a queue), then from the participant's
definition (``Participant(max_in_flight=, rate_limit=)``), then the deployment's default.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from sqlalchemy import Connection

from saga_tasks.core.clock import Clock, SystemClock
from saga_tasks.core.definitions import SagaDefinition
from saga_tasks.core.messages import H_STEP, OutboundMessage
from saga_tasks.core.model import SagaState
from saga_tasks.core.states import TERMINAL_SAGA
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
        steps whose earlier commands stop counting; the queues where room may have
        changed. A command sent again while a copy is out takes that copy's room and
        goes at once: a step holds one place, and a lost copy cannot hold it while its
        re-send waits for it forever."""
        now, held = self.split(messages)
        changes.messages += now
        if not self.limits:
            return set()
        steps_out = dispatch.out(
            conn,
            [
                (old.saga_id, m.headers[H_STEP])
                for m in held
                if old.steps[m.headers[H_STEP]].in_flight
            ],
        )
        for m in held:
            if (old.saga_id, m.headers[H_STEP]) in steps_out:
                changes.messages.append(m)
            else:
                changes.held.append(m)
        held = [m for m in held if (old.saga_id, m.headers[H_STEP]) not in steps_out]
        touched = {m.queue for m in held}
        resent = {m.headers[H_STEP] for m in messages}
        # A saga that stops waiting (review, or an end) frees its room, and one taken out
        # of review takes it again; an ended one also withdraws what never left. One in
        # review keeps its rows: a person may send it on.
        moved = new.status != old.status
        ends = moved and new.status in TERMINAL_SAGA
        for name, before in old.steps.items():
            after = new.steps.get(name)
            answered = before.in_flight and (after is None or not after.in_flight)
            if answered or ends:
                changes.freed.append((old.saga_id, name))
            elif before.in_flight and name in resent:
                changes.superseded.append((old.saga_id, name))
            queue = _queue(definition, name)
            if queue in self.limits and (
                answered or (moved and (before.in_flight or (after and after.in_flight)))
            ):
                touched.add(queue)
        return touched

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


def _queue(definition: SagaDefinition | None, step: str) -> str | None:
    if definition is None:
        return None
    found = definition.by_name.get(step)
    return found.queue if found is not None else None
