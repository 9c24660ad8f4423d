"""The HTTP edge's middleware: request bodies bounded before anything reads them (a 413
for a body over the limit, whether ``Content-Length`` says so up front or a chunked body
grows past it, with or without a token, so a large POST never costs the process its size
in memory), and an access log line per request."""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections.abc import Mapping
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

access_log = logging.getLogger("saga_tasks.web.access")

TOO_LARGE = {
    "type": "https://saga-tasks.dev/problems/body-too-large",
    "title": "Request body too large",
    "status": 413,
}


class BodyLimit:
    """ASGI middleware: at most ``limit`` bytes of request body reach the app."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.limit):
            await self._refuse(send)
            return
        seen = 0
        refused = False

        async def bounded_receive() -> Message:
            # Past the limit, the 413 goes out here and the app sees the client leave: a
            # framework that reads the body catches errors from it and answers 400 itself.
            nonlocal seen, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    refused = True
                    await self._refuse(send)
                    return {"type": "http.disconnect"}
            return message

        async def unless_refused(message: Message) -> None:
            if not refused:
                await send(message)

        await self.app(scope, bounded_receive, unless_refused)

    async def _refuse(self, send: Send) -> None:
        body: dict[str, Any] = {
            **TOO_LARGE,
            "detail": f"request bodies are limited to {self.limit} bytes (SAGA_API_MAX_BODY)",
        }
        payload = json.dumps(body).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/problem+json"),
                    (b"content-length", str(len(payload)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": payload})


class AccessLog:
    """One line per request: method, path, status, the actor its token names, duration.
    Never the Authorization header, the query's values or a body."""

    def __init__(self, app: ASGIApp, tokens: Mapping[str, str]) -> None:
        self.app = app
        self.tokens = dict(tokens)

    def _actor(self, scope: Scope) -> str:
        header = dict(scope.get("headers") or []).get(b"authorization", b"").decode("latin-1")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token:
            return "-"
        for known, name in self.tokens.items():
            if secrets.compare_digest(known.encode(), token.strip().encode()):
                return name
        return "(unknown token)"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = [0]

        async def noting_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, noting_send)
        finally:
            access_log.info(
                "%s %s %s %s %.1f ms",
                scope.get("method", "?"),
                scope.get("path", "?"),
                status[0] or 500,
                self._actor(scope),
                (time.perf_counter() - started) * 1000,
            )
