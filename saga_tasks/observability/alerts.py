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
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Protocol

from sqlalchemy import Connection, case, delete, func, literal, select
from sqlalchemy.dialects.postgresql import insert as pg_insert

from saga_tasks.persistence.db import translated
from saga_tasks.persistence.tables import alert_sent, saga_instance

if TYPE_CHECKING:
    from saga_tasks.app import SagaApp

log = logging.getLogger("saga_tasks.observability.alerts")

STUCK = "stuck"
MANUAL_REVIEW = "manual_review"


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
        log.error(
            "ALERT %s: saga %s (%s) is %s, idle %.0f s%s",
            alert.condition,
            alert.saga_id,
            alert.saga_type,
            alert.status,
            alert.idle_seconds,
            f": {alert.reason}" if alert.reason else "",
            extra={"saga_id": alert.saga_id, "saga_type": alert.saga_type, "reason": alert.reason},
        )


class WebhookAlerter:
    """POSTs each alert as JSON; a failure raises, so the alert is tried again later."""

    name = "webhook"

    def __init__(self, url: str, timeout: float = 5.0) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError("SAGA_ALERT_WEBHOOK must be an http(s) URL")
        self.url = url
        self.timeout = timeout

    def send(self, alert: Alert) -> None:
        request = urllib.request.Request(  # noqa: S310 - the scheme is checked above
            self.url,
            data=json.dumps({"kind": "saga_alert", **asdict(alert)}).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:  # noqa: S310
                response.read()
        except urllib.error.HTTPError as error:
            error.close()  # an HTTP error holds its response open
            raise


def alerters_for(app: SagaApp) -> list[Alerter]:
    found: list[Alerter] = [LogAlerter()]
    if app.settings.alert_webhook:
        found.append(WebhookAlerter(app.settings.alert_webhook))
    return found


def scan(app: SagaApp, alerters: Sequence[Alerter] | None = None, *, limit: int = 500) -> int:
    """Send the alerts due now; the number sent."""
    alerters = list(alerters) if alerters is not None else alerters_for(app)
    now = app.clock.now()
    cutoff = now - timedelta(seconds=app.settings.stuck_after)
    condition_sql = case(
        (saga_instance.c.status == "MANUAL_REVIEW", literal(MANUAL_REVIEW)), else_=literal(STUCK)
    )
    claimed = (
        select(func.count())
        .where(
            alert_sent.c.saga_id == saga_instance.c.saga_id,
            alert_sent.c.condition.like(condition_sql + literal("@%")),
        )
        .scalar_subquery()
    )
    due = (
        select(
            saga_instance.c.saga_id,
            saga_instance.c.saga_type,
            saga_instance.c.status,
            saga_instance.c.status_reason,
            saga_instance.c.updated_at,
        )
        .where(
            (saga_instance.c.status == "MANUAL_REVIEW")
            | (
                saga_instance.c.status.in_(("RUNNING", "COMPENSATING"))
                & (saga_instance.c.updated_at < cutoff)
            ),
            claimed < len(alerters),  # sagas every channel was told about are left alone
        )
        .order_by(saga_instance.c.updated_at)
        .limit(limit)
    )
    sent = 0
    with translated(app.settings.database_url), app.engine.begin() as conn:
        _forget_ended(conn, cutoff)
        candidates = conn.execute(due).all()
    for row in candidates:
        condition = MANUAL_REVIEW if row.status == "MANUAL_REVIEW" else STUCK
        alert = Alert(
            condition=condition,
            saga_id=str(row.saga_id),
            saga_type=row.saga_type,
            status=row.status,
            reason=row.status_reason,
            idle_seconds=round((now - row.updated_at).total_seconds(), 1),
        )
        for alerter in alerters:
            sent += _send_once(app, alert, alerter)
    return sent


def _forget_ended(conn: Connection, cutoff: datetime) -> None:
    """Drop the claims of conditions that no longer hold (and of sagas gone)."""
    s = saga_instance.c
    still = (
        select(literal(1))
        .where(s.saga_id == alert_sent.c.saga_id)
        .where(
            (alert_sent.c.condition.like(f"{MANUAL_REVIEW}@%") & (s.status == "MANUAL_REVIEW"))
            | (
                alert_sent.c.condition.like(f"{STUCK}@%")
                & s.status.in_(("RUNNING", "COMPENSATING"))
                & (s.updated_at < cutoff)
            )
        )
    )
    conn.execute(delete(alert_sent).where(~still.exists()))


def _send_once(app: SagaApp, alert: Alert, alerter: Alerter) -> int:
    """Claim (saga, condition, channel), send, and give the claim back if sending failed."""
    key = f"{alert.condition}@{alerter.name}"
    claim = (
        pg_insert(alert_sent)
        .values(saga_id=alert.saga_id, condition=key)
        .on_conflict_do_nothing(constraint="pk_alert_sent")
        .returning(alert_sent.c.saga_id)
    )
    with translated(app.settings.database_url), app.engine.begin() as conn:
        if conn.execute(claim).first() is None:
            return 0
    try:
        alerter.send(alert)
    except (OSError, urllib.error.URLError, ValueError) as exc:
        log.warning("alerter %s failed: %s", alerter.name, exc, extra={"saga_id": alert.saga_id})
        with translated(app.settings.database_url), app.engine.begin() as conn:
            conn.execute(
                delete(alert_sent).where(
                    alert_sent.c.saga_id == alert.saga_id, alert_sent.c.condition == key
                )
            )
        return 0
    return 1
