"""Starting sagas (idempotent by ``Idempotency-Key``), reading one, listing them, and the
sagas started on a schedule."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, Path, Query, Request
from sqlalchemy.orm import Session

from saga_tasks.app import SagaApp
from saga_tasks.core.states import SagaStatus
from saga_tasks.errors import BusinessKeyConflict
from saga_tasks.observability.tracing import TRACEPARENT
from saga_tasks.ops.views import (
    HISTORY_PAGE,
    HISTORY_PAGE_MOST,
    list_view,
    saga_view,
    schedules_view,
)
from saga_tasks.ops.views import stuck as find_stuck
from saga_tasks.persistence import idempotency
from saga_tasks.persistence.db import translated
from saga_tasks.web.deps import App, Reader, Starter
from saga_tasks.web.models import StartRequest, StartResponse
from saga_tasks.web.problems import Problem

router = APIRouter(tags=["sagas"])

SAGA_TYPE = "saga_type"
"""The path parameter whose values ``build`` lists in the OpenAPI document (this app's)."""


@router.post("/sagas/{saga_type}", status_code=202, response_model=StartResponse)
def start(
    request: Request,
    app: App,
    body: StartRequest,
    _caller: Starter,
    saga_type: Annotated[str, Path(min_length=1, max_length=100)],
    idempotency_key: Annotated[str, Header(min_length=1, max_length=200)],
    traceparent: Annotated[str | None, Header(max_length=100)] = None,
) -> StartResponse:
    """Start a saga. Repeating a request with the same ``Idempotency-Key`` returns the
    first answer; the same key with another body is a conflict. One key starts at
    most one saga, however many requests with it arrive at once."""
    digest = idempotency.request_hash(saga_type, body.business_key, body.payload)
    with translated(app.settings.database_url), app.engine.connect() as conn:
        stored = idempotency.find(conn, idempotency_key)  # a repeat: no start at all
    created = False
    if stored is None:
        if traceparent is not None and not TRACEPARENT.match(traceparent):
            traceparent = None  # a malformed header starts a new trace, as W3C asks
        stored, created = start_once(
            app, idempotency_key, digest, saga_type, body, traceparent=traceparent
        )
    if stored.request_hash != digest:
        raise Problem(
            409,
            "idempotency-key-reused",
            "Idempotency-Key reused",
            "this Idempotency-Key was used for another request",
        )
    state = app.orchestrator.get(stored.saga_id)
    return StartResponse(
        saga_id=state.saga_id,
        saga_type=state.saga_type,
        business_key=state.business_key,
        correlation_id=state.correlation_id or state.saga_id,
        status=state.status,
        created=created,
        status_url=app.settings.api_base_url.rstrip("/")
        + request.app.url_path_for("get_saga", saga_id=state.saga_id),
    )


def start_once(
    app: SagaApp,
    key: str,
    digest: str,
    saga_type: str,
    body: StartRequest,
    *,
    traceparent: str | None,
) -> tuple[idempotency.StoredKey, bool]:
    """Start the saga and claim ``key`` in one transaction; what the key stands for
    afterwards, and whether this call created the saga.

    A request that finds the key claimed by another transaction (it waits until that one
    commits) rolls its own start back, so it has written and sent nothing, and is answered
    from the stored key like any repeat.
    """
    url = app.settings.database_url
    with translated(url), Session(app.engine) as session:
        try:
            handle = app.start_saga(
                saga_type, body.business_key, body.payload, session=session, traceparent=traceparent
            )
        except BusinessKeyConflict:
            # The saga of this business key may come from a request with this very key
            # (same business key, another payload): then the key is what was reused.
            session.rollback()
            with app.engine.connect() as conn:
                stored = idempotency.find(conn, key)
            if stored is None:
                raise
            return stored, False
        if idempotency.claim(session.connection(), key, digest, handle.saga_id):
            session.commit()
            return idempotency.StoredKey(digest, handle.saga_id), handle.created
        session.rollback()
    with translated(url), app.engine.connect() as conn:
        stored = idempotency.find(conn, key)
    if stored is None:  # keys are never deleted; only a hand in the database gets here
        raise Problem(
            409,
            "idempotency-key-removed",
            "Idempotency-Key removed",
            "the Idempotency-Key was removed while this request waited for it; send it again",
        )
    return stored, False


@router.get("/sagas/{saga_id}", name="get_saga")
def get_saga(
    app: App,
    saga_id: Annotated[str, Path(max_length=100)],
    _caller: Reader,
    history_limit: Annotated[int, Query(ge=1, le=HISTORY_PAGE_MOST)] = HISTORY_PAGE,
    history_before: Annotated[int | None, Query(ge=1, le=2**62)] = None,
) -> dict[str, Any]:
    """One saga: status, steps, a page of its history (newest first), its notes and
    held messages (never a payload or result). ``history_next`` is the cursor of the
    older page: pass it as ``history_before``; null on the last page."""
    return saga_view(app, saga_id, history_limit=history_limit, history_before=history_before)


@router.get("/sagas")
def list_sagas(
    app: App,
    _caller: Reader,
    status: SagaStatus | None = None,
    saga_type: Annotated[str | None, Query(alias="type", max_length=100)] = None,
    business_key: Annotated[str | None, Query(max_length=200)] = None,
    stuck: bool = False,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
) -> dict[str, Any]:
    """Sagas, newest first; ``stuck=true``: active ones with no change for
    ``SAGA_STUCK_AFTER`` seconds, longest idle first, each with ``idle_seconds``.
    The other filters apply to both."""
    if saga_type is not None:
        app.registry.latest(saga_type)
    if stuck:
        found = find_stuck(
            app,
            limit=limit,
            status=status.value if status else None,
            saga_type=saga_type,
            business_key=business_key,
        )
        return {
            "sagas": found["stuck"],
            "count": found["count"],
            "older_than_seconds": found["older_than_seconds"],
        }
    return list_view(
        app, status=status, saga_type=saga_type, business_key=business_key, limit=limit
    )


@router.get("/schedules")
def schedules(app: App, _caller: Reader) -> dict[str, Any]:
    """The sagas started on a schedule: each schedule's saga type, cron or interval,
    next run, and last run (tick, saga and its status, or why it started none)."""
    return schedules_view(app)
