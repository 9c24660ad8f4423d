"""Messages that make no sense: recorded with their reason, counted and logged, never retried.

Only identifying headers are kept; the body is kept as a digest and a size, so a
record never copies payload data (which may hold personal data) out of its message.
Whatever came from the message is escaped where PostgreSQL could not store it
(``persistence.storable``): a NUL in a task name or an id is a reason to record the
message, never a reason to fail recording it.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from typing import Any

from sqlalchemy import Engine

from saga_tasks.core.messages import SAGA_HEADERS
from saga_tasks.errors import InputError, ServiceUnavailable
from saga_tasks.observability import metrics
from saga_tasks.persistence import inbox, storable
from saga_tasks.persistence.db import translated

log = logging.getLogger("saga_tasks.runtime.invalid")

_KEPT_HEADERS = SAGA_HEADERS | {"task", "id", "x-first-death-reason", "x-first-death-queue"}


def safe_headers(headers: Mapping[str, Any] | None) -> dict[str, Any]:
    """The identifying headers only, each value cut to a bounded, storable string."""
    kept: dict[str, Any] = {}
    for key, value in (headers or {}).items():
        if key in _KEPT_HEADERS:
            kept[key] = value if isinstance(value, int) else storable.text(str(value))[:200]
    return kept


def body_digest(body: Any) -> tuple[str | None, int | None]:
    if body is None:
        return None, None
    if isinstance(body, str):
        raw = body.encode("utf-8", "surrogatepass")
    elif isinstance(body, bytes | bytearray | memoryview):
        raw = bytes(body)
    else:
        raw = json.dumps(body, sort_keys=True, default=str).encode()
    return hashlib.sha256(raw).hexdigest(), len(raw)


def observe(
    *,
    consumer: str,
    reason: str,
    message_id: str | None,
    headers: Mapping[str, Any] | None,
    queue: str | None = None,
) -> dict[str, Any]:
    """Count and log an invalid message; the log fields. A participant does only this: its
    worker parks the message, and the orchestrator's intake keeps the parked copy with
    its reason (a participant's database holds no saga tables)."""
    saga_id = safe_headers(headers).get("saga_id")
    metrics.INVALID_MESSAGES.labels(consumer=consumer).inc()
    metrics.MESSAGES.labels(consumer=consumer, classification="invalid").inc()
    fields = {"saga_id": saga_id, "message_id": message_id, "consumer": consumer, "queue": queue}
    log.warning("invalid message: %s", reason, extra=fields)
    return fields


def record(
    engine: Engine,
    *,
    consumer: str,
    reason: str,
    task_name: str | None,
    message_id: str | None,
    headers: Mapping[str, Any] | None,
    body: Any,
    queue: str | None = None,
    routing_key: str | None = None,
) -> None:
    """Write the record in its own transaction; log loudly if even that fails.

    Every value is escaped where PostgreSQL could not store it. Should the row still be
    refused (a bug), a reduced row (no headers, no ids, the refusal in its reason) is
    written instead; only an outage (``ServiceUnavailable``) is raised.
    """
    headers_kept = safe_headers(headers)
    saga_id = headers_kept.get("saga_id")
    digest, size = body_digest(body)
    task_name = storable.optional_text(task_name)
    message_id = storable.optional_text(message_id)
    reason = storable.text(reason)
    fields = observe(
        consumer=consumer, reason=reason, message_id=message_id, headers=headers, queue=queue
    )
    row: dict[str, Any] = {
        "consumer": storable.text(consumer),
        "reason": reason,
        "queue": storable.optional_text(queue),
        "routing_key": storable.optional_text(routing_key),
        "task_name": task_name,
        "message_id": message_id,
        "saga_id": str(saga_id) if saga_id else None,
        "headers": headers_kept,
        "body_sha256": digest,
        "body_size": size,
    }
    try:
        try:
            _write(engine, row)
        except InputError as refused:
            log.exception("invalid message refused by the database; recorded reduced", extra=fields)
            reduced = dict.fromkeys(("queue", "routing_key", "task_name", "message_id"))
            _write(
                engine,
                {
                    **row,
                    **reduced,
                    "saga_id": None,
                    "headers": {},
                    "reason": f"{reason}; recorded reduced: {refused}"[:1000],
                },
            )
    except ServiceUnavailable:
        log.exception("could not record an invalid message", extra=fields)
        raise


def _write(engine: Engine, row: dict[str, Any]) -> None:
    with translated(engine.url), engine.begin() as conn:
        inbox.record_invalid(conn, **row)
