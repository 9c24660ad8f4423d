"""The HTTP edge: a JSON API (start, read, operator actions), ``/metrics`` and a dashboard.

    saga-tasks web [--host 127.0.0.1] [--port 8000]

Errors are ``application/problem+json`` (RFC 9457). Everything but ``/healthz`` and
``/metrics`` needs ``Authorization: Bearer <token>`` with a scope (read, operate, start;
``SAGA_API_TOKENS``, ``SAGA_API_PUBLIC_READ``); the token names the actor written to the
saga's history. The operator functions are those of the CLI.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fastapi import FastAPI

    from saga_tasks.app import SagaApp


def create_web_app(saga_app: SagaApp) -> FastAPI:
    """The FastAPI application serving ``saga_app``."""
    from saga_tasks.web.api import build

    return build(saga_app)


__all__ = ["create_web_app"]
