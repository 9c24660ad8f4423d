"""What every route depends on: the saga app it serves, the caller and its scopes, and
how an action answers a caller who may not read."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import Depends, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from saga_tasks.app import SagaApp
from saga_tasks.web.auth import OPERATE, READ, START, Caller, Gate
from saga_tasks.web.redact import held_view

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


def served(request: Request) -> SagaApp:
    """The saga app this web app serves (``build`` keeps it in the app's state)."""
    app: SagaApp = request.app.state.saga_app
    return app


Reader = Annotated[Caller, Depends(needs(READ))]
Operator = Annotated[Caller, Depends(needs(OPERATE))]
Starter = Annotated[Caller, Depends(needs(START))]
App = Annotated[SagaApp, Depends(served)]


def answer(request: Request, caller: Caller, view: dict[str, Any]) -> dict[str, Any]:
    """What an action answers: the saga as it is now to a caller who may read it; to one
    who may not (``operate`` alone), only what it did."""
    if request.app.state.gate.reads(caller):
        return view
    return {"saga_id": view["saga_id"], "outcome": view["outcome"], "version": view["version"]}


def held_for(request: Request, caller: Caller, view: dict[str, Any]) -> dict[str, Any]:
    """A held message as ``caller`` may see it: its body only with ``operate``, the
    fields of ``SAGA_REDACT_FIELDS`` masked."""
    names = request.app.state.redacted
    return held_view(view, body_shown=OPERATE in caller.scopes, names=names)
