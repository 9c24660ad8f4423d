"""The Celery app of a deployment, configured from its settings and topology.

Every process of a deployment builds the same configuration: the same queues, the
same acknowledgement rules (late acks, no ack on failure: the failure policy decides),
publisher confirms, and one beat at a time (a lease in Redis).
"""

from __future__ import annotations

import hashlib
from functools import cached_property
from typing import Any

import redis
from celery import Celery
from celery.app.amqp import AMQP

from saga_tasks.config import Settings
from saga_tasks.messaging.topology import MAINTENANCE_QUEUE, Topology
from saga_tasks.messaging.users import broker_user
from saga_tasks.urls import mask_url

CONSUMER = "saga_tasks.worker.consumer:SagaConsumer"
BEAT_SCHEDULER = "saga_tasks.worker.scheduler:SagaBeat"
"""Redbeat's scheduler plus the app's schedules (``SagaApp(schedules=[...])``)."""
"""The worker's consumer: parks what cannot even be decoded instead of dropping it."""


class SignedAMQP(AMQP):
    """Celery's message building, with the AMQP ``user_id`` property set to the user this
    app connects as on every task message it makes: sent by our publisher, re-sent by
    Celery for a lost pool child, or scheduled by beat. RabbitMQ refuses a publish whose
    ``user_id`` is not the connection's user, so a consumer can tell who sent a message
    (``saga_tasks.core.senders``)."""

    @cached_property
    def user_id(self) -> str:
        return broker_user(str(self.app.conf.broker_url))

    def as_task_v2(self, *args: Any, **kwargs: Any) -> Any:
        message = super().as_task_v2(*args, **kwargs)
        message.properties["user_id"] = self.user_id
        return message


def celery_app(name: str, settings: Settings, topology: Topology) -> Celery:
    """A Celery app with no tasks yet (``saga_tasks.worker`` registers them)."""
    celery = Celery(name, set_as_current=False, amqp=f"{__name__}:SignedAMQP")
    celery.conf.update(celery_conf(settings, topology))
    return celery


def celery_conf(settings: Settings, topology: Topology) -> dict[str, Any]:
    return {
        "broker_url": settings.broker_url,
        "result_backend": settings.result_backend,
        "broker_connection_retry_on_startup": True,
        "broker_transport_options": {"confirm_publish": True},
        "task_queues": topology.work_queues(),
        "task_default_queue": MAINTENANCE_QUEUE,
        "task_create_missing_queues": False,
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        "task_ignore_result": True,
        "task_acks_late": True,
        "task_acks_on_failure": False,
        "task_acks_on_timeout": True,
        "task_reject_on_worker_lost": False,
        # A lost prefork child: the message is sent again, at most max_retries times,
        # then dead-lettered (acks_on_failure=False): bounded, never a loop.
        "task_retry_on_worker_lost": True,
        "task_track_started": False,
        "worker_prefetch_multiplier": settings.prefetch_multiplier,
        "worker_send_task_events": settings.task_events,
        "task_send_sent_event": settings.task_events,
        "worker_cancel_long_running_tasks_on_connection_loss": True,
        "worker_consumer": CONSUMER,
        "worker_hijack_root_logger": False,
        # One active beat at a time: a lease in Redis; a standby beat takes over once the
        # lease of a dead one runs out (celery-redbeat). Ours adds the app's schedules.
        "beat_scheduler": BEAT_SCHEDULER,
        "redbeat_redis_url": settings.result_backend,
        "redbeat_key_prefix": beat_key_prefix(settings),
        # Settings refuse a lease shorter than a few of these sleeps (BEAT_LEASE_MARGIN).
        "redbeat_lock_timeout": settings.beat_lease,
        "beat_max_loop_interval": settings.beat_max_interval,
    }


def beat_key_prefix(settings: Settings) -> str:
    """Redis key prefix of this deployment's beat: a digest of its database and vhost,
    so deployments (and test runs) sharing one Redis never share a schedule or a lease."""
    seed = f"{mask_url(settings.database_url)}|{mask_url(settings.broker_url)}"
    return f"saga_tasks:beat:{hashlib.sha256(seed.encode()).hexdigest()[:12]}:"


def forget_beat_state(settings: Settings) -> int:
    """Delete this deployment's beat schedule and lease from Redis; the count deleted."""
    client = redis.Redis.from_url(settings.result_backend)
    try:
        keys = list(client.scan_iter(match=beat_key_prefix(settings) + "*", count=500))
        return int(client.delete(*keys)) if keys else 0
    finally:
        client.close()
