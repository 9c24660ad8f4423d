"""Prometheus metrics every saga_tasks process updates (served by the web app and workers)."""

from __future__ import annotations

from prometheus_client import Counter

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
PUBLISH_FAILURES = Counter(
    "saga_publish_failures_total", "Publishes the broker did not confirm", ["path"]
)
OUTBOX_RECOVERED = Counter(
    "saga_outbox_recovered_total", "Outbox rows published by recovery", ["outbox"]
)
