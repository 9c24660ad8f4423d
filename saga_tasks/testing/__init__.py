"""Help for testing sagas against real services, shipped so users test theirs as we test ours.

- ``Isolation``: a RabbitMQ vhost and a PostgreSQL database of one's own, removed after;
  ``ready(app)`` migrates it (and each participant's database) and declares the app's
  topology there.
- ``pump``, ``drain``, ``run_command``, ``run_reply``: move a deployment's messages through
  its real queues in the test's own process, deterministically, without workers.
- ``FakeClock``: a clock the test moves, so timeouts fire when the test says.
- ``check_invariants``: what must hold once every saga has ended (no saga left running,
  histories that explain each saga, no message lost, outboxes empty, and with an
  ``effects`` reader, business effects that agree with step statuses).
- ``WorkerProcess``: a real ``celery worker`` (or ``beat``) process, started, awaited until
  ready, killed with any signal; its whole process group goes with it.
- ``wait_for`` and ``wait_for_status``: await a condition instead of sleeping and hoping.
- ``SagaDriver``: a saga definition driven through the pure decider, no services: start
  it, answer its steps (``succeed``, ``fail``, ``compensated``), let its deadlines pass
  (``lapse``, ``tick``), signal it, and read its state and what it sends.
- ``golden``: a driver's run kept as JSON beside its test and replayed against the
  definition (``golden.check(driver, path)``), so a change of behaviour shows as a diff.
- The pure decider, for tests without services: ``decide(definition, state, event, now)``
  with the events it takes (``Started``, ``ReplyReceived``, ``SignalReceived``,
  ``DeadlinePassed``), the ``Decision`` it returns (``CommandIntent``, ``HistoryEntry``) and
  the state it moves (``SagaState``, ``StepState``, ``StepStatus``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from saga_tasks.core.clock import FakeClock
from saga_tasks.core.decider import CommandIntent, Decision, HistoryEntry, decide
from saga_tasks.core.events import DeadlinePassed, ReplyReceived, SignalReceived, Started
from saga_tasks.core.model import SagaState, StepState
from saga_tasks.core.states import SagaStatus, StepStatus
from saga_tasks.messaging.topology import declare_topology
from saga_tasks.ops.isolation import (
    Isolation,
    RabbitAdmin,
    create_database,
    drop_database,
    list_databases,
    queue_depths,
)
from saga_tasks.ops.processes import TimedOut, WorkerProcess, wait_for
from saga_tasks.ops.services import upgrade_all
from saga_tasks.testing import golden
from saga_tasks.testing.driver import SagaDriver
from saga_tasks.testing.invariants import Report, check_invariants
from saga_tasks.testing.pump import drain, pump, refusal, run, run_command, run_reply

if TYPE_CHECKING:
    from saga_tasks.app import SagaApp

__all__ = [
    "FakeClock",
    "Isolation",
    "RabbitAdmin",
    "Report",
    "SagaDriver",
    "TimedOut",
    "WorkerProcess",
    "check_invariants",
    "create_database",
    "drain",
    "drop_database",
    "golden",
    "list_databases",
    "pump",
    "queue_depths",
    "ready",
    "refusal",
    "run",
    "run_command",
    "run_reply",
    "wait_for",
    "wait_for_status",
    # the pure decider
    "CommandIntent",
    "DeadlinePassed",
    "Decision",
    "HistoryEntry",
    "ReplyReceived",
    "SagaState",
    "SignalReceived",
    "Started",
    "StepState",
    "StepStatus",
    "decide",
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


def ready(app: SagaApp) -> SagaApp:
    """What a deploy does before workers start (``saga-tasks db upgrade``, then ``broker
    declare``): migrate the app's database (the saga schema, then ``app.migrations``), then
    each participant's own chain (``Participant(migrations=)``) in the database that
    participant uses in this app, and declare the app's topology on its broker. The
    databases must exist (``Isolation(participants=...)`` makes a participant's own)."""
    upgrade_all(app, app.settings, create=False)
    declare_topology(app.settings.broker_url, app.topology)
    return app
