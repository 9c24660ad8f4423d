"""Errors answered as ``application/problem+json`` (RFC 9457): our errors by kind, the
security headers a 401, 403 or 429 needs, and the handlers a FastAPI app installs."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from saga_tasks.errors import (
    ActionRefused,
    BusinessKeyConflict,
    ConfigurationError,
    InputError,
    InvalidPayload,
    SagaNotFound,
    SagaOverloaded,
    SagaPurged,
    SagaTasksError,
    ServiceUnavailable,
    UnknownDefinitionVersion,
    UnknownSagaType,
    VersionMismatch,
)
from saga_tasks.web.auth import Forbidden, Unauthorized

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


def invalid(detail: str) -> Problem:
    """A request the routes' own checks refuse (422), as the validator's are answered."""
    return Problem(422, "invalid-request", "Invalid request", detail)


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


def _unavailable(exc: ServiceUnavailable) -> Problem:
    # Hosts, users and driver words stay in the server's log, not in a public answer.
    log.error("answering 503: %s", exc)
    return Problem(
        503,
        "service-unavailable",
        f"{exc.service} unavailable",
        f"{exc.service} did not answer; the server's log says more",
    )


_KINDS: tuple[tuple[type[SagaTasksError], Callable[[Any], Problem]], ...] = (
    # Most specific first: InvalidPayload and UnknownSagaType are InputErrors too.
    (
        SagaPurged,
        lambda e: Problem(
            410, "saga-purged", "Saga purged after its retention", str(e), status_was=e.status
        ),
    ),
    (SagaNotFound, lambda e: Problem(404, "saga-not-found", "No such saga", str(e))),
    (UnknownSagaType, lambda e: Problem(404, "unknown-saga-type", "Unknown saga type", str(e))),
    (InvalidPayload, lambda e: Problem(422, "invalid-payload", "Invalid payload", str(e))),
    (
        BusinessKeyConflict,
        lambda e: Problem(
            409, "business-key-conflict", "Business key already used", str(e), saga_id=e.saga_id
        ),
    ),
    (
        VersionMismatch,
        lambda e: Problem(
            409, "version-mismatch", "The saga moved on", str(e), current_version=e.current
        ),
    ),
    (ActionRefused, lambda e: Problem(409, "action-refused", "Action refused", str(e))),
    (
        UnknownDefinitionVersion,
        lambda e: Problem(409, "version-not-loaded", "Definition version not loaded", str(e)),
    ),
    (InputError, lambda e: Problem(400, "bad-request", "Bad request", str(e))),
    (
        SagaOverloaded,
        lambda e: Problem(
            429, "overloaded", "Too many sagas in progress", str(e), retry_after=e.retry_after
        ),
    ),
    (ServiceUnavailable, _unavailable),
    (ConfigurationError, lambda e: Problem(500, "configuration", "Server misconfigured", str(e))),
)


def translate(exc: SagaTasksError) -> Problem:
    """Our errors, by kind, as HTTP problems (the first kind in ``_KINDS`` it is)."""
    for kind, problem in _KINDS:
        if isinstance(exc, kind):
            return problem(exc)
    return Problem(500, "internal", "Internal error", type(exc).__name__)


PROBLEMS: dict[int | str, dict[str, Any]] = {
    code: {"description": title, "content": {PROBLEM: {"schema": {"type": "object"}}}}
    for code, title in (
        (400, "Bad request"),
        (401, "Missing or unknown bearer token"),
        (403, "The token lacks the scope this operation needs"),
        (404, "Not found"),
        (410, "The saga was purged after its retention"),
        (409, "Conflict with the saga's state or version"),
        (422, "Invalid input"),
        (429, "Too many sagas in progress: retry after Retry-After seconds"),
        (503, "A backing service is unavailable"),
    )
}
"""The problem answers every operation may give, for the OpenAPI document."""


def install(web: FastAPI) -> None:
    """Answer every error of ``web`` as problem+json."""

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
        return problem_response(invalid(problems), request.url.path)

    @web.exception_handler(StarletteHTTPException)
    async def on_http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return problem_response(
            Problem(exc.status_code, "http", str(exc.detail), str(exc.detail)), request.url.path
        )
