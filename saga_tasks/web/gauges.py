"""Gauges read at scrape time from PostgreSQL and RabbitMQ, so every process that serves
``/metrics`` tells the same story (counters stay in ``observability.metrics``)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import Engine, Table

from saga_tasks.core.states import ACTIVE_SAGA
from saga_tasks.messaging.admin import queue_depths
from saga_tasks.messaging.topology import DEAD_LETTER_QUEUE, PARKING_QUEUE, REPLY_QUEUE
from saga_tasks.persistence import dispatch, status
from saga_tasks.persistence.outbox import oldest_unpublished_age

log = logging.getLogger("saga_tasks.web.gauges")


class StateCollector(Collector):
    """Sagas by status, outbox lag, held messages, commands waiting for capacity and in
    flight per queue, and queue depths, read when scraped."""

    def __init__(
        self,
        *,
        engine: Callable[[], Engine],
        outbox_tables: Sequence[Table],
        command_queues: Sequence[str],
        broker_url: str,
    ) -> None:
        self._engine = engine
        self.outbox_tables = outbox_tables
        self.command_queues = list(command_queues)
        self.queues = [*command_queues, REPLY_QUEUE, DEAD_LETTER_QUEUE, PARKING_QUEUE]
        self.broker_url = broker_url

    def collect(self) -> Iterator[GaugeMetricFamily]:
        try:
            yield from self._collect()
        except Exception:
            log.exception("could not read saga state for /metrics")
            yield _up(0)

    def _collect(self) -> Iterator[GaugeMetricFamily]:
        sagas = GaugeMetricFamily(
            "saga_sagas", "Sagas by type and status", labels=["saga_type", "status"]
        )
        active = GaugeMetricFamily("saga_active", "Active sagas by status", labels=["status"])
        lag = GaugeMetricFamily(
            "saga_outbox_lag_seconds", "Age of the oldest unpublished outbox row", labels=["outbox"]
        )
        held = GaugeMetricFamily(
            "saga_held_pending", "Held messages waiting for an operator", labels=["holding"]
        )
        waiting = GaugeMetricFamily(
            "saga_dispatch_waiting",
            "Commands waiting in PostgreSQL for capacity at their queue (flow control), "
            "sagas in review aside",
            labels=["queue"],
        )
        in_flight = GaugeMetricFamily(
            "saga_dispatch_in_flight",
            "Commands sent to a queue under flow control and not yet answered",
            labels=["queue"],
        )
        oldest = GaugeMetricFamily(
            "saga_dispatch_oldest_wait_seconds",
            "How long the oldest command waiting for capacity has waited",
            labels=["queue"],
        )
        paused = GaugeMetricFamily(
            "saga_dispatch_paused",
            "Commands of sagas in review, waiting or sent: neither waiting nor in flight",
            labels=["queue"],
        )
        with self._engine().connect() as conn:
            by_status = {s.value: 0 for s in ACTIVE_SAGA}
            for saga_type, state, n in status.counts_by_type_and_status(conn):
                sagas.add_metric([saga_type, state], n)
                if state in by_status:
                    by_status[state] += n
            for state, n in by_status.items():
                active.add_metric([state], n)
            for table in self.outbox_tables:
                age = oldest_unpublished_age(conn, table) or 0.0
                lag.add_metric([f"{table.schema}.{table.name}"], age)
            pending = status.pending_held(conn)
            for holding in ("dead_letter", "parking"):
                held.add_metric([holding], pending.get(holding, 0))
            flows = dispatch.counts(conn)
            for queue in self.command_queues:
                flow = flows.get(queue, dispatch.QueueFlow(0, 0, 0.0))
                waiting.add_metric([queue], flow.waiting)
                in_flight.add_metric([queue], flow.in_flight)
                oldest.add_metric([queue], flow.oldest_wait_seconds)
                paused.add_metric([queue], flow.paused)
        yield sagas
        yield active
        yield lag
        yield held
        yield waiting
        yield in_flight
        yield oldest
        yield paused
        depth = GaugeMetricFamily("saga_queue_depth", "Ready messages in a queue", labels=["queue"])
        for name, n in queue_depths(self.broker_url, self.queues).items():
            depth.add_metric([name], n)
        yield depth
        yield _up(1)


def _up(value: int) -> GaugeMetricFamily:
    up = GaugeMetricFamily("saga_state_up", "1 when the state gauges could be read")
    up.add_metric([], value)
    return up
