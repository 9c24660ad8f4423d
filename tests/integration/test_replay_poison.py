"""Replay blocks poison (a message its worker died on) and only poison: spent retries are
the commonest replay an operator wants, and a dead letter says which of the two it is.

Dead letters here are made by the broker itself wherever it can make them: a message
rejected off its work queue, and one a quorum queue dead-lettered at its delivery limit.
"""

from __future__ import annotations

import dataclasses

import pytest
from kombu import Connection

from saga_tasks.core.states import SagaStatus
from saga_tasks.messaging.topology import QUORUM_DELIVERY_LIMIT
from saga_tasks.ops.views import held_list, held_show
from saga_tasks.runtime.holding import DEAD_LETTER
from saga_tasks.testing import queue_depths, wait_for, wait_for_status
from tests.helpers import ORDER, build_order_app, drain, run_command, run_reply, to_reserve


def checks_of(app, held_id):
    return {c["check"]: c for c in held_show(app, held_id)["replay_checks"]}


def only_held(app):
    (held,) = held_list(app, DEAD_LETTER)["messages"]
    return held


@pytest.mark.demo_faults
def test_spent_transient_retries_are_not_poison_and_replay_without_force(settings, workers):
    # The library's default poison limit, and as many retry tiers as the defaults have.
    defaults = dataclasses.replace(settings, poison_limit=3)
    app = build_order_app(defaults, on_dead_letter="manual_review", faults=True)
    try:
        workers.orchestrator()
        workers.participants()
        handle = app.start_saga(
            "order", "spent-1", {**ORDER, "demo_faults": {"payments.authorize": "transient:9"}}
        )
        wait_for(
            lambda: queue_depths(defaults.broker_url, ["saga.dead_letter"])["saga.dead_letter"],
            timeout=60,
            describe="the command dead-lettered once its retries ran out",
        )
        # The intake of this process: its saga waits for a person on a dead letter.
        app.intake.take(DEAD_LETTER)
        wait_for_status(app, handle.saga_id, [SagaStatus.MANUAL_REVIEW], timeout=10)
        held = only_held(app)
        assert held["reason"].startswith("retries exhausted (3) after TransientError")
        checks = checks_of(app, held["id"])
        assert not checks["deaths"]["blocks"], checks["deaths"]
        assert "not poison" in checks["deaths"]["finding"]
        assert "3 retries" in checks["deaths"]["finding"]
        assert [c for c in checks.values() if c["blocks"]] == []
        result = app.replayer.replay(held["id"], actor="ana", reason="payments is back")
        assert result.replayed and not result.forced
    finally:
        app.close()


def test_a_message_re_sent_for_lost_worker_processes_is_poison(order_app, settings):
    """Celery re-sends a task whose pool child died (``retries``), then rejects it."""
    app, url = order_app, settings.broker_url
    to_reserve(app, url, "lost-1")
    with Connection(url) as conn:
        channel = conn.channel()
        original = channel.basic_get(queue="inventory.commands", no_ack=False)
        # Celery's re-send after the third lost child: the same message, retries=3 ...
        channel.basic_publish(
            channel.prepare_message(
                original.body,
                content_type=original.content_type,
                content_encoding=original.content_encoding,
                headers={**original.headers, "retries": 3},
            ),
            exchange="",
            routing_key="inventory.commands",
        )
        channel.basic_ack(original.delivery_tag)
        # ... which it rejects when that child dies too (max_retries reached).
        resent = wait_for(
            lambda: channel.basic_get(queue="inventory.commands", no_ack=False),
            timeout=10,
            describe="the re-sent command",
        )
        channel.basic_reject(resent.delivery_tag, requeue=False)
        channel.close()
    app.intake.take(DEAD_LETTER)
    held = only_held(app)
    assert held["reason"].startswith("poison: ")
    assert "3 re-sends for lost worker processes" in held["reason"]
    assert held["death_count"] == 4
    deaths = checks_of(app, held["id"])["deaths"]
    assert deaths["blocks"] and "poison" in deaths["finding"]


def test_a_quorum_queue_s_delivery_limit_is_poison(settings):
    quorum = dataclasses.replace(settings, queue_type="quorum")
    app = build_order_app(quorum)
    url = settings.broker_url
    try:
        handle = app.start_saga("order", "limit-1", ORDER)
        run_command(app, drain(url, "orders.commands")[0])
        run_reply(app, drain(url, "saga.replies")[0])
        # The reserve command comes back unacked every time, as when its worker dies.
        with Connection(url) as conn:
            channel = conn.channel()
            for _ in range(QUORUM_DELIVERY_LIMIT + 1):
                message = wait_for(
                    lambda ch=channel: ch.basic_get(queue="inventory.commands", no_ack=False),
                    timeout=10,
                    describe="the command back on its queue",
                )
                channel.basic_reject(message.delivery_tag, requeue=True)
            channel.close()
        wait_for(
            lambda: queue_depths(url, ["saga.dead_letter"])["saga.dead_letter"] == 1,
            timeout=10,
            describe="the broker to dead-letter the command at its delivery limit",
        )
        app.intake.take(DEAD_LETTER)
        held = only_held(app)
        assert str(held["saga_id"]) == handle.saga_id
        assert held["reason"].startswith("poison: delivery_limit")
        assert held["death_count"] == QUORUM_DELIVERY_LIMIT + 1
        deaths = checks_of(app, held["id"])["deaths"]
        assert deaths["blocks"] and "poison" in deaths["finding"]
    finally:
        app.close()
