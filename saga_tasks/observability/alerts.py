"""Alerts on sagas that need a person: once per saga and condition, to a log and a webhook.

Conditions: ``stuck`` (active, no change for ``SAGA_STUCK_AFTER`` seconds) and
``manual_review``. A beat task scans for them; a row per (saga, condition) in
``saga.alert_sent`` makes each alert go out once, even when scans overlap. If an
alerter fails, its row is removed so the next scan tries again. When a condition ends
(the stuck saga moved, the saga left review), its rows are removed too, so the next
time that saga gets stuck or needs a person, it is an alert again. Alerts carry ids,
statuses and reasons, never payloads.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Protocol

from sqlalchemy import Engine

from saga_tasks.core.clock import Clock
from saga_tasks.core.states import SagaStatus
from saga_tasks.errors import ServiceUnavailable, WebhookRefused
from saga_tasks.observability import logs, webhook
from saga_tasks.persistence import alerts as alert_sql
from saga_tasks.persistence.alerts import MANUAL_REVIEW, STUCK
from saga_tasks.persistence.db import translated

log = logging.getLogger("saga_tasks.observability.alerts")


@dataclass(frozen=True)
class Alert:
    condition: str
    saga_id: str
    saga_type: str
    status: str
    reason: str | None
    idle_seconds: float


class Alerter(Protocol):
    name: str
    """Names the channel: each alert goes out once per channel."""

    def send(self, alert: Alert) -> None: ...


class LogAlerter:
    """An ERROR line with the saga's identifiers: what a log-based pager picks up."""

    name = "log"

    def send(self, alert: Alert) -> None:
        logs.alert(
            log,
            "%s: saga %s (%s) is %s, idle %.0f s%s",
            alert.condition,
            alert.saga_id,
            alert.saga_type,
            alert.status,
            alert.idle_seconds,
            f": {alert.reason}" if alert.reason else "",
            saga_id=alert.saga_id,
            saga_type=alert.saga_type,
            reason=alert.reason,
        )


class WebhookAlerter:
    """POSTs each alert as JSON (``observability.webhook``: to no local address unless
    allowed, following no redirect); a failure raises, so the alert is tried again later."""

    name = "webhook"

    def __init__(self, url: str, timeout: float = 5.0, *, allow_local: bool = False) -> None:
        webhook.check_url(url, allow_local=allow_local, resolve=False)
        self.url = url
        self.timeout = timeout
        self.allow_local = allow_local

    def send(self, alert: Alert) -> None:
        body = json.dumps({"kind": "saga_alert", **asdict(alert)}).encode()
        webhook.post(self.url, body, timeout=self.timeout, allow_local=self.allow_local)


def alerters_for(webhook_url: str | None, *, allow_local: bool = False) -> list[Alerter]:
    """The log channel, and the webhook when one is configured."""
    found: list[Alerter] = [LogAlerter()]
    if webhook_url:
        found.append(WebhookAlerter(webhook_url, allow_local=allow_local))
    return found


class AlertScan:
    """Sends the alerts due now, once per saga, condition and channel."""

    def __init__(
        self,
        *,
        engine: Callable[[], Engine],
        clock: Clock,
        stuck_after: float,
        alerters: Sequence[Alerter],
    ) -> None:
        self._engine = engine
        self.clock = clock
        self.stuck_after = stuck_after
        self.alerters = list(alerters)

    def scan(self, *, limit: int = 500) -> int:
        """Send the alerts due now; the number sent."""
        engine = self._engine()
        now = self.clock.now()
        cutoff = now - timedelta(seconds=self.stuck_after)
        with translated(engine.url), engine.begin() as conn:
            alert_sql.forget_ended(conn, cutoff)
            candidates = alert_sql.due(conn, cutoff, len(self.alerters), limit)
        sent = 0
        for row in candidates:
            condition = MANUAL_REVIEW if row.status == SagaStatus.MANUAL_REVIEW.value else STUCK
            alert = Alert(
                condition=condition,
                saga_id=str(row.saga_id),
                saga_type=row.saga_type,
                status=row.status,
                reason=row.status_reason,
                idle_seconds=round((now - row.updated_at).total_seconds(), 1),
            )
            for alerter in self.alerters:
                sent += self._send_once(engine, alert, alerter)
        return sent

    def _send_once(self, engine: Engine, alert: Alert, alerter: Alerter) -> int:
        """Claim (saga, condition, channel), send, and give the claim back if sending failed."""
        key = f"{alert.condition}@{alerter.name}"
        with translated(engine.url), engine.begin() as conn:
            if not alert_sql.claim(conn, alert.saga_id, key):
                return 0
        try:
            alerter.send(alert)
        except (OSError, ValueError, ServiceUnavailable, WebhookRefused) as exc:
            log.warning(
                "alerter %s failed: %s", alerter.name, exc, extra={"saga_id": alert.saga_id}
            )
            with translated(engine.url), engine.begin() as conn:
                alert_sql.release(conn, alert.saga_id, key)
            return 0
        return 1
