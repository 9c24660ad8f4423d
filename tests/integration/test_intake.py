"""The intake of held messages, and the record of invalid ones, over real services:
a message that cannot be stored as it is never stops what comes behind it."""

from __future__ import annotations

import pytest
from kombu import Connection
from sqlalchemy import text

from saga_tasks.core.states import SagaStatus
from saga_tasks.errors import ActionRefused
from saga_tasks.runtime import invalid
from saga_tasks.runtime.holding import DEAD_LETTER, PARKING
from saga_tasks.testing import queue_depths, wait_for
from tests.helpers import events, held, reject_one, rows, to_reserve

NUL = "\x00"


def publish_dead_letter(url: str, headers: dict, body: bytes = b"[[], {}, {}]") -> None:
    """A message into the dead-letter queue as the broker's DLX would route it there."""
    with Connection(url) as conn:
        channel = conn.channel()
        message = channel.prepare_message(
            body, content_type="application/json", content_encoding="utf-8", headers=headers
        )
        channel.basic_publish(message, exchange="saga.dlx", routing_key="inventory.commands")
        channel.close()


def test_a_held_message_with_a_nul_in_its_headers_is_stored_escaped_not_left_first(
    order_app, settings
):
    app, url = order_app, settings.broker_url
    publish_dead_letter(
        url,
        {
            "task": f"inventory.re{NUL}serve",
            "id": f"nul{NUL}1",
            "saga_step": f"reserve{NUL}stock",
            "saga_message_kind": "command",
            "note": f"a{NUL}b",
            "saga_dead_reason": f"retries exhausted (3) after TransientError: x{NUL}y",
            "saga_dead_from": "inventory.commands",
        },
    )
    handle = to_reserve(app, url, "nul-behind")
    reject_one(url, "inventory.commands")  # a good dead letter behind the bad one

    report = app.intake.take(DEAD_LETTER)

    assert (report.taken, report.recorded, report.fed_to_sagas) == (2, 2, 1)
    assert queue_depths(url, ["saga.dead_letter"]) == {"saga.dead_letter": 0}
    bad, good = held(app)
    assert bad["message_id"] == "nul\\x001" and bad["task_name"] == "inventory.re\\x00serve"
    assert bad["headers"]["note"] == "a\\x00b" and bad["step"] == "reserve\\x00stock"
    assert "stored escaped" in bad["reason"] and "NUL" in bad["reason"]
    assert bad["reason"].startswith("retries exhausted (3) after TransientError: x\\x00y")
    checks = {c.name: c for c in _checks(app, bad)}
    assert checks["stored"].blocks, "a replay would send the escaped copy, not the original"
    assert str(good["saga_id"]) == handle.saga_id and good["step"] == "reserve_stock"
    assert app.orchestrator.get(handle.saga_id).status is SagaStatus.COMPENSATING
    # Taken once: a second pass finds nothing and records nothing twice.
    assert app.intake.take(DEAD_LETTER).taken == 0 and len(held(app)) == 2


def test_a_dead_letter_for_an_unloaded_definition_version_is_held_and_the_rest_goes_on(
    order_app, settings
):
    app, url = order_app, settings.broker_url
    orphan = to_reserve(app, url, "v-orphan")
    with app.engine.begin() as conn:
        conn.execute(
            text("UPDATE saga.saga_instance SET definition_version = 99 WHERE saga_id = :s"),
            {"s": orphan.saga_id},
        )
    reject_one(url, "inventory.commands")
    other = to_reserve(app, url, "v-other")
    reject_one(url, "inventory.commands")

    report = app.intake.take(DEAD_LETTER)

    assert (report.taken, report.recorded, report.fed_to_sagas) == (2, 2, 1)
    assert queue_depths(url, ["saga.dead_letter"]) == {"saga.dead_letter": 0}
    first, second = held(app)
    assert str(first["saga_id"]) == orphan.saga_id
    assert "not fed to its saga" in first["reason"]
    assert "version 99 is not loaded" in first["reason"]
    assert ("dead_letter_not_fed", "system") in events(app, orphan.saga_id)
    assert str(second["saga_id"]) == other.saga_id
    assert app.orchestrator.get(other.saga_id).status is SagaStatus.COMPENSATING


def test_a_parked_message_with_nul_everywhere_is_stored_escaped(order_app, settings):
    app = order_app
    app.holding.park_raw(body=b"{broken", headers={"task": f"orders.{NUL}", "id": f"p{NUL}",
             "saga_id": f"{NUL}", "odd": [f"{NUL}", {f"k{NUL}": b"\xff\x00"}]},
             content_type=f"application/{NUL}json", content_encoding="utf-8",
             reason=f"undecodable body: {NUL}", from_queue="orders.commands")  # fmt: skip
    assert app.intake.take(PARKING).recorded == 1
    (parked,) = held(app, PARKING)
    assert parked["message_id"] == "p\\x00" and parked["content_type"] == "application/\\x00json"
    assert parked["reason"].startswith("undecodable body: \\x00")
    assert parked["headers"]["odd"][1] == {"k\\x00": "\\xff\\x00"}


