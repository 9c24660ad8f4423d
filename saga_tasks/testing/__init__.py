"""Help for testing sagas against real services, shipped so users test theirs as we test ours.

- ``Isolation``: a RabbitMQ vhost and a PostgreSQL database of one's own, removed after.
- ``WorkerProcess``: a real ``celery worker`` (or ``beat``) process, started, awaited until
  ready, killed with any signal; its whole process group goes with it.
- ``wait_for`` and ``wait_for_status``: await a condition instead of sleeping and hoping.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeVar

from saga_tasks.core.clock import FakeClock
from saga_tasks.core.states import SagaStatus
from saga_tasks.ops.isolation import (
    Isolation,
    RabbitAdmin,
    create_database,
    drop_database,
    list_databases,
    queue_depths,
)
from saga_tasks.ops.processes import TimedOut, WorkerProcess, wait_for

T = TypeVar("T")

__all__ = [
    "FakeClock",
    "TimedOut",
    "Isolation",
    "RabbitAdmin",
    "WorkerProcess",
    "create_database",
    "drop_database",
    "list_databases",
    "queue_depths",
    "wait_for",
    "wait_for_status",
]


def wait_for_status(
    app: Any,
    saga_id: str,
    statuses: Iterable[SagaStatus | str],
    *,
    timeout: float = 30.0,
) -> Any:
    """Wait until the saga is in one of ``statuses``; return its state."""
    wanted = {SagaStatus(s) for s in statuses}
    last: list[Any] = [None]

    def reached() -> Any:
        state = app.orchestrator.get(saga_id)
        last[0] = state
        return state if state.status in wanted else None

    def describe() -> str:
        state = last[0]
        now = state.status.value if state is not None else "unknown"
        return f"saga {saga_id} in {sorted(s.value for s in wanted)} (it is {now})"

    return wait_for(reached, timeout=timeout, interval=0.05, describe=describe)
