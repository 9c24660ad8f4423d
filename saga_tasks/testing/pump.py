"""A deterministic pump: a deployment's messages moved through its real queues in this
process, one at a time, without worker processes.

Each command goes to its participant's runtime and each reply to the orchestrator,
exactly as the worker tasks hand them over (minus Celery). Tests of a saga's logic
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
    user_id}``, once this process's queued publishes are confirmed."""
    flush_all()
    found: list[dict[str, Any]] = []

    def keep(message: RawMessage) -> bool:
        args, kwargs, _embed = json.loads(message.body)
        found.append(
            {
                "headers": dict(message.headers),
                "kwargs": kwargs,
                "args": args,
                "user_id": message.user_id,
            }
        )
        return True

    take(broker_url, queue, keep, limit=limit)
    return found


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
                seen.append(f"{message['headers']['task']}:{run_command(app, message)}")
                moved = True
        for message in drain(url, REPLY_QUEUE):
            seen.append(f"reply:{run_reply(app, message).value}")
            moved = True
        if not moved:
            return seen
    raise AssertionError(f"messages still moving after {rounds} rounds: {seen[-10:]}")
