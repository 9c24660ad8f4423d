"""A participant's own upkeep, run by its own workers: outbox recovery and the pruning of
redelivery counts, on its own database and with its own broker user.

The orchestrator cannot do this for it: the participant's tables are in a database it
is not given, and a reply it republished would carry its broker user, not the
participant's. So every worker that consumes a participant's queue runs, on its
consumer's timer, a recovery pass over that participant's outbox each
``SAGA_RELAY_INTERVAL`` seconds and a pruning pass each hour. Two workers of one
participant may run a pass at once: recovery claims rows with ``SKIP LOCKED``.

The first pass runs as the worker starts, before it takes a message: a worker restarted
after a crash publishes the replies its predecessor committed first. The timer runs in
the worker's main process, between messages (no thread, so nothing is held across a
prefork child's fork); a pass is short, and one that fails is logged and tried again at
the next tick.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import bootsteps

from saga_tasks.errors import SagaTasksError
from saga_tasks.runtime.participant import ParticipantRuntime
from saga_tasks.worker.beat import HOUSEKEEPING_INTERVAL

log = logging.getLogger("saga_tasks.upkeep")

REDELIVERY_KEEP = 86400.0
"""Seconds a participant keeps a redelivery count nobody touched (as the orchestrator)."""


class ParticipantUpkeep(bootsteps.StartStopStep):
    """Outbox recovery and redelivery pruning for the participants this worker consumes."""

    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, c: Any, **kwargs: Any) -> None:
        self.entries: list[Any] = []
        super().__init__(c, **kwargs)

    def start(self, c: Any) -> None:
        self.stop(c)  # a consumer restarted after a connection loss starts its steps again
        parts = c.app.saga_parts
        runtimes = consumed_runtimes(c, parts.runtimes)
        if not runtimes:
            return
        settings = parts.settings

        def recover() -> None:
            for runtime in runtimes:
                _run(
                    runtime,
                    "outbox recovery",
                    lambda r: r.recover_outbox(
                        min_age=settings.relay_min_age, batch=settings.relay_batch
                    ),
                )

        def prune() -> None:
            for runtime in runtimes:
                _run(
                    runtime, "redelivery pruning", lambda r: r.forget_redeliveries(REDELIVERY_KEEP)
                )

        recover()  # what the outbox owes goes first, before this worker takes a message
        self.entries = [
            c.timer.call_repeatedly(settings.relay_interval, recover),
            c.timer.call_repeatedly(HOUSEKEEPING_INTERVAL, prune),
        ]
        log.info(
            "participant upkeep: outbox recovery every %g s for %s",
            settings.relay_interval,
            ", ".join(r.participant.name for r in runtimes),
        )

    def stop(self, c: Any) -> None:
        for entry in self.entries:
            entry.cancel()
        self.entries = []

    def shutdown(self, c: Any) -> None:
        self.stop(c)


def consumed_runtimes(c: Any, runtimes: Any) -> list[ParticipantRuntime]:
    """The runtimes of the participants whose queue this worker consumes (``-Q``)."""
    queues = c.app.amqp.queues
    consumed = set(queues.consume_from or queues)
    return [r for r in runtimes.values() if r.participant.queue in consumed]


def _run(runtime: ParticipantRuntime, what: str, work: Any) -> None:
    try:
        done = work(runtime)
    except SagaTasksError as exc:
        log.warning(
            "%s of %s failed: %s; tried again next time", what, runtime.participant.name, exc
        )
        return
    except Exception:  # the timer must keep running; the next pass retries
        log.exception("%s of %s failed; tried again next time", what, runtime.participant.name)
        return
    if done:
        log.info("%s of %s: %d", what, runtime.participant.name, done)
