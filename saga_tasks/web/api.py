"""The FastAPI application: its middleware, its state (the saga app, the token gate,
the redacted field names), problem+json errors, and the routers in matching order."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from saga_tasks.app import SagaApp
from saga_tasks.web.auth import Gate
from saga_tasks.web.dashboard import mount
from saga_tasks.web.docs import mount_docs
from saga_tasks.web.limits import AccessLog, BodyLimit
from saga_tasks.web.problems import PROBLEMS, install
from saga_tasks.web.redact import field_names
from saga_tasks.web.routes import held, operations, operators, sagas


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
    web.state.redacted = field_names(app.settings.redact_fields)
    install(web)
    # Order matters: /sagas/{saga_id}/migrate before /sagas/{saga_id}/{action}.
    for router in (operations.router, sagas.router, operators.router, held.router):
        web.include_router(router)
    _list_saga_types(web, sorted({d.saga_type for d in app.registry}))
    mount(web)
    mount_docs(web)
    return web


def _list_saga_types(web: FastAPI, saga_types: list[str]) -> None:
    """Name this app's saga types in the OpenAPI document, as the enum of the start
    route's path parameter (the routes are shared by every app; their types are not)."""
    plain = web.openapi

    def openapi() -> dict[str, Any]:
        schema = plain()
        start = schema["paths"]["/sagas/{saga_type}"]["post"]
        for parameter in start.get("parameters", []):
            if parameter["name"] == sagas.SAGA_TYPE:
                parameter["schema"]["enum"] = saga_types
        return schema

    web.openapi = openapi  # type: ignore[method-assign]
