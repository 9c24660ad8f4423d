"""Request bodies bounded before anything reads them: a 413 for a body over the limit,
whether ``Content-Length`` says so up front or a chunked body grows past it, with or
without a token, so a large POST never costs the process its size in memory."""

from __future__ import annotations

import json
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

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
