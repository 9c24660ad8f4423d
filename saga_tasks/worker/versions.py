"""A worker that decides sagas refuses to start without every definition version its
unfinished sagas use.

A worker decides sagas when it consumes ``saga.replies`` (replies) or ``saga.maintenance``
(the sweeper and the intake, which beat sends there). It checks once, as it starts, with
one GROUP BY query, before its consumer takes any message (Celery starts the consumer
step last). A worker for participants only (no ``SAGA_DATABASE_URL``, or participant
queues only) decides nothing and does not check. When PostgreSQL does not answer, the
worker starts anyway, as it would for any outage: an orchestrator must not crash-loop
because its database is away.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from celery import bootsteps

from saga_tasks.errors import ServiceUnavailable
from saga_tasks.messaging.topology import MAINTENANCE_QUEUE, REPLY_QUEUE
from saga_tasks.runtime import versions

log = logging.getLogger("saga_tasks.worker")

EXIT_VERSIONS = 78
"""Exit status of a worker refused for definition versions it lacks (``EX_CONFIG``): a
configuration to fix, not a failure a restart can help."""

DECIDING = frozenset({REPLY_QUEUE, MAINTENANCE_QUEUE})


def decides_sagas(consumed: set[str], database_url: str) -> bool:
    """Whether a worker consuming ``consumed`` (empty: every queue) decides sagas."""
    return bool(database_url) and (not consumed or bool(consumed & DECIDING))


class RefuseUnloadedVersions(bootsteps.StartStopStep):
    """Exit with ``EXIT_VERSIONS``, the reason on stderr and in the log, when unfinished
    sagas use a definition version this worker does not load."""

    def start(self, w: Any) -> None:
        parts = w.app.saga_parts
        consumed = set(w.app.amqp.queues.consume_from or ())
        if not decides_sagas(consumed, parts.settings.database_url):
            return
        registry = parts.orchestrator.registry
        try:
            missing = versions.unloaded(parts.engine(), registry)
        except ServiceUnavailable as exc:
            log.error("cannot check the definition versions sagas use (%s); starting", exc)
            return
        if not missing:
            return
        message = versions.refusal(missing, registry)
        log.critical(message)
        # Also as one plain line to whoever started it: Celery has sent sys.stderr to its
        # log by now, and the log may be a file or JSON.
        print(f"error: {message}", file=sys.__stderr__, flush=True)
        raise SystemExit(EXIT_VERSIONS)
