"""Prometheus metrics: counters kept by each process, gauges read from the database.

Counters and the step latency histogram live in the process that sees the event
(workers serve them on ``SAGA_METRICS_PORT``; with prefork, set
``PROMETHEUS_MULTIPROC_DIR``). What must agree across processes (sagas by status,
outbox lag, held messages, queue depths) is read from PostgreSQL and RabbitMQ at
scrape time by ``StateCollector``, served by the web app's ``/metrics``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, multiprocess, start_http_server

log = logging.getLogger("saga_tasks.observability.metrics")

SAGAS_STARTED = Counter("saga_started_total", "Sagas started", ["saga_type"])
SAGAS_FINISHED = Counter(
    "saga_finished_total", "Sagas reaching a final or review status", ["saga_type", "status"]
)
MESSAGES = Counter(
    "saga_messages_total",
    "Messages handled, by consumer and classification (accepted, duplicate, conflicting, ...)",
    ["consumer", "classification"],
)
INVALID_MESSAGES = Counter(
    "saga_invalid_messages_total", "Messages that made no sense", ["consumer"]
)
SENDERS_REFUSED = Counter(
    "saga_sender_refused_total",
    "Messages refused for their sender: no AMQP user_id, or a broker user that may not send "
    "them (also counted as invalid)",
    ["consumer"],
)
TASKS_REFUSED = Counter(
    "saga_task_refused_total",
    "Deliveries a worker refused to run: a task that does not belong on its queue, or a "
    "message asking for follow-up work (chain, callbacks, a group); parked with the reason",
    ["queue"],
)
BATCHES = Histogram(
    "saga_batch_size",
    "Messages a worker applied in one transaction (group commit): replies (consumer "
    "orchestrator) or one participant's commands",
    ["consumer"],
    buckets=(1, 2, 4, 8, 16, 32, 64),
)
BATCHES_FAILED = Counter(
    "saga_batch_failed_total",
    "Batches rolled back whole (a message that made no sense, a refusal, a refused sender, "
    "the database failing): each of their messages was then applied alone",
    ["consumer"],
)
PUBLISH_FAILURES = Counter(
    "saga_publish_failures_total", "Publishes the broker did not confirm", ["path"]
)
OUTBOX_RECOVERED = Counter(
    "saga_outbox_recovered_total", "Outbox rows published by recovery", ["outbox"]
)
STEP_LATENCY = Histogram(
    "saga_step_latency_seconds",
    "From a step's command being sent to its answer being applied",
    ["saga_type", "step", "outcome"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
)
TIMEOUTS = Counter(
    "saga_timeouts_total",
    "Deadlines that passed: re-sends, re-sends deferred behind a queue's backlog or while "
    "the command waits for capacity, deadlines moved to run from dispatch, steps given up, "
    "compensations re-sent, steps and compensations overdue (alerts)",
    ["saga_type", "step", "action"],
)
SWEEP_HANDED_OVER = Counter(
    "saga_sweep_handed_over_total",
    "Sagas the sweeper could not decide and put in MANUAL_REVIEW (a definition not loaded, "
    "a decider failure, a deadline nothing was due for)",
)
COMPENSATIONS = Counter(
    "saga_compensations_total", "Compensations requested", ["saga_type", "step"]
)

DISPATCHED = Counter(
    "saga_commands_dispatched_total",
    "Commands released by flow control from waiting in PostgreSQL to the broker",
    ["queue"],
)
ADMISSION_REFUSED = Counter(
    "saga_admission_refused_total",
    "Saga starts refused by admission control, by type and reason (active, waiting)",
    ["saga_type", "reason"],
)
SCHEDULE_FIRINGS = Counter(
    "saga_schedule_firings_total",
    "Firings of scheduled sagas by outcome: started, existing (the tick's saga was already "
    "started), late, failed (payload function, payload, admission), unavailable, dropped "
    "(unknown schedule or a time that is not one of its ticks)",
    ["schedule", "outcome"],
)
SCHEDULE_MISSED = Counter(
    "saga_schedule_missed_total",
    "Ticks of a schedule no firing started: beat was away, or they were too late",
    ["schedule"],
)

_TIMEOUT_EVENTS = {
    "step_resent": "resent",
    "resend_deferred": "resend_deferred",
    "step_given_up": "given_up",
    "compensation_resent": "compensation_resent",
    "dispatch_waiting": "dispatch_waiting",
    "deadline_from_dispatch": "deadline_from_dispatch",
    "step_overdue": "overdue",
    "compensation_overdue": "compensation_overdue",
}


def observe_history(
    saga_type: str, entries: Any, step_latency: Callable[[str], float | None]
) -> None:
    """Count what one decision's history entries say happened."""
    for entry in entries:
        action = _TIMEOUT_EVENTS.get(entry.event)
        if action and entry.step:
            TIMEOUTS.labels(saga_type=saga_type, step=entry.step, action=action).inc()
        elif entry.event == "compensation_requested" and entry.step:
            COMPENSATIONS.labels(saga_type=saga_type, step=entry.step).inc()
        elif entry.event in ("step_succeeded", "step_failed") and entry.step:
            seconds = step_latency(entry.step)
            if seconds is not None:
                outcome = "success" if entry.event == "step_succeeded" else "failure"
                STEP_LATENCY.labels(saga_type=saga_type, step=entry.step, outcome=outcome).observe(
                    max(seconds, 0.0)
                )


def serve_worker_metrics(port: int) -> None:
    """Serve this worker's counters on ``port`` (aggregated across prefork children when
    ``PROMETHEUS_MULTIPROC_DIR`` is set)."""

    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        start_http_server(port, registry=registry)
    else:
        start_http_server(port)
    log.info("worker metrics on port %d", port)
