"""What travels between the orchestrator and participants, and how it is read back.

Identity travels in message headers (so the DLQ, Flower and the logs can name the
saga without opening the body); business data travels in the task's kwargs and
holds references and small values only. The Celery task id is the message id.

Header names carry a ``saga_`` prefix: Celery merges custom headers into the task
request, where plain names such as ``correlation_id`` would shadow its own fields.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from saga_tasks.core.events import ReplyReceived
from saga_tasks.core.states import MessageKind, Outcome
from saga_tasks.errors import InvalidMessage

H_SAGA_ID = "saga_id"
H_SAGA_TYPE = "saga_type"
H_STEP = "saga_step"
H_KIND = "saga_message_kind"
H_REPLY_TO_KIND = "saga_reply_to_kind"
H_COMMAND_ID = "saga_command_id"
H_COMPENSATES = "saga_compensates"
H_SUPERSEDES = "saga_supersedes"
H_ATTEMPT = "saga_attempt"
H_CORRELATION_ID = "saga_correlation_id"
H_CAUSATION_ID = "saga_causation_id"
H_TRACEPARENT = "traceparent"

MAX_GENERATIONS = 1000
"""Operator retries of one step that a command may name as superseded."""

SAGA_HEADERS = frozenset(
    {
        H_SAGA_ID,
        H_SAGA_TYPE,
        H_STEP,
        H_KIND,
        H_REPLY_TO_KIND,
        H_COMMAND_ID,
        H_COMPENSATES,
        H_SUPERSEDES,
        H_ATTEMPT,
        H_CORRELATION_ID,
        H_CAUSATION_ID,
        H_TRACEPARENT,
    }
)

REPLY_TASK = "saga_tasks.reply"
"""The orchestrator's task; every participant reply is a call of it."""


@dataclass(frozen=True)
class OutboundMessage:
    """A message written to an outbox in a transaction and published after its commit."""

    message_id: str
    task_name: str
    queue: str
    headers: Mapping[str, Any]
    body: Mapping[str, Any]
    saga_id: str | None = None
    routing_key: str | None = None


@dataclass(frozen=True)
class Command:
    """A command as a participant receives it."""

    message_id: str
    saga_id: str
    step: str
    kind: MessageKind
    command_id: str
    attempt: int
    correlation_id: str
    payload: Mapping[str, Any]
    results: Mapping[str, Mapping[str, Any]]
    compensates: str | None = None
    traceparent: str | None = None
    headers: Mapping[str, Any] = field(default_factory=dict)
    supersedes: tuple[str, ...] = ()
    """Ids of earlier generations of this compensation: fenced before it runs."""


def _valid_uuid(value: Any) -> bool:
    if not isinstance(value, str):
        return False
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True


def _require(headers: Mapping[str, Any], name: str) -> str:
    value = headers.get(name)
    if not isinstance(value, str) or not value:
        raise InvalidMessage(f"missing or empty header {name!r}")
    return value


def parse_command(message_id: str, headers: Mapping[str, Any] | None, body: Any) -> Command:
    """Read a command, or raise ``InvalidMessage`` naming what is wrong."""
    headers = headers or {}
    saga_id = _require(headers, H_SAGA_ID)
    if not _valid_uuid(saga_id):
        raise InvalidMessage(f"header {H_SAGA_ID!r} is not a UUID")
    kind_raw = _require(headers, H_KIND)
    try:
        kind = MessageKind(kind_raw)
    except ValueError:
        raise InvalidMessage(f"unknown message kind {kind_raw!r}") from None
    if kind not in (MessageKind.COMMAND, MessageKind.COMPENSATION):
        raise InvalidMessage(f"a {kind.value} message was sent to a command queue")
    command = _require(headers, H_COMMAND_ID)
    if not _valid_uuid(command):
        raise InvalidMessage(f"header {H_COMMAND_ID!r} is not a UUID")
    compensates = headers.get(H_COMPENSATES)
    if compensates is not None and not _valid_uuid(compensates):
        raise InvalidMessage(f"header {H_COMPENSATES!r} is not a UUID")
    supersedes_raw = headers.get(H_SUPERSEDES, "")
    supersedes = tuple(s for s in str(supersedes_raw).split(",") if s)
    if not all(_valid_uuid(s) for s in supersedes) or len(supersedes) > MAX_GENERATIONS:
        raise InvalidMessage(f"header {H_SUPERSEDES!r} is not a list of UUIDs")
    if supersedes and kind is not MessageKind.COMPENSATION:
        raise InvalidMessage(f"header {H_SUPERSEDES!r} belongs to compensations only")
    attempt = headers.get(H_ATTEMPT, 1)
    if not isinstance(attempt, int) or attempt < 1:
        raise InvalidMessage(f"header {H_ATTEMPT!r} must be a positive integer")
    if not isinstance(body, Mapping):
        raise InvalidMessage("command body must be a JSON object")
    payload = body.get("saga_payload", {})
    results = body.get("results", {})
    if not isinstance(payload, Mapping) or not isinstance(results, Mapping):
        raise InvalidMessage("command body needs objects 'saga_payload' and 'results'")
    return Command(
        message_id=message_id,
        saga_id=saga_id,
        step=_require(headers, H_STEP),
        kind=kind,
        command_id=command,
        attempt=attempt,
        correlation_id=str(headers.get(H_CORRELATION_ID) or saga_id),
        payload=payload,
        results=results,
        compensates=compensates,
        traceparent=headers.get(H_TRACEPARENT),
        headers={k: v for k, v in headers.items() if k in SAGA_HEADERS},
        supersedes=supersedes,
    )


