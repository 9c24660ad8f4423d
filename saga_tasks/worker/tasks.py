"""Celery wiring: the tasks of a deployment and the hooks of its workers.

The tasks are thin: each hands its message to the orchestrator or a participant
runtime and returns. Acknowledgement comes after that returns, i.e. after the
transaction committed (``acks_late``); a failure or a crash dead-letters the
message once rather than dropping it or looping on it.

``register`` receives the parts it calls (built by ``SagaApp``), never the app.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from celery import Celery, Task, bootsteps
from celery.signals import (
    after_setup_logger,
    after_setup_task_logger,
    worker_process_shutdown,
    worker_ready,
    worker_shutdown,
)

from saga_tasks.config import Settings
from saga_tasks.core.gate import TaskGate
from saga_tasks.core.messages import REPLY_TASK
from saga_tasks.core.senders import H_SENT_BY
from saga_tasks.errors import ServiceUnavailable
from saga_tasks.messaging.topology import (
    DEAD_LETTER_QUEUE,
    MAINTENANCE_QUEUE,
    PARKING_QUEUE,
    REPLY_QUEUE,
    Topology,
)
from saga_tasks.observability.alerts import AlertScan
from saga_tasks.observability.logs import configure_logging
from saga_tasks.observability.metrics import serve_worker_metrics
from saga_tasks.participant import Handler
from saga_tasks.persistence.db import check_database
from saga_tasks.runtime.holding import DEAD_LETTER, PARKING, Holding
from saga_tasks.runtime.intake import Intake
from saga_tasks.runtime.maintenance import Maintenance
from saga_tasks.runtime.orchestrator import Orchestrator
from saga_tasks.runtime.participant import ParticipantRuntime
from saga_tasks.runtime.schedules import Timetable
from saga_tasks.runtime.sweeper import Sweeper
from saga_tasks.worker.beat import FIRE_SCHEDULE_TASK, beat_schedule
from saga_tasks.worker.failures import FailurePolicy
from saga_tasks.worker.upkeep import ParticipantUpkeep, consumed_runtimes
from saga_tasks.worker.versions import RefuseUnloadedVersions

RELAY_TASK = "saga_tasks.relay_outbox"
SWEEP_TASK = "saga_tasks.sweep_timeouts"
INTAKE_TASK = "saga_tasks.intake_held"
ALERT_TASK = "saga_tasks.alert_scan"
SAMPLE_TASK = "saga_tasks.sample_status"
HOUSEKEEPING_TASK = "saga_tasks.housekeeping"
MAINTENANCE_TASKS = frozenset(
    {
        RELAY_TASK,
        SWEEP_TASK,
        INTAKE_TASK,
        ALERT_TASK,
        SAMPLE_TASK,
        HOUSEKEEPING_TASK,
        FIRE_SCHEDULE_TASK,
    }
)
"""What ``saga.maintenance`` runs (beat's jobs and schedule firings), and nothing else."""
log = logging.getLogger("saga_tasks.tasks")

WORKER_LOST_RETRIES = 3
"""A lost prefork child's message is sent again at once (``default_retry_delay=0``: no
ETA held in memory), at most this many times; then it is rejected into the DLQ."""


@dataclass(frozen=True)
class WorkerParts:
    """What the tasks and worker hooks of a deployment call."""

    settings: Settings
    topology: Topology
    orchestrator: Orchestrator
    sweeper: Sweeper
    intake: Intake
    alerts: AlertScan
    maintenance: Maintenance
    holding: Holding
    failures: FailurePolicy
    runtimes: Mapping[str, ParticipantRuntime]
    engine: Callable[[], Any]
    flush: Callable[[], bool]
    """Wait for this process's unconfirmed publishes; False if some are left to recovery."""
    timetable: Timetable
    """The app's schedules: beat fires their ticks, a maintenance worker starts the sagas."""
    gate: TaskGate
    """Which task runs on which queue (``task_gate``); the consumer refuses the rest."""


def task_gate(topology: Topology, runtimes: Mapping[str, ParticipantRuntime]) -> TaskGate:
    """The tasks each saga queue runs: the reply task, the maintenance tasks, and each
    participant's handlers on its own queue (two participants may share one). A command
    queue whose participant this app does not load runs nothing here."""
    tasks: dict[str, set[str]] = {q: set() for q in topology.command_queues}
    tasks[REPLY_QUEUE] = {REPLY_TASK}
    tasks[MAINTENANCE_QUEUE] = set(MAINTENANCE_TASKS)
    for runtime in runtimes.values():
        for handler in runtime.participant.handlers.values():
            tasks.setdefault(handler.queue, set()).add(handler.task_name)
    return TaskGate({queue: frozenset(names) for queue, names in tasks.items()})


def register(celery: Celery, parts: WorkerParts) -> None:
    """Register every task, the beat schedule and the worker hooks on ``celery``."""
    settings = parts.settings
    celery.conf.beat_schedule = beat_schedule(
        settings,
        relay=RELAY_TASK,
        intake=INTAKE_TASK,
        alerts=ALERT_TASK,
        sample=SAMPLE_TASK,
        sweep=SWEEP_TASK,
        housekeeping=HOUSEKEEPING_TASK,
    )
    celery.saga_parts = parts  # type: ignore[attr-defined]
    celery.steps["worker"].add(RefuseUnloadedVersions)
    celery.steps["consumer"].add(DeclareTopology)
    celery.steps["consumer"].add(ParticipantUpkeep)
    base = _message_task(celery, parts.failures)
    _register_orchestrator_tasks(celery, parts, base)
    for runtime in parts.runtimes.values():
        for handler in runtime.participant.handlers.values():
            _register_handler(celery, parts.failures, runtime, handler, base)
    _connect_logging(settings)
    _flush_on_shutdown(parts.flush)
    if settings.metrics_port:
        _serve_metrics_when_ready(celery, settings.metrics_port)


def _flush_on_shutdown(flush: Callable[[], bool]) -> None:
    """A stopping worker (or prefork child) hands its queued publishes to the broker
    first; what does not make it in time stays for recovery."""

    def on_shutdown(sender: Any = None, **_: Any) -> None:
        if not flush():
            log.warning("publishes still unconfirmed at shutdown; recovery sends them")

    worker_shutdown.connect(on_shutdown, weak=False)
    worker_process_shutdown.connect(on_shutdown, weak=False)


def _serve_metrics_when_ready(celery: Celery, port: int) -> None:
    def serve(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is celery:
            serve_worker_metrics(port)

    worker_ready.connect(serve, weak=False)


def _message_task(celery: Celery, failures: FailurePolicy) -> type[Task[Any, Any]]:
    """The base of the tasks that consume saga messages.

    When a pool child is lost, Celery re-sends the task (``task_retry_on_worker_lost``)
    as this worker's own broker user; the re-send names the sender of the original, as
    the failure policy's copies do, so the worker does not vouch for it on its return.
    """

    class MessageTask(celery.Task):  # type: ignore[name-defined,misc]
        def signature_from_request(
            self,
            request: Any = None,
            args: Any = None,
            kwargs: Any = None,
            queue: Any = None,
            **extra_options: Any,
        ) -> Any:
            signature = super().signature_from_request(
                request, args, kwargs, queue, **extra_options
            )
            origin = self.request if request is None else request
            headers = dict(signature.options.get("headers") or {})
            headers[H_SENT_BY] = failures.sender(origin) or ""
            signature.options["headers"] = headers
            return signature

    return MessageTask


def _register_orchestrator_tasks(
    celery: Celery, parts: WorkerParts, base: type[Task[Any, Any]]
) -> None:
    orchestrator, failures = parts.orchestrator, parts.failures

    @celery.task(
        name=REPLY_TASK,
        base=base,
        bind=True,
        queue=REPLY_QUEUE,
        max_retries=WORKER_LOST_RETRIES,
        default_retry_delay=0,
    )
    def reply(self: Any, *args: Any, **kwargs: Any) -> str:
        """Apply a participant's reply to its saga."""
        body: Any = kwargs if not args else {"args": list(args), **kwargs}
        outcome = "retried, parked or dead-lettered"
        with failures.guard(self.request, REPLY_QUEUE):
            delivery = self.request.delivery_info or {}
            outcome = orchestrator.handle_reply(
                self.request.id,
                self.request.headers,
                body,
                routing_key=delivery.get("routing_key"),
                redelivered=bool(delivery.get("redelivered")),
                raise_invalid=True,
                sender=failures.sender(self.request),
            ).value
        return outcome  # noqa: RET504 - the policy may end the body early

    def maintenance_task(name: str) -> Callable[[Callable[..., Any]], Any]:
        return celery.task(name=name, bind=True, queue=MAINTENANCE_QUEUE, acks_late=False)

    @maintenance_task(SWEEP_TASK)
    def sweep_timeouts(self: Any) -> dict[str, int]:
        """Feed ``DeadlinePassed`` to every saga whose next deadline has passed."""
        report = parts.sweeper.sweep(batch=parts.settings.sweep_batch)
        if report.claimed:
            log.info(
                "timeout sweep: %d due, %d changed, %d commands, %d errors",
                report.claimed,
                report.changed,
                report.commands,
                report.errors,
            )
        return {"claimed": report.claimed, "changed": report.changed, "errors": report.errors}

    @maintenance_task(INTAKE_TASK)
    def intake_held(self: Any) -> dict[str, int]:
        """Move dead-lettered and parked messages into the database; tell their sagas."""
        return {h: parts.intake.take(h).taken for h in (DEAD_LETTER, PARKING)}

    @maintenance_task(ALERT_TASK)
    def alert_scan(self: Any) -> int:
        """Alert, once per saga and channel, on sagas stuck or waiting in manual review."""
        return parts.alerts.scan()

    @maintenance_task(SAMPLE_TASK)
    def sample_status(self: Any) -> int:
        """Count the sagas in each status once (the dashboard's counts over time)."""
        return parts.maintenance.sample_status()

    @maintenance_task(RELAY_TASK)
    def relay_outbox(self: Any) -> dict[str, int]:
        """Publish outbox rows whose publish-after-commit did not happen (crash, outage)."""
        return parts.maintenance.recover_outboxes()

    @maintenance_task(HOUSEKEEPING_TASK)
    def housekeeping(self: Any) -> dict[str, int]:
        """Prune what only matters for a while (redelivery counts, old schedule runs) and
        purge the sagas past their retention (SAGA_RETENTION_DAYS)."""
        return {
            "redeliveries_forgotten": parts.maintenance.forget_redeliveries(),
            "schedule_runs_forgotten": parts.timetable.forget_runs(),
            "sagas_purged": parts.maintenance.purge_finished(),
        }

    # Late acks: a worker killed mid-firing leaves the firing to another; the business
    # key makes the second one find the saga. Nothing is raised for what a firing meets.
    @celery.task(name=FIRE_SCHEDULE_TASK, bind=True, queue=MAINTENANCE_QUEUE, acks_late=True)
    def fire_schedule(
        self: Any, /, schedule: str = "", tick: str = "", missed: int = 0, **_: Any
    ) -> dict[str, Any]:
        """Start the saga of one tick of a schedule (the tick comes with the firing)."""
        fired = parts.timetable.fire(str(schedule), str(tick), missed=_count(missed))
        return {"outcome": fired.outcome, "saga_id": fired.saga_id}


def _count(value: Any) -> int:
    try:
        return max(int(value), 0)
    except (TypeError, ValueError):
        return 0


def _register_handler(
    celery: Celery,
    failures: FailurePolicy,
    runtime: ParticipantRuntime,
    handler: Handler,
    base: type[Task[Any, Any]],
) -> None:
    def run(self: Any, *args: Any, **kwargs: Any) -> str:
        request = self.request
        delivery = request.delivery_info or {}
        body: Any = kwargs if not args else {"args": list(args), **kwargs}
        outcome = "retried, parked or dead-lettered"
        with failures.guard(request, handler.queue):
            outcome = runtime.execute(
                handler,
                message_id=request.id,
                headers=request.headers,
                body=body,
                redelivered=bool(delivery.get("redelivered")) or bool(request.retries),
                raise_invalid=True,
                sender=failures.sender(request),
            )
        return outcome  # noqa: RET504 - the policy may end the body early

    run.__doc__ = (handler.fn.__doc__ or "").strip() or f"{handler.task_name} command handler"
    celery.task(
        name=handler.task_name,
        base=base,
        bind=True,
        queue=handler.queue,
        max_retries=WORKER_LOST_RETRIES,
        default_retry_delay=0,
    )(run)


class DeclareTopology(bootsteps.StartStopStep):
    """Declare every exchange and queue (retry, dead-letter, parking too) on each connect,
    or, where the deploy step declares them (one broker user per service, none of which
    may configure), check that the queues this worker consumes and holds into exist.

    Dead-lettering to an exchange with no queue bound drops the message, so the
    holding queues must exist before any work queue can dead-letter into them.
    """

    requires = ("celery.worker.consumer.connection:Connection",)

    def start(self, c: Any) -> None:
        parts: WorkerParts = c.app.saga_parts
        if parts.topology.declare_on_use:
            parts.topology.declare(c.connection)
        else:
            consumed = list(c.app.amqp.queues.consume_from or {})
            parts.topology.check(c.connection, [*consumed, DEAD_LETTER_QUEUE, PARKING_QUEUE])
        try:
            for url in database_urls(c, parts):
                check_database(url)
        except ServiceUnavailable as exc:
            # Keep consuming: messages wait in their queues (requeued) until it is back.
            log.error("%s; messages are requeued until it answers", exc)


def database_urls(c: Any, parts: WorkerParts) -> list[str]:
    """The databases this worker uses: each consumed participant's, and the orchestrator's
    unless it consumes participant queues only."""
    runtimes = consumed_runtimes(c, parts.runtimes)
    queues = c.app.amqp.queues
    consumed = set(queues.consume_from or queues)
    urls = [parts.settings.participant_database(r.participant.name) for r in runtimes]
    if consumed - {r.participant.queue for r in runtimes}:
        urls.insert(0, parts.settings.database_url)
    return list(dict.fromkeys(urls))


def _connect_logging(settings: Settings) -> None:
    def setup(logger: Any = None, **_: Any) -> None:
        configure_logging(settings)

    after_setup_logger.connect(setup, weak=False)
    after_setup_task_logger.connect(setup, weak=False)