def test_an_invalid_message_with_a_nul_in_its_task_or_id_is_recorded(order_app):
    invalid.record(
        order_app.engine,
        consumer="worker w@h",
        reason=f"unknown task 'a{NUL}b'",
        task_name=f"a{NUL}b",
        message_id=f"m{NUL}1",
        headers={"task": f"a{NUL}b", "id": f"m{NUL}1", "saga_id": f"s{NUL}"},
        body=b"\x00",
        queue="orders.commands",
        routing_key=f"command.orders.{NUL}",
    )
    (row,) = rows(order_app.engine, "SELECT * FROM saga.invalid_message")
    assert (row["task_name"], row["message_id"]) == ("a\\x00b", "m\\x001")
    assert row["headers"] == {"task": "a\\x00b", "id": "m\\x001", "saga_id": "s\\x00"}
    assert row["reason"] == "unknown task 'a\\x00b'"


def test_a_worker_records_parks_and_acks_a_message_with_a_nul_in_its_task_name(
    order_app, settings, workers
):
    """On a participant's queue the worker counts, logs and parks it (a participant's
    database holds no saga tables); the orchestrator's intake keeps the parked copy with
    its reason."""
    orders = workers.start("orders", ["orders.commands"])
    with Connection(settings.broker_url) as conn:
        channel = conn.channel()
        message = channel.prepare_message(
            b"[[], {}, {}]", content_type="application/json", content_encoding="utf-8",
            headers={"task": f"orders.cre{NUL}ate", "id": f"nul{NUL}task"},
        )  # fmt: skip
        channel.basic_publish(
            message, exchange="saga.commands", routing_key="command.orders.create.v1"
        )
        channel.close()
    # Parked once, acked once: nothing left on the work queue, nothing delivered twice.
    wait_for(
        lambda: (
            queue_depths(settings.broker_url, ["orders.commands", "saga.parking_lot"])
            == {"orders.commands": 0, "saga.parking_lot": 1}
            or (not orders.alive() and "worker died")
        ),
        timeout=30,
        describe="the message acked and parked once",
    )
    assert orders.alive(), orders.tail(40)
    # Parked first, then logged: the line may trail the parked copy by a moment.
    wait_for(
        lambda: "invalid message: unknown task 'orders.cre\\x00ate'" in orders.log_text(),
        timeout=10,
        describe="the worker's log line on the invalid message",
    )
    orders.stop()  # an unacked message would be ready again now
    assert queue_depths(settings.broker_url, ["orders.commands", "saga.parking_lot"]) == {
        "orders.commands": 0,
        "saga.parking_lot": 1,
    }
    assert order_app.intake.take(PARKING).taken == 1
    (row,) = held(order_app, PARKING)
    assert row["message_id"] == "nul\\x00task" and "unknown task" in row["reason"]


def _checks(app, row):
    with app.engine.connect() as conn:
        return app.replayer.checks(conn, row)


def test_a_replay_the_worker_would_refuse_is_refused_even_forced(order_app, settings):
    """A held message naming a task its queue does not run, or asking for a chain, is
    refused by the replay's checks: replayed, it would go out as the operator's process
    and be parked again."""
    app = order_app
    chain = b'[[1], {}, {"chain": [{"task": "inventory.reserve", "options": {}}]}]'
    reply = b'[[], {}, {"callbacks": [{"task": "inventory.restock"}]}]'
    for task, body in (("celery.accumulate", chain), ("saga_tasks.reply", reply)):
        publish_dead_letter(settings.broker_url, {"task": task, "id": f"gate-{task}",
                            "x-death": [{"count": 1, "reason": "rejected",
                                         "queue": "saga.replies", "exchange": ""}]},
                            body)  # fmt: skip
    assert app.intake.take(DEAD_LETTER).taken == 2
    first, second = held(app)
    found = {c.name: c for c in _checks(app, first)}
    assert found["task"].blocks
    assert found["task"].finding == (
        "the worker of saga.replies would refuse it: task 'celery.accumulate' does not run "
        "on saga.replies"
    )
    found = {c.name: c for c in _checks(app, second)}
    assert found["task"].blocks and "follow-up work (callbacks)" in found["task"].finding
    with pytest.raises(ActionRefused, match="would refuse it"):
        app.replayer.replay(first["id"], actor="ana", reason="try it")
    with pytest.raises(ActionRefused, match="would refuse it"):
        app.replayer.replay(
            second["id"], actor="ana", reason="try it", force=True, force_reason="sure"
        )
    assert [h["status"] for h in held(app)] == ["pending", "pending"]
