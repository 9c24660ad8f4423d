"""What beat runs, and how often: every entry on the maintenance queue, expiring when a
newer one would run anyway (a backlog never piles up copies of the same job)."""

from __future__ import annotations

from typing import Any

from saga_tasks.config import Settings
from saga_tasks.messaging.topology import MAINTENANCE_QUEUE

HOUSEKEEPING_INTERVAL = 3600.0
FIRE_SCHEDULE_TASK = "saga_tasks.fire_schedule"
"""The firing of one tick of a schedule: sent by beat (``saga_tasks.worker.scheduler``),
run by a maintenance worker (``saga_tasks.runtime.schedules``)."""


def beat_schedule(
    settings: Settings,
    *,
    relay: str,
    intake: str,
    alerts: str,
    sample: str,
    sweep: str,
    housekeeping: str,
) -> dict[str, dict[str, Any]]:
    def entry(task: str, every: float, expires: float) -> dict[str, Any]:
        return {
            "task": task,
            "schedule": every,
            "options": {"expires": max(expires, 1.0), "queue": MAINTENANCE_QUEUE},
        }

    return {
        "saga-outbox-recovery": entry(relay, settings.relay_interval, settings.relay_interval * 2),
        "saga-held-intake": entry(intake, settings.intake_interval, settings.intake_interval * 2),
        "saga-alert-scan": entry(alerts, settings.alert_interval, settings.alert_interval * 2),
        "saga-status-sample": entry(sample, settings.sample_interval, settings.sample_interval),
        "saga-timeout-sweep": entry(sweep, settings.sweep_interval, settings.sweep_interval * 2),
        "saga-housekeeping": entry(housekeeping, HOUSEKEEPING_INTERVAL, HOUSEKEEPING_INTERVAL),
    }
