"""JSON routes, problem+json errors, bearer tokens with scopes."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import Annotated, Any, Literal

from fastapi import Depends, FastAPI, Header, Path, Query, Request, Security
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    generate_latest,
)
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.orm import Session
from starlette.exceptions import HTTPException as StarletteHTTPException

from saga_tasks.app import SagaApp
from saga_tasks.core.states import SagaStatus
from saga_tasks.errors import (
    ActionRefused,
    BusinessKeyConflict,
    ConfigurationError,
    InputError,
    InvalidPayload,
    SagaNotFound,
    SagaOverloaded,
    SagaTasksError,
    ServiceUnavailable,
    UnknownDefinitionVersion,
    UnknownSagaType,
    VersionMismatch,
)
from saga_tasks.observability.tracing import TRACEPARENT
from saga_tasks.ops.operator import act as do
from saga_tasks.ops.operator import migrate as migrate_saga
from saga_tasks.ops.operator import signal as give_signal
from saga_tasks.ops.views import (
    HISTORY_PAGE,
    HISTORY_PAGE_MOST,
    held_list,
    held_outcome,
    held_show,
    list_view,
    saga_view,
    schedules_view,
)
from saga_tasks.ops.views import stuck as find_stuck
from saga_tasks.persistence import idempotency
from saga_tasks.persistence.db import check_database, translated
from saga_tasks.persistence.tables import saga_outbox
from saga_tasks.web.auth import OPERATE, READ, START, Caller, Forbidden, Gate, Unauthorized
from saga_tasks.web.dashboard import mount
from saga_tasks.web.docs import mount_docs
from saga_tasks.web.gauges import StateCollector
from saga_tasks.web.limits import AccessLog, BodyLimit
from saga_tasks.web.redact import field_names, held_view

log = logging.getLogger("saga_tasks.web")

PROBLEM = "application/problem+json"
PROBLEM_BASE = "https://saga-tasks.dev/problems/"


class Problem(Exception):
    """An error answered as problem+json."""

    def __init__(self, status: int, kind: str, title: str, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.status = status
        self.kind = kind
        self.title = title
        self.detail = detail
        self.extra = extra


def problem_response(p: Problem, instance: str | None = None) -> JSONResponse:
    body = {"type": PROBLEM_BASE + p.kind, "title": p.title, "status": p.status, "detail": p.detail}
    if instance:
        body["instance"] = instance
    body.update(p.extra)
    headers = None
    if p.status == 401:
        headers = {"WWW-Authenticate": 'Bearer realm="saga_tasks"'}
    elif p.status == 429 and "retry_after" in p.extra:
        headers = {"Retry-After": str(p.extra["retry_after"])}
    elif p.status == 403 and "missing_scope" in p.extra:  # RFC 6750, section 3
        headers = {
            "WWW-Authenticate": 'Bearer realm="saga_tasks", error="insufficient_scope", '
            f'scope="{p.extra["missing_scope"]}"'
        }
    return JSONResponse(body, status_code=p.status, media_type=PROBLEM, headers=headers)


def translate(exc: SagaTasksError) -> Problem:
    """Our errors, by kind, as HTTP problems."""
    if isinstance(exc, SagaNotFound):
        return Problem(404, "saga-not-found", "No such saga", str(exc))
    if isinstance(exc, UnknownSagaType):
        return Problem(404, "unknown-saga-type", "Unknown saga type", str(exc))
    if isinstance(exc, InvalidPayload):
        return Problem(422, "invalid-payload", "Invalid payload", str(exc))
    if isinstance(exc, BusinessKeyConflict):
        return Problem(
            409, "business-key-conflict", "Business key already used", str(exc), saga_id=exc.saga_id
        )
    if isinstance(exc, VersionMismatch):
        return Problem(
            409, "version-mismatch", "The saga moved on", str(exc), current_version=exc.current
        )
    if isinstance(exc, ActionRefused):
        return Problem(409, "action-refused", "Action refused", str(exc))
    if isinstance(exc, UnknownDefinitionVersion):
        return Problem(409, "version-not-loaded", "Definition version not loaded", str(exc))
    if isinstance(exc, InputError):
        return Problem(400, "bad-request", "Bad request", str(exc))
    if isinstance(exc, SagaOverloaded):
        return Problem(
            429, "overloaded", "Too many sagas in progress", str(exc), retry_after=exc.retry_after
        )
    if isinstance(exc, ServiceUnavailable):
        # Hosts, users and driver words stay in the server's log, not in a public answer.
        log.error("answering 503: %s", exc)
        return Problem(
            503,
            "service-unavailable",
            f"{exc.service} unavailable",
            f"{exc.service} did not answer; the server's log says more",
        )
    if isinstance(exc, ConfigurationError):
        return Problem(500, "configuration", "Server misconfigured", str(exc))
    return Problem(500, "internal", "Internal error", type(exc).__name__)


# -- request and response models ------------------------------------------------------------


class StartRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    business_key: str = Field(min_length=1, max_length=200)
    payload: dict[str, Any]


class StartResponse(BaseModel):
    saga_id: str
    saga_type: str
    business_key: str
    correlation_id: str
    status: SagaStatus
    created: bool
    status_url: str


class ActionRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str = Field(min_length=1, max_length=1000)
    expect_version: int = Field(ge=0)
    step: str | None = Field(default=None, max_length=200)
    status: Literal["COMPLETED", "COMPENSATED", "FAILED"] | None = None


class SignalRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    data: dict[str, Any]
    reason: str = Field(min_length=1, max_length=1000)
    expect_version: int | None = Field(default=None, ge=0)


class MigrateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str = Field(min_length=1, max_length=1000)
    to_version: int = Field(ge=1)
    expect_version: int | None = Field(default=None, ge=0)


class HeldActionRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str = Field(min_length=1, max_length=1000)
    force: bool = False
    force_reason: str | None = Field(default=None, max_length=1000)
    expect_version: int | None = Field(default=None, ge=0)


Action = Literal["retry-step", "skip-step", "compensate", "resolve"]
PROBLEMS: dict[int | str, dict[str, Any]] = {
    code: {"description": title, "content": {PROBLEM: {"schema": {"type": "object"}}}}
    for code, title in (
        (400, "Bad request"),
        (401, "Missing or unknown bearer token"),
        (403, "The token lacks the scope this operation needs"),
        (404, "Not found"),
        (409, "Conflict with the saga's state or version"),
        (422, "Invalid input"),
        (429, "Too many sagas in progress: retry after Retry-After seconds"),
        (503, "A backing service is unavailable"),
    )
}


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


BEARER = HTTPBearer(auto_error=False, description="A token of SAGA_API_TOKENS")


def needs(scope: str) -> Callable[..., Caller]:
    """A dependency: the caller, if its token (or public read) grants ``scope``."""

    def caller(
        request: Request,
        # Declared for the OpenAPI document (the Authorize button of /docs); the gate
        # reads the header itself, so a non-bearer scheme is answered like no token.
        _credentials: Annotated[HTTPAuthorizationCredentials | None, Security(BEARER)],
    ) -> Caller:
        gate: Gate = request.app.state.gate
        return gate.require(request.headers.get("authorization"), scope)

    return caller


Reader = Annotated[Caller, Depends(needs(READ))]
Operator = Annotated[Caller, Depends(needs(OPERATE))]
Starter = Annotated[Caller, Depends(needs(START))]


def build(app: SagaApp) -> FastAPI:
    web = FastAPI(
        title="saga_tasks",
        version="1",
        description="Start sagas, read them, and act on them as an operator. Every "
        "operation but /healthz and /metrics needs a bearer token with its scope: read, "
        "operate or start.",
        responses=PROBLEMS,
        docs_url=None,  # served by mount_docs from the package, not from a CDN
        redoc_url=None,
    )
    tokens = app.settings.tokens()
    web.add_middleware(BodyLimit, limit=app.settings.api_max_body)
    web.add_middleware(AccessLog, tokens={t: actor for t, (actor, _) in tokens.items()})
    web.state.saga_app = app
    web.state.gate = Gate(tokens, public_read=app.settings.api_public_read)
    redacted = field_names(app.settings.redact_fields)

    def held_for(caller: Caller, view: dict[str, Any]) -> dict[str, Any]:
        return held_view(view, body_shown=OPERATE in caller.scopes, names=redacted)

    def answer(caller: Caller, view: dict[str, Any]) -> dict[str, Any]:
        """What an action answers: the saga as it is now to a caller who may read it;
        to one who may not (``operate`` alone), only what it did."""
        if web.state.gate.reads(caller):
            return view
        return {"saga_id": view["saga_id"], "outcome": view["outcome"], "version": view["version"]}

    saga_types = sorted({d.saga_type for d in app.registry})

    @web.exception_handler(Problem)
    async def on_problem(request: Request, exc: Problem) -> JSONResponse:
        return problem_response(exc, request.url.path)

    @web.exception_handler(Unauthorized)
    async def on_unauthorized(request: Request, exc: Unauthorized) -> JSONResponse:
        return problem_response(
            Problem(401, "unauthorized", "Unauthorized", str(exc)), request.url.path
        )

    @web.exception_handler(Forbidden)
    async def on_forbidden(request: Request, exc: Forbidden) -> JSONResponse:
        problem = Problem(403, "forbidden", "Forbidden", str(exc), missing_scope=exc.scope)
        return problem_response(problem, request.url.path)

    @web.exception_handler(SagaTasksError)
    async def on_saga_error(request: Request, exc: SagaTasksError) -> JSONResponse:
        return problem_response(translate(exc), request.url.path)

    @web.exception_handler(RequestValidationError)
    async def on_invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', 'invalid')}"
            for e in exc.errors()
        )
        return problem_response(
            Problem(422, "invalid-request", "Invalid request", problems), request.url.path
        )

    @web.exception_handler(StarletteHTTPException)
    async def on_http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return problem_response(
            Problem(exc.status_code, "http", str(exc.detail), str(exc.detail)), request.url.path
        )

    # -- health and metrics ---------------------------------------------------------------

    @web.get("/healthz", tags=["operations"])
    def healthz() -> dict[str, str]:
        """Liveness, and whether PostgreSQL answers."""
        check_database(app.settings.database_url)
        return {"status": "ok"}

    @web.get("/metrics", tags=["operations"], response_class=Response)
    def metrics() -> Response:
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

    # -- sagas ----------------------------------------------------------------------------

    @web.post("/sagas/{saga_type}", status_code=202, response_model=StartResponse, tags=["sagas"])
    def start(
        request: Request,
        body: StartRequest,
        _caller: Starter,
        idempotency_key: Annotated[str, Header(min_length=1, max_length=200)],
        traceparent: Annotated[str | None, Header(max_length=100)] = None,
        # A default, not an annotation: the enum is this app's saga types.
        saga_type: str = Path(min_length=1, max_length=100, json_schema_extra={"enum": saga_types}),
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

    @web.get("/sagas/{saga_id}", tags=["sagas"], name="get_saga")
    def get_saga(
        saga_id: Annotated[str, Path(max_length=100)],
        _caller: Reader,
        history_limit: Annotated[int, Query(ge=1, le=HISTORY_PAGE_MOST)] = HISTORY_PAGE,
        history_before: Annotated[int | None, Query(ge=1, le=2**62)] = None,
    ) -> dict[str, Any]:
        """One saga: status, steps, a page of its history (newest first), its notes and
        held messages (never a payload or result). ``history_next`` is the cursor of the
        older page: pass it as ``history_before``; null on the last page."""
        return saga_view(app, saga_id, history_limit=history_limit, history_before=history_before)

    @web.get("/sagas", tags=["sagas"])
    def list_sagas(
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

    @web.post("/sagas/{saga_id}/migrate", tags=["operators"])
    def migrate(
        saga_id: Annotated[str, Path(max_length=100)], body: MigrateRequest, caller: Operator
    ) -> dict[str, Any]:
        """Move a saga to another version of its definition that this server loads (every
        step it began must be there unchanged), audited with the token's actor. Answers
        like every action: the saga, or without the read scope ``{saga_id, outcome,
        version}``."""
        view = migrate_saga(
            app,
            saga_id,
            body.to_version,
            actor=caller.name,
            reason=body.reason,
            expect_version=body.expect_version,
        )
        return answer(caller, view)

    @web.get("/schedules", tags=["sagas"])
    def schedules(_caller: Reader) -> dict[str, Any]:
        """The sagas started on a schedule: each schedule's saga type, cron or interval,
        next run, and last run (tick, saga and its status, or why it started none)."""
        return schedules_view(app)

    @web.post("/sagas/{saga_id}/{action}", tags=["operators"])
    def act(
        saga_id: Annotated[str, Path(max_length=100)],
        action: Action,
        body: ActionRequest,
        caller: Operator,
    ) -> dict[str, Any]:
        """An operator action, audited with the token's actor. Answers the saga as it is
        after it, with the ``outcome``; a token without the read scope is answered only
        ``{saga_id, outcome, version}``: acting on a saga is not reading it."""
        if action in ("retry-step", "skip-step") and not body.step:
            raise Problem(422, "invalid-request", "Invalid request", f"{action} needs a step")
        if action == "resolve" and not body.status:
            raise Problem(422, "invalid-request", "Invalid request", "resolve needs a status")
        view = do(
            app,
            saga_id,
            action.replace("-", "_"),
            actor=caller.name,
            reason=body.reason,
            expect_version=body.expect_version,
            step=body.step,
            resolution=body.status,
        )
        return answer(caller, view)

    @web.post("/sagas/{saga_id}/steps/{step}/signal", tags=["operators"])
    def signal(
        saga_id: Annotated[str, Path(max_length=100)],
        step: Annotated[str, Path(max_length=200)],
        body: SignalRequest,
        caller: Operator,
    ) -> dict[str, Any]:
        """A person's decision on a human step, audited with the token's actor. Data the
        step's schema refuses: 422, nothing changes; a step not waiting: 409. The same
        decision again is answered as a duplicate (``outcome``), whatever
        ``expect_version`` says, so a client may retry; another one is held to it.
        Answers like every action: the saga, or without the read scope ``{saga_id,
        outcome, version}``."""
        view = give_signal(
            app,
            saga_id,
            step,
            body.data,
            actor=caller.name,
            reason=body.reason,
            expect_version=body.expect_version,
        )
        return answer(caller, view)

    # -- held messages --------------------------------------------------------------------

    @web.get("/held", tags=["held messages"])
    def held_messages(
        _caller: Reader,
        holding: Literal["dead_letter", "parking"] = "dead_letter",
        status: Literal["pending", "replayed", "discarded", "all"] = "pending",
        saga_id: Annotated[str | None, Query(max_length=100)] = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    ) -> dict[str, Any]:
        """Messages taken off the dead-letter queue or the parking lot (no bodies)."""
        if saga_id is not None:
            try:
                saga_id = str(uuid.UUID(saga_id))
            except ValueError:
                raise Problem(
                    422, "invalid-request", "Invalid request", "saga_id is not a UUID"
                ) from None
        return held_list(
            app, holding, status=None if status == "all" else status, saga_id=saga_id, limit=limit
        )

    @web.get("/held/{held_id}", tags=["held messages"])
    def held_message(
        held_id: Annotated[int, Path(ge=1, le=2**62)], caller: Reader
    ) -> dict[str, Any]:
        """One held message, with the checks a replay would run now. Its body and headers
        only for the operate scope, with the fields of SAGA_REDACT_FIELDS masked."""
        try:
            return held_for(caller, held_show(app, held_id))
        except InputError as exc:
            raise Problem(404, "held-message-not-found", "No such held message", str(exc)) from exc

    @web.post("/held/{held_id}/{verb}", tags=["held messages"])
    def held_action(
        held_id: Annotated[int, Path(ge=1, le=2**62)],
        verb: Literal["replay", "discard"],
        body: HeldActionRequest,
        caller: Operator,
    ) -> dict[str, Any]:
        """Replay (after its checks) or discard a held message, audited with the token's
        actor. Answers the held message as it is now; a token without the read scope is
        answered only ``{held_id, saga_id, outcome, version}`` (the saga's version)."""
        try:
            if verb == "replay":
                app.replayer.replay(
                    held_id,
                    actor=caller.name,
                    reason=body.reason,
                    force=body.force,
                    force_reason=body.force_reason,
                    expect_version=body.expect_version,
                )
            else:
                app.replayer.discard(held_id, actor=caller.name, reason=body.reason)
        except ActionRefused:
            raise
        except InputError as exc:
            if "no held message" in str(exc):
                raise Problem(
                    404, "held-message-not-found", "No such held message", str(exc)
                ) from exc
            raise
        if web.state.gate.reads(caller):
            return held_for(caller, held_show(app, held_id))
        return held_outcome(app, held_id)

    mount(web, app)
    mount_docs(web)
    return web
