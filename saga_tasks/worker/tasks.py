"""Celery wiring: the app's settings, its tasks, and the hooks of its workers.

The tasks are thin: each hands its message to the orchestrator or a participant
runtime and returns. Acknowledgement comes after that returns, i.e. after the
transaction committed (``acks_late``); a failure or a crash dead-letters the
message once rather than dropping it or looping on it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from celery import Celery, bootsteps
from celery.signals import after_setup_logger, after_setup_task_logger

from saga_tasks.core.messages import REPLY_TASK, OutboundMessage
from saga_tasks.errors import ServiceUnavailable
from saga_tasks.messaging.topology import MAINTENANCE_QUEUE, REPLY_QUEUE
from saga_tasks.worker.failures import failure_policy

if TYPE_CHECKING:
    from saga_tasks.app import SagaApp
    from saga_tasks.participant import Handler
    from saga_tasks.runtime.participant import ParticipantRuntime

RELAY_TASK = "saga_tasks.relay_outbox"
SWEEP_TASK = "saga_tasks.sweep_timeouts"
INTAKE_TASK = "saga_tasks.intake_held"
ALERT_TASK = "saga_tasks.alert_scan"
SAMPLE_TASK = "saga_tasks.sample_status"
log = logging.getLogger("saga_tasks.worker.tasks")

WORKER_LOST_RETRIES = 3
"""A lost prefork child's message is sent again at once (``default_retry_delay=0``: no
ETA held in memory), at most this many times; then it is rejected into the DLQ."""


def build_celery(saga_app: SagaApp) -> Celery:
    settings = saga_app.settings
    celery = Celery(saga_app.name, set_as_current=False)
    celery.conf.update(
        broker_url=settings.broker_url,
        result_backend=settings.result_backend,
        broker_connection_retry_on_startup=True,
        broker_transport_options={"confirm_publish": True},
        task_queues=saga_app.topology.work_queues(),
        task_default_queue=MAINTENANCE_QUEUE,
        task_create_missing_queues=False,
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        task_ignore_result=True,
        task_acks_late=True,
        task_acks_on_failure=False,
        task_acks_on_timeout=True,
        task_reject_on_worker_lost=False,
        # A lost prefork child: the message is sent again, at most max_retries times,
        # then dead-lettered (acks_on_failure=False): bounded, never a loop.
        task_retry_on_worker_lost=True,
        task_track_started=False,
        worker_prefetch_multiplier=settings.prefetch_multiplier,
        worker_send_task_events=settings.task_events,
        task_send_sent_event=settings.task_events,
        worker_cancel_long_running_tasks_on_connection_loss=True,
        worker_consumer="saga_tasks.worker.consumer:SagaConsumer",
        worker_hijack_root_logger=False,
        beat_schedule={
            "saga-outbox-recovery": {
                "task": RELAY_TASK,
                "schedule": settings.relay_interval,
                "options": {
                    "expires": max(settings.relay_interval * 2, 1.0),
                    "queue": MAINTENANCE_QUEUE,
                },
            },
            "saga-held-intake": {
                "task": INTAKE_TASK,
                "schedule": settings.intake_interval,
                "options": {
                    "expires": max(settings.intake_interval * 2, 1.0),
                    "queue": MAINTENANCE_QUEUE,
                },
            },
            "saga-alert-scan": {
                "task": ALERT_TASK,
                "schedule": settings.alert_interval,
                "options": {
                    "expires": max(settings.alert_interval * 2, 1.0),
                    "queue": MAINTENANCE_QUEUE,
                },
            },
            "saga-status-sample": {
                "task": SAMPLE_TASK,
                "schedule": settings.sample_interval,
                "options": {
                    "expires": max(settings.sample_interval, 1.0),
                    "queue": MAINTENANCE_QUEUE,
                },
            },
            "saga-timeout-sweep": {
                "task": SWEEP_TASK,
                "schedule": settings.sweep_interval,
                "options": {
                    "expires": max(settings.sweep_interval * 2, 1.0),
                    "queue": MAINTENANCE_QUEUE,
                },
            },
        },
        # One active beat at a time: a lease in Redis; a standby beat takes over once the
        # lease of a dead one runs out (celery-redbeat).
        beat_scheduler="redbeat.RedBeatScheduler",
        redbeat_redis_url=settings.result_backend,
        redbeat_key_prefix=beat_key_prefix(settings),
        # Settings refuse a lease shorter than a few of these sleeps (BEAT_LEASE_MARGIN).
        redbeat_lock_timeout=settings.beat_lease,
        beat_max_loop_interval=settings.beat_max_interval,
    )
    celery.saga_app = saga_app  # type: ignore[attr-defined]
    celery.steps["consumer"].add(DeclareTopology)
    _register_orchestrator_tasks(celery, saga_app)
    for runtime in saga_app.runtimes.values():
        for handler in runtime.participant.handlers.values():
            _register_handler(celery, saga_app, runtime, handler)
    _connect_logging(saga_app)
    _flush_on_shutdown(celery, saga_app)
    if settings.metrics_port:
        _serve_metrics_when_ready(celery, settings.metrics_port)
    return celery


def _flush_on_shutdown(celery: Celery, saga_app: SagaApp) -> None:
    """A stopping worker (or prefork child) hands its queued publishes to the broker
    first; what does not make it in time stays for recovery."""
    from celery.signals import worker_process_shutdown, worker_shutdown

    def flush(sender: Any = None, **_: Any) -> None:
        if not saga_app.flush():
            log.warning("publishes still unconfirmed at shutdown; recovery sends them")

    worker_shutdown.connect(flush, weak=False)
    worker_process_shutdown.connect(flush, weak=False)


def _serve_metrics_when_ready(celery: Celery, port: int) -> None:
    from celery.signals import worker_ready

    def serve(sender: Any = None, **_: Any) -> None:
        if getattr(sender, "app", None) is celery:
            from saga_tasks.observability.metrics import serve_worker_metrics

            serve_worker_metrics(port)

    worker_ready.connect(serve, weak=False)


def _register_orchestrator_tasks(celery: Celery, saga_app: SagaApp) -> None:
    @celery.task(
        name=REPLY_TASK,
        bind=True,
        queue=REPLY_QUEUE,
        max_retries=WORKER_LOST_RETRIES,
        default_retry_delay=0,
    )
    def reply(self: Any, *args: Any, **kwargs: Any) -> str:
        """Apply a participant's reply to its saga."""
        body: Any = kwargs if not args else {"args": list(args), **kwargs}
        outcome = "retried, parked or dead-lettered"
        with failure_policy(saga_app, self.request, REPLY_QUEUE):
            delivery = self.request.delivery_info or {}
            outcome = saga_app.orchestrator.handle_reply(
                self.request.id,
                self.request.headers,
                body,
                routing_key=delivery.get("routing_key"),
                redelivered=bool(delivery.get("redelivered")),
                raise_invalid=True,
            ).value
        return outcome  # noqa: RET504 - the policy may end the body early

    @celery.task(name=SWEEP_TASK, bind=True, queue=MAINTENANCE_QUEUE, acks_late=False)
    def sweep_timeouts(self: Any) -> dict[str, int]:
        """Feed ``DeadlinePassed`` to every saga whose next deadline has passed."""
        report = saga_app.sweeper.sweep(batch=saga_app.settings.sweep_batch)
        if report.claimed:
            log.info(
                "timeout sweep: %d due, %d changed, %d commands, %d errors",
                report.claimed,
                report.changed,
                report.commands,
                report.errors,
            )
        return {"claimed": report.claimed, "changed": report.changed, "errors": report.errors}

    @celery.task(name=INTAKE_TASK, bind=True, queue=MAINTENANCE_QUEUE, acks_late=False)
    def intake_held(self: Any) -> dict[str, int]:
        """Move dead-lettered and parked messages into the database; tell their sagas."""
        from saga_tasks.runtime.holding import DEAD_LETTER, PARKING, intake

        return {h: intake(saga_app, h).taken for h in (DEAD_LETTER, PARKING)}

    @celery.task(name=ALERT_TASK, bind=True, queue=MAINTENANCE_QUEUE, acks_late=False)
    def alert_scan(self: Any) -> int:
        """Alert, once per saga and channel, on sagas stuck or waiting in manual review."""
        from saga_tasks.observability.alerts import scan

        return scan(saga_app)

    @celery.task(name=SAMPLE_TASK, bind=True, queue=MAINTENANCE_QUEUE, acks_late=False)
    def sample_status(self: Any) -> int:
        """Count the sagas in each status once (the dashboard's counts over time)."""
        return take_sample(saga_app)

    @celery.task(name=RELAY_TASK, bind=True, queue=MAINTENANCE_QUEUE, acks_late=False)
    def relay_outbox(self: Any) -> dict[str, int]:
        """Publish outbox rows whose publish-after-commit did not happen (crash, outage)."""
        from saga_tasks.runtime.outlet import relay

        published: dict[str, int] = {}
        hook = _relay_fault_hook(saga_app) if saga_app.settings.demo_faults else None
        for table in saga_app.outbox_tables():
            report = relay(
                saga_app.engine,
                table,
                saga_app.publisher,
                min_age_seconds=saga_app.settings.relay_min_age,
                batch=saga_app.settings.relay_batch,
                after_publish=hook,
            )
            published[report.table] = report.published
        return published


