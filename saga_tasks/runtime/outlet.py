"""Getting committed outbox messages to the broker: at once after commit, and by recovery.

Publish-after-commit is the fast path: an ``Outlet`` takes what a transaction just
committed. ``Dispatcher`` (the default) queues it for a sender thread and returns;
``SyncOutlet`` (``SAGA_PUBLISH_MODE=sync``) publishes, waits for the confirms and
marks the rows before returning. Recovery (a beat task) is the guarantee: a
row left unpublished by a crash, a broker outage or a lost confirm is claimed with
``FOR UPDATE SKIP LOCKED`` once it is old enough and published again. Consumers
deduplicate, so publishing twice is safe; never publishing is what must not happen.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from sqlalchemy import Engine, Table

from saga_tasks.core.messages import OutboundMessage
from saga_tasks.errors import ServiceUnavailable
from saga_tasks.messaging.publisher import Publisher, PublishResult
from saga_tasks.observability import metrics
from saga_tasks.persistence import outbox
from saga_tasks.persistence.db import translated

log = logging.getLogger("saga_tasks.runtime.outlet")


def deliver(
    engine: Engine,
    table: Table,
    publisher: Publisher,
    messages: Sequence[OutboundMessage],
) -> PublishResult:
    """Publish messages a transaction just committed, then mark them published."""
    result = publisher.publish(messages)
    if result.failed:
        metrics.PUBLISH_FAILURES.labels(path="after_commit").inc(len(result.failed))
    if result.published:
        try:
            with translated(engine.url), engine.begin() as conn:
                outbox.mark_published(conn, table, result.published)
        except ServiceUnavailable as exc:
            # Published but not marked: recovery publishes them again; consumers dedupe.
            log.warning(
                "could not mark published outbox rows: %s",
                exc,
                extra={"message_id": result.published[0], "count": len(result.published)},
            )
    return result


class Outlet(Protocol):
    """Where a transaction's committed outbox messages go right after the commit."""

    def send(self, table: Table, messages: Sequence[OutboundMessage]) -> None: ...

    def flush(self, timeout: float) -> bool:
        """Wait until what was sent is confirmed and marked, or left to recovery."""
        ...

    def close(self, timeout: float) -> None:
        """Flush, then release the connection and any thread."""
        ...


class SyncOutlet:
    """Publish, wait for the confirms, mark the rows, then return."""

    def __init__(
        self, engine: Callable[[Table], Engine], publisher: Callable[[], Publisher]
    ) -> None:
        self._engine = engine
        self._publisher = publisher

    def send(self, table: Table, messages: Sequence[OutboundMessage]) -> None:
        deliver(self._engine(table), table, self._publisher(), messages)

    def flush(self, timeout: float) -> bool:
        return True

    def close(self, timeout: float) -> None:
        return None


AfterPublish = Callable[[Sequence[OutboundMessage]], None]
"""Runs between a recovery publish and its mark (the demo's crash point)."""


@dataclass(frozen=True)
class RelayReport:
    table: str
    claimed: int
    published: int
    failed: int


def relay(
    engine: Engine,
    table: Table,
    publisher: Publisher,
    *,
    min_age_seconds: float,
    batch: int,
    after_publish: AfterPublish | None = None,
) -> RelayReport:
    """One recovery pass over one outbox table.

    ``after_publish`` runs between the publish and the mark (the demo crash point).
    """
    name = f"{table.schema}.{table.name}"
    with translated(engine.url), engine.begin() as conn:
        rows = outbox.claim_unpublished(conn, table, min_age_seconds=min_age_seconds, limit=batch)
        if not rows:
            return RelayReport(name, 0, 0, 0)
        result = publisher.publish(rows)
        if after_publish is not None and result.published:
            after_publish([r for r in rows if r.message_id in set(result.published)])
        outbox.mark_published(conn, table, result.published, recovered=True)
        outbox.count_failed_attempt(conn, table, result.failed)
    metrics.OUTBOX_RECOVERED.labels(outbox=name).inc(len(result.published))
    if result.failed:
        metrics.PUBLISH_FAILURES.labels(path="recovery").inc(len(result.failed))
    log.info(
        "outbox recovery published %d of %d rows from %s",
        len(result.published),
        len(rows),
        name,
        extra={"outbox": name, "message_id": rows[0].message_id, "saga_id": rows[0].saga_id},
    )
    return RelayReport(name, len(rows), len(result.published), len(result.failed))