def describe(message: OutboundMessage) -> str:
    """What Celery shows for a message's arguments (Flower, worker logs): references
    only, never the body, which carries business data."""
    h = message.headers
    return (
        f"{{saga {h.get(H_SAGA_ID)}, step {h.get(H_STEP)}, {h.get(H_KIND)}, "
        f"attempt {h.get(H_ATTEMPT, 1)}}}"
    )


def command_headers(
    *,
    saga_id: str,
    saga_type: str,
    step: str,
    kind: MessageKind,
    command_id: str,
    attempt: int,
    correlation_id: str,
    causation_id: str | None,
    compensates: str | None,
    traceparent: str | None,
    supersedes: Sequence[str] = (),
) -> dict[str, Any]:
    headers: dict[str, Any] = {
        H_SAGA_ID: saga_id,
        H_SAGA_TYPE: saga_type,
        H_STEP: step,
        H_KIND: kind.value,
        H_COMMAND_ID: command_id,
        H_ATTEMPT: attempt,
        H_CORRELATION_ID: correlation_id,
    }
    if causation_id:
        headers[H_CAUSATION_ID] = causation_id
    if compensates:
        headers[H_COMPENSATES] = compensates
    if supersedes:
        headers[H_SUPERSEDES] = ",".join(supersedes)
    if traceparent:
        headers[H_TRACEPARENT] = traceparent
    return headers


def reply_message(
    command: Command,
    *,
    reply_id: str,
    reply_queue: str,
    outcome: Outcome,
    result: Mapping[str, Any] | None = None,
    error_code: str | None = None,
    error_message: str | None = None,
) -> OutboundMessage:
    """The reply a participant sends for ``command``."""
    headers: dict[str, Any] = {
        H_SAGA_ID: command.saga_id,
        H_STEP: command.step,
        H_KIND: MessageKind.REPLY.value,
        H_REPLY_TO_KIND: command.kind.value,
        H_COMMAND_ID: command.command_id,
        H_CORRELATION_ID: command.correlation_id,
        H_CAUSATION_ID: command.message_id,
    }
    if command.traceparent:
        headers[H_TRACEPARENT] = command.traceparent
    body: dict[str, Any] = {"outcome": outcome.value}
    if result is not None:
        body["result"] = dict(result)
    if error_code is not None:
        body["error"] = {"code": error_code, "message": error_message or ""}
    return OutboundMessage(
        message_id=reply_id,
        task_name=REPLY_TASK,
        queue=reply_queue,
        headers=headers,
        body=body,
        saga_id=command.saga_id,
    )


def parse_reply(
    message_id: str, headers: Mapping[str, Any] | None, body: Any
) -> tuple[str, ReplyReceived]:
    """Read a reply as ``(saga_id, event)``, or raise ``InvalidMessage`` naming what is wrong."""
    headers = headers or {}
    if not message_id:
        raise InvalidMessage("message has no id")
    saga_id = _require(headers, H_SAGA_ID)
    if not _valid_uuid(saga_id):
        raise InvalidMessage(f"header {H_SAGA_ID!r} is not a UUID")
    kind = headers.get(H_KIND)
    if kind != MessageKind.REPLY.value:
        raise InvalidMessage(f"expected a reply, got message kind {kind!r}")
    to_kind_raw = _require(headers, H_REPLY_TO_KIND)
    try:
        to_kind = MessageKind(to_kind_raw)
    except ValueError:
        raise InvalidMessage(f"unknown {H_REPLY_TO_KIND!r} {to_kind_raw!r}") from None
    if not isinstance(body, Mapping):
        raise InvalidMessage("reply body must be a JSON object")
    outcome_raw = body.get("outcome")
    try:
        outcome = Outcome(str(outcome_raw))
    except ValueError:
        raise InvalidMessage(
            f"reply outcome must be 'success' or 'failure', got {outcome_raw!r}"
        ) from None
    result = body.get("result")
    if result is not None and not isinstance(result, Mapping):
        raise InvalidMessage("reply 'result' must be a JSON object")
    error = body.get("error") or {}
    if not isinstance(error, Mapping):
        raise InvalidMessage("reply 'error' must be a JSON object")
    return saga_id, ReplyReceived(
        step=_require(headers, H_STEP),
        kind=to_kind,
        command_id=_require(headers, H_COMMAND_ID),
        outcome=outcome,
        message_id=message_id,
        result=result,
        error_code=error.get("code") if error else None,
        error_message=error.get("message") if error else None,
    )
