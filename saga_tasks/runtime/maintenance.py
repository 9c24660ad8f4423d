"""The periodic jobs beside the sagas themselves: outbox recovery, status samples, the
pruning of redelivery counts and the purge of sagas past their retention (beat runs each
on the maintenance queue)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta

from sqlalchemy import Engine, Table

from saga_tasks.core.clock import Clock
from saga_tasks.messaging.publisher import Publisher
from saga_tasks.persistence import purge, redeliveries, samples
from saga_tasks.persistence.db import translated
from saga_tasks.runtime.outlet import AfterPublish, relay

log = logging.getLogger("saga_tasks.runtime.maintenance")


class Maintenance:
    """Outbox recovery over every outbox of the deployment, and the housekeeping."""

    def __init__(
        self,
        *,
        engine: Callable[[], Engine],
        publisher: Callable[[], Publisher],
        outbox_tables: Sequence[Table],
        clock: Clock,
        relay_min_age: float,
        relay_batch: int,
        sample_keep: float,
        redelivery_keep: float = 86400.0,
        retention_days: float = 0.0,
        purge_batch: int = 500,
        after_publish: Callable[[], AfterPublish | None] = lambda: None,
    ) -> None:
        self._engine = engine
        self._publisher = publisher
        self.outbox_tables = list(outbox_tables)
        self.clock = clock
        self.relay_min_age = relay_min_age
        self.relay_batch = relay_batch
        self.sample_keep = sample_keep
        self.redelivery_keep = redelivery_keep
        self.retention_days = retention_days
        self.purge_batch = purge_batch
        self._after_publish = after_publish

    def recover_outboxes(self) -> dict[str, int]:
        """Publish outbox rows whose publish-after-commit did not happen (crash, outage);
        the number published per outbox."""
        published: dict[str, int] = {}
        hook = self._after_publish()
        for table in self.outbox_tables:
            report = relay(
                self._engine(),
                table,
                self._publisher(),
                min_age_seconds=self.relay_min_age,
                batch=self.relay_batch,
                after_publish=hook,
            )
            published[report.table] = report.published
        return published

    def sample_status(self) -> int:
        """One sample of the counts by status, and samples older than ``sample_keep``
        dropped; the rows written."""
        engine = self._engine()
        now = self.clock.now()
        with translated(engine.url), engine.begin() as conn:
            written = samples.take(conn, now)
            samples.prune(conn, now - timedelta(seconds=self.sample_keep))
        return written

    def forget_redeliveries(self) -> int:
        """Drop redelivery counts untouched for ``redelivery_keep`` seconds: a message
        redelivered that long ago was settled long since. The number removed."""
        engine = self._engine()
        before = self.clock.now() - timedelta(seconds=self.redelivery_keep)
        with translated(engine.url), engine.begin() as conn:
            removed = redeliveries.forget(conn, before)
        if removed:
            log.info("forgot %d old redelivery counts", removed)
        return removed

    def purge_finished(
        self,
        *,
        before: datetime | None = None,
        saga_type: str | None = None,
        budget: float = 5.0,
        on_batch: Callable[[int], None] = lambda _n: None,
    ) -> int:
        """Purge sagas finished before ``before`` (default: the retention ago; nothing
        when retention is 0), a batch per transaction, until none is due or ``budget``
        seconds have gone (the next run goes on; housekeeping shares the orchestrator's
        worker with the replies, so it keeps to a few seconds): the number purged."""
        if before is None:
            if self.retention_days <= 0:
                return 0
            before = self.clock.now() - timedelta(days=self.retention_days)
        engine = self._engine()
        started = time.monotonic()
        purged = 0
        while True:
            with translated(engine.url), engine.begin() as conn:
                done = purge.purge_batch(
                    conn,
                    before=before,
                    now=self.clock.now(),
                    limit=self.purge_batch,
                    saga_type=saga_type,
                )
            purged += done
            on_batch(purged)
            if done < self.purge_batch or time.monotonic() - started > budget:
                break
        if purged:
            log.info("purged %d sagas finished before %s", purged, before.isoformat())
        return purged
