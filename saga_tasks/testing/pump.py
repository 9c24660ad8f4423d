"""A deterministic pump: a deployment's messages moved through its real queues in this
process, one at a time, without worker processes.

Each command goes to its participant's runtime and each reply to the orchestrator,
exactly as the worker tasks hand them over (minus Celery), after the task gate the
workers apply (a refused message is reported, not run). Tests of a saga's logic
against real PostgreSQL and RabbitMQ then run in order, with no sleeps: drain, run,
drain again, until nothing moves.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from saga_tasks.core.states import Classification
from saga_tasks.messaging.dispatcher import flush_all
from saga_tasks.messaging.taker import RawMessage, take
from saga_tasks.messaging.topology import REPLY_QUEUE

if TYPE_CHECKING:
    from saga_tasks.app import SagaApp


def drain(broker_url: str, queue: str, limit: int = 100) -> list[dict[str, Any]]:
    """Take up to ``limit`` messages off ``queue`` (acked), as ``{headers, kwargs, args,
    embed, user_id, queue}``, once this process's queued publishes are confirmed."""
    flush_all()
    found: list[dict[str, Any]] = []

    def keep(message: RawMessage) -> bool:
        args, kwargs, embed = json.loads(message.body)
        found.append(
            {
                "headers": dict(message.headers),
                "kwargs": kwargs,
                "args": args,
                "embed": embed,
                "user_id": message.user_id,
                "queue": queue,
            }
        )
        return True

    take(broker_url, queue, keep, limit=limit)
    return found


def refusal(app: SagaApp, message: Mapping[str, Any]) -> str | None:
    """Why the worker of a drained message's queue would park it unrun (``core.gate``)."""
    body = [message.get("args", []), message.get("kwargs", {}), message.get("embed")]
    return app.gate.refusal(message.get("queue"), message["headers"], body)


def run(app: SagaApp, message: Mapping[str, Any]) -> str:
    """What a worker does with a drained message: park it (``refused: ...``), or hand a
    reply to the orchestrator (its classification) or a command to its participant."""
    refused = refusal(app, message)
    if refused is not None:
        return f"refused: {refused}"
    if message.get("queue") == REPLY_QUEUE:
        return run_reply(app, message).value
    return run_command(app, message)


def run_command(app: SagaApp, message: Mapping[str, Any], *, redelivered: bool = False) -> str:
    """Hand a drained command to its participant's runtime, as the worker task does."""
    participant_name, action = message["headers"]["task"].split(".", 1)
    runtime = app.runtimes[participant_name]
    handler = runtime.participant.handlers[action]
    return runtime.execute(
        handler,
        message_id=message["headers"]["id"],
        headers=message["headers"],
        body=message["kwargs"],
        redelivered=redelivered,
        sender=message.get("user_id"),
    )


def run_reply(app: SagaApp, message: Mapping[str, Any]) -> Classification:
    """Hand a drained reply to the orchestrator, as the reply task does."""
    return app.orchestrator.handle_reply(
        message["headers"]["id"],
        message["headers"],
        message["kwargs"],
        sender=message.get("user_id"),
    )


def pump(app: SagaApp, broker_url: str | None = None, *, rounds: int = 50) -> list[str]:
    """Move messages through the app's real queues in this process until none are left;
    what happened, one ``task:outcome`` line per message."""
    url = broker_url or app.settings.broker_url
    seen: list[str] = []
    for _ in range(rounds):
        moved = False
        for queue in app.topology.command_queues:
            for message in drain(url, queue):
                seen.append(f"{message['headers']['task']}:{run(app, message)}")
                moved = True
        for message in drain(url, REPLY_QUEUE):
            seen.append(f"reply:{run(app, message)}")
            moved = True
        if not moved:
            return seen
    raise AssertionError(f"messages still moving after {rounds} rounds: {seen[-10:]}")