def _relay_fault_hook(saga_app: SagaApp) -> Callable[[Sequence[OutboundMessage]], None]:
    """The ``saga_tasks.relay`` demo fault: die after publishing, before marking, once a saga."""
    from saga_tasks.persistence import sagas
    from saga_tasks.runtime import faults

    def after_publish(published: Sequence[OutboundMessage]) -> None:
        saga_ids = sorted({m.saga_id for m in published if m.saga_id})
        if not saga_ids:
            return
        with saga_app.engine.connect() as conn:
            for saga_id, payload in sagas.payloads(conn, saga_ids):
                fault = faults.fault_for(payload, faults.RELAY, enabled=True)
                if fault is None or fault.kind is not faults.FaultKind.CRASH_AFTER_PUBLISH:
                    continue
                if sagas.has_event(conn, saga_id, "demo_fault"):
                    continue
                sagas.append_note_if_exists(
                    conn,
                    saga_id,
                    event="demo_fault",
                    reason="outbox recovery killed after publishing, before marking published",
                    message_id=None,
                    now=saga_app.clock.now(),
                )
                conn.commit()
                faults.crash("outbox recovery after publishing, before marking", saga_id=saga_id)

    return after_publish


def take_sample(saga_app: SagaApp) -> int:
    """One sample of the counts by status, and samples past ``SAGA_SAMPLE_KEEP`` dropped."""
    from datetime import timedelta

    from saga_tasks.persistence import samples
    from saga_tasks.persistence.db import translated

    now = saga_app.clock.now()
    with translated(saga_app.engine.url), saga_app.engine.begin() as conn:
        written = samples.take(conn, now)
        samples.prune(conn, now - timedelta(seconds=saga_app.settings.sample_keep))
    return written


