"""The ``saga.alert_sent`` claims: which saga each channel was told about, per condition."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Connection, case, delete, func, literal, select
from sqlalchemy.dialects.postgresql import insert as pg_insert

from saga_tasks.core.states import ACTIVE_SAGA, SagaStatus
from saga_tasks.persistence.tables import alert_sent, saga_instance

STUCK = "stuck"
MANUAL_REVIEW = "manual_review"
_ACTIVE = tuple(s.value for s in ACTIVE_SAGA)
_REVIEW = SagaStatus.MANUAL_REVIEW.value


def due(conn: Connection, cutoff: datetime, channels: int, limit: int) -> list[Any]:
    """Sagas in review, or active and unchanged since ``cutoff``, that not every one of
    ``channels`` was told about; oldest change first."""
    s = saga_instance.c
    condition = case((s.status == _REVIEW, literal(MANUAL_REVIEW)), else_=literal(STUCK))
    claimed = (
        select(func.count())
        .where(
            alert_sent.c.saga_id == s.saga_id,
            alert_sent.c.condition.like(condition + literal("@%")),
        )
        .scalar_subquery()
    )
    query = (
        select(s.saga_id, s.saga_type, s.status, s.status_reason, s.updated_at)
        .where(
            (s.status == _REVIEW) | (s.status.in_(_ACTIVE) & (s.updated_at < cutoff)),
            claimed < channels,
        )
        .order_by(s.updated_at)
        .limit(limit)
    )
    return list(conn.execute(query).all())


def forget_ended(conn: Connection, cutoff: datetime) -> None:
    """Drop the claims of conditions that no longer hold (and of sagas gone)."""
    s = saga_instance.c
    still = (
        select(literal(1))
        .where(s.saga_id == alert_sent.c.saga_id)
        .where(
            (alert_sent.c.condition.like(f"{MANUAL_REVIEW}@%") & (s.status == _REVIEW))
            | (
                alert_sent.c.condition.like(f"{STUCK}@%")
                & s.status.in_(_ACTIVE)
                & (s.updated_at < cutoff)
            )
        )
    )
    conn.execute(delete(alert_sent).where(~still.exists()))


def claim(conn: Connection, saga_id: str, key: str) -> bool:
    """Claim (saga, condition@channel); False when it was claimed before."""
    inserted = conn.execute(
        pg_insert(alert_sent)
        .values(saga_id=saga_id, condition=key)
        .on_conflict_do_nothing(constraint="pk_alert_sent")
        .returning(alert_sent.c.saga_id)
    ).first()
    return inserted is not None


def release(conn: Connection, saga_id: str, key: str) -> None:
    conn.execute(
        delete(alert_sent).where(alert_sent.c.saga_id == saga_id, alert_sent.c.condition == key)
    )
