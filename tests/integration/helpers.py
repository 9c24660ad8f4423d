"""Reading what really reached RabbitMQ, and counting rows, for assertions."""

from __future__ import annotations

import json
from typing import Any

from kombu import Connection
from sqlalchemy import text

from participants.order_saga import OrderPayload  # noqa: F401 - keeps the example importable
from saga_tasks.messaging.dispatcher import flush_all


def drain(broker_url: str, queue: str, limit: int = 100) -> list[dict[str, Any]]:
    """Take up to ``limit`` messages off ``queue`` (acked), as headers + decoded kwargs,
    once this process's queued publishes are confirmed."""
    flush_all()
    found: list[dict[str, Any]] = []
    with Connection(broker_url) as conn:
        channel = conn.channel()
        try:
            while len(found) < limit:
                message = channel.basic_get(queue=queue, no_ack=True)
                if message is None:
                    break
                args, kwargs, _embed = json.loads(message.body)
                found.append(
                    {"headers": dict(message.headers or {}), "kwargs": kwargs, "args": args}
                )
        finally:
            channel.close()
    return found


def scalar(engine: Any, sql: str, **params: Any) -> Any:
    with engine.connect() as conn:
        return conn.execute(text(sql), params).scalar()


def rows(engine: Any, sql: str, **params: Any) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(text(sql), params)]


ORDER = {"customer_id": "c-1", "items": [{"sku": "sku-1", "qty": 2}], "amount_cents": 1999}


def run_command(app: Any, message: dict[str, Any], *, redelivered: bool = False) -> str:
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
    )


def run_reply(app: Any, message: dict[str, Any]) -> Any:
    return app.orchestrator.handle_reply(
        message["headers"]["id"], message["headers"], message["kwargs"]
    )


def pump(app: Any, broker_url: str, *, rounds: int = 50) -> list[str]:
    """Move messages through real queues in this process until none are left."""
    seen: list[str] = []
    queues = list(app.topology.command_queues)
    for _ in range(rounds):
        moved = False
        for queue in queues:
            for message in drain(broker_url, queue):
                seen.append(f"{message['headers']['task']}:{run_command(app, message)}")
                moved = True
        for message in drain(broker_url, "saga.replies"):
            seen.append(f"reply:{run_reply(app, message).value}")
            moved = True
        if not moved:
            return seen
    raise AssertionError(f"messages still moving after {rounds} rounds: {seen[-10:]}")