def beat_key_prefix(settings: Any) -> str:
    """Redis key prefix of this deployment's beat: a digest of its database and vhost,
    so deployments (and test runs) sharing one Redis never share a schedule or a lease."""
    import hashlib

    from saga_tasks.config import mask_url

    seed = f"{mask_url(settings.database_url)}|{mask_url(settings.broker_url)}"
    return f"saga_tasks:beat:{hashlib.sha256(seed.encode()).hexdigest()[:12]}:"


def forget_beat_state(settings: Any) -> int:
    """Delete this deployment's beat schedule and lease from Redis; the count deleted."""
    import redis

    client = redis.Redis.from_url(settings.result_backend)
    try:
        keys = list(client.scan_iter(match=beat_key_prefix(settings) + "*", count=500))
        return int(client.delete(*keys)) if keys else 0
    finally:
        client.close()


def _register_handler(
    celery: Celery, saga_app: SagaApp, runtime: ParticipantRuntime, handler: Handler
) -> None:
    def run(self: Any, *args: Any, **kwargs: Any) -> str:
        request = self.request
        delivery = request.delivery_info or {}
        body: Any = kwargs if not args else {"args": list(args), **kwargs}
        outcome = "retried, parked or dead-lettered"
        with failure_policy(saga_app, request, handler.queue):
            outcome = runtime.execute(
                handler,
                message_id=request.id,
                headers=request.headers,
                body=body,
                redelivered=bool(delivery.get("redelivered")) or bool(request.retries),
                raise_invalid=True,
            )
        return outcome  # noqa: RET504 - the policy may end the body early

    run.__doc__ = (handler.fn.__doc__ or "").strip() or f"{handler.task_name} command handler"
    celery.task(
        name=handler.task_name,
        bind=True,
        queue=handler.queue,
        max_retries=WORKER_LOST_RETRIES,
        default_retry_delay=0,
    )(run)


class DeclareTopology(bootsteps.StartStopStep):
    """Declare every exchange and queue (retry, dead-letter, parking too) on each connect.

    Dead-lettering to an exchange with no queue bound drops the message, so the
    holding queues must exist before any work queue can dead-letter into them.
    """

    requires = ("celery.worker.consumer.connection:Connection",)

    def start(self, c: Any) -> None:
        saga_app = c.app.saga_app
        saga_app.topology.declare(c.connection)
        from saga_tasks.persistence.db import check_database

        try:
            check_database(saga_app.settings.database_url)
        except ServiceUnavailable as exc:
            # Keep consuming: messages wait in their queues (requeued) until it is back.
            log.error("%s; messages are requeued until it answers", exc)


def _connect_logging(saga_app: SagaApp) -> None:
    from saga_tasks.observability.logs import configure_logging

    def setup(logger: Any = None, **_: Any) -> None:
        configure_logging(saga_app.settings)

    after_setup_logger.connect(setup, weak=False)
    after_setup_task_logger.connect(setup, weak=False)
