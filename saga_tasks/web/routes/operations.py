"""Liveness and Prometheus metrics: the two routes that need no token."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest

from saga_tasks.persistence.db import check_database
from saga_tasks.persistence.tables import saga_outbox
from saga_tasks.web.deps import App
from saga_tasks.web.gauges import StateCollector

router = APIRouter(tags=["operations"])


@router.get("/healthz")
def healthz(app: App) -> dict[str, str]:
    """Liveness, and whether PostgreSQL answers."""
    check_database(app.settings.database_url)
    return {"status": "ok"}


@router.get("/metrics", response_class=Response)
def metrics(app: App) -> Response:
    """Prometheus text: this process's counters and the state gauges read now."""
    state = CollectorRegistry(auto_describe=False)
    state.register(
        StateCollector(
            engine=lambda: app.engine,
            # The saga database only: a participant's own database is not the web app's
            # (one that shares the orchestrator's has its outbox lag shown too).
            outbox_tables=(
                [saga_outbox] if app.settings.participants_apart else app.outbox_tables()
            ),
            command_queues=app.topology.command_queues,
            broker_url=app.settings.broker_url,
        )
    )
    return Response(
        generate_latest(REGISTRY) + generate_latest(state), media_type=CONTENT_TYPE_LATEST
    )
