"""The broker as a trust boundary, against a real RabbitMQ with the users the project makes.

Each test runs ``saga-tasks broker users`` in its own vhost (an administrator's URL,
``SAGA_BROKER_USER_PREFIX`` set; the ``service_users`` fixture), then acts as the
services would, each with the URL its env file holds: what a credential may do, and what
a forged reply or dead letter does (nothing but a record). ``tests/e2e/test_broker_trust``
runs real workers with these users.
"""

from __future__ import annotations

import json
import stat
import uuid
from types import SimpleNamespace

import pytest
from amqp.exceptions import AccessRefused, PreconditionFailed
from kombu import Connection

from saga_tasks.core.states import SagaStatus, StepStatus
from saga_tasks.errors import ServiceUnavailable
from saga_tasks.observability import metrics
from saga_tasks.runtime.holding import DEAD_LETTER
from saga_tasks.testing import RabbitAdmin, drain, run_command, run_reply, wait_for
from tests.helpers import (
    ORDER,
    ServiceUsers,
    forged_reply,
    held,
    publish_as,
    reserve_command_id,
    rows,
    saga_cli,
    scalar,
)


def refused(url: str, action) -> str:
    """What the broker says when ``action(channel)`` is not allowed to ``url``'s user."""
    with Connection(url) as conn:
        channel = conn.channel()
        with pytest.raises((AccessRefused, PreconditionFailed)) as caught:
            action(channel)
            channel.basic_qos(0, 1, False)  # a round trip: an async refusal surfaces here
    return str(caught.value)


def to_reserve(users: ServiceUsers, orchestrator, key: str):
    """A saga whose create_order ran (as orders) and whose reserve_stock was requested."""
    orders = users.app("orders")
    handle = orchestrator.start_saga("order", key, ORDER)
    (command,) = drain(users.url("orders"), "orders.commands")
    assert command["user_id"] == users.user("orchestrator")
    assert run_command(orders, command) == "success"
    (reply,) = drain(users.url("orchestrator"), "saga.replies")
    assert reply["user_id"] == users.user("orders")
    assert run_reply(orchestrator, reply).value == "accepted"
    return handle


# -- what each credential may do ----------------------------------------------------------


def test_broker_users_makes_each_service_user_once_with_its_env_file(service_users):
    again = service_users.users("--json")
    assert again.returncode == 0, again.stderr
    report = json.loads(again.stdout)
    services = ["orchestrator", "inventory", "orders", "payments", "returns"]
    assert [u["service"] for u in report["users"]] == services
    assert {u["password"] for u in report["users"]} == {"kept"}  # idempotent
    for service in ServiceUsers.SERVICES:
        path = service_users.env_dir / f"{service}.env"
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert f"SAGA_BROKER_USER_PREFIX={service_users.prefix}" in path.read_text()
        password = service_users.url(service).split("@")[0].rsplit(":", 1)[1]
        assert len(password) >= 24 and password not in again.stdout + again.stderr
    admin = RabbitAdmin()
    vhost = service_users.isolation.ident
    granted = admin.permissions(vhost, service_users.user("inventory"))
    assert granted == {k: report["users"][1][k] for k in ("configure", "write", "read")}

    # A user whose password nobody holds any more is not silently given a new one.
    (service_users.env_dir / "payments.env").unlink()
    lost = service_users.users()
    assert lost.returncode == 1 and "--rotate" in lost.stderr
    rotated = service_users.users("--rotate", "--json")
    assert rotated.returncode == 0, rotated.stderr
    assert {u["password"] for u in json.loads(rotated.stdout)["users"]} == {"rotated", "new"}


def test_a_participant_reads_only_its_queue_and_sends_commands_only_to_itself(service_users):
    inventory = service_users.url("inventory")
    for queue in ("payments.commands", "orders.commands", "saga.replies", "saga.dead_letter"):
        said = refused(inventory, lambda ch, q=queue: ch.basic_get(queue=q))
        assert "ACCESS_REFUSED" in said and queue in said
    said = refused(
        inventory, lambda ch: ch.basic_consume(queue="payments.commands", callback=print)
    )
    assert "ACCESS_REFUSED" in said

    def send(exchange: str, key: str, **props):
        return lambda ch: ch.basic_publish(
            ch.prepare_message(b"{}", properties=props), exchange=exchange, routing_key=key
        )

    assert "ACCESS_REFUSED" in refused(
        inventory, send("saga.commands", "command.payments.authorize.v1")
    )
    assert "ACCESS_REFUSED" in refused(inventory, send("", "payments.commands"))
    assert "ACCESS_REFUSED" in refused(inventory, send("celery.pidbox", ""))  # remote control
    said = refused(
        inventory, send("saga.replies", "reply.saga.v1", user_id=service_users.user("inventory2"))
    )
    assert "PRECONDITION_FAILED" in said and "user_id" in said
    # Configure: nothing of the saga topology, not even its own queue.
    said = refused(inventory, lambda ch: ch.queue_delete(queue="inventory.commands"))
    assert "ACCESS_REFUSED" in said
    assert "ACCESS_REFUSED" in refused(
        inventory, lambda ch: ch.queue_declare(queue="inventory.commands", durable=True)
    )
    # The orchestrator reads replies, never a participant's commands.
    orchestrator = service_users.url("orchestrator")
    assert "ACCESS_REFUSED" in refused(
        orchestrator, lambda ch: ch.basic_get(queue="inventory.commands")
    )
    # What a participant does need works: its own commands (Celery's resends), a reply.
    publish_as(inventory, "saga.commands", "command.inventory.#", {"task": "x"}, {})
    publish_as(inventory, "saga.replies", "reply.saga.v1", {"task": "x"}, {})
    assert len(drain(inventory, "inventory.commands")) == 1


# -- forged messages change nothing ---------------------------------------------------------


def test_a_forged_reply_is_refused_counted_and_leaves_no_trace(service_users):
    orchestrator = service_users.app("orchestrator")
    handle = to_reserve(service_users, orchestrator, "reply-forged")
    before = orchestrator.orchestrator.get(handle.saga_id)
    forged = forged_reply(handle.saga_id, reserve_command_id(orchestrator, handle.saga_id))
    service_users.app("payments").publisher.publish([forged])
    counted = metrics.SENDERS_REFUSED.labels(consumer="orchestrator")._value.get()

    (reply,) = drain(service_users.url("orchestrator"), "saga.replies")
    assert reply["user_id"] == service_users.user("payments")
    assert run_reply(orchestrator, reply).value == "invalid"

    assert metrics.SENDERS_REFUSED.labels(consumer="orchestrator")._value.get() == counted + 1
    after = orchestrator.orchestrator.get(handle.saga_id)
    assert (after.status, after.version) == (before.status, before.version)
    assert after.steps["reserve_stock"].status is StepStatus.REQUESTED
    engine = orchestrator.engine
    inbox = "SELECT count(*) FROM saga.inbox WHERE message_id = :m"
    assert scalar(engine, inbox, m=forged.message_id) == 0
    (record,) = rows(engine, "SELECT * FROM saga.invalid_message")
    assert record["message_id"] == forged.message_id
    assert service_users.user("payments") in record["reason"]
    assert record["reason"].endswith("may send it")


def test_a_forged_dead_letter_moves_no_saga_and_a_real_one_still_does(service_users):
    orchestrator = service_users.app("orchestrator")
    handle = to_reserve(service_users, orchestrator, "dl-forged")
    saga_id = handle.saga_id
    before = orchestrator.orchestrator.get(saga_id)
    command_id = reserve_command_id(orchestrator, saga_id)
    made_up = {
        "task": "inventory.reserve",
        "id": str(uuid.uuid4()),
        "saga_id": saga_id,
        "saga_step": "reserve_stock",
        "saga_message_kind": "command",
        "saga_command_id": command_id,
        "saga_dead_reason": "poison: the warehouse burned down, call +1 555 0100",
        "saga_dead_from": "inventory.commands",
        "x-death": [
            {"count": 1, "reason": "rejected", "queue": "inventory.commands", "exchange": ""}
        ],
        "x-first-death-reason": "rejected",
    }
    payments = service_users.url("payments")
    as_payments = {"user_id": service_users.user("payments")}
    publish_as(payments, "saga.dlx", "inventory.commands", made_up, {}, **as_payments)
    unsigned = {**made_up, "id": str(uuid.uuid4())}
    publish_as(payments, "saga.dlx", "inventory.commands", unsigned, {})

    assert orchestrator.intake.take(DEAD_LETTER).taken == 2

    after = orchestrator.orchestrator.get(saga_id)
    assert (after.status, after.version) == (SagaStatus.RUNNING, before.version)
    assert after.steps["reserve_stock"].status is StepStatus.REQUESTED
    forged = held(orchestrator)
    assert [h["attested"] for h in forged] == [False, False]
    assert [h["published_by"] for h in forged] == [service_users.user("payments"), None]
    for h in forged:
        assert h["reason"].startswith("not attested: dead letter of step 'reserve_stock'")
        assert "it claims: poison: the warehouse burned down" in h["reason"]
    assert "from broker user" in forged[0]["reason"] and "no AMQP user_id" in forged[1]["reason"]
    notes = rows(
        orchestrator.engine,
        "SELECT event, reason FROM saga.saga_history WHERE saga_id = :s AND event LIKE 'held%'",
        s=saga_id,
    )
    assert [n["event"] for n in notes] == ["held_not_attested", "held_not_attested"]

    env = service_users.deploy_env(**service_users.worker_env("orchestrator"))
    shown = saga_cli("dlq", "show", str(forged[0]["id"]), env=env)
    assert shown.returncode == 0, shown.stderr
    assert "attested         NO: not dead-lettered by the broker" in shown.stdout
    assert "BLOCKS  sender" in shown.stdout
    listed = saga_cli("dlq", "list", env=env)
    assert listed.stdout.count("not attested: dead letter of step") == 2

    # A real dead letter: the inventory worker's user rejects the command, the broker
    # dead-letters it, and it keeps its publisher (the orchestrator): the saga moves.
    inventory = service_users.url("inventory")
    with Connection(inventory) as conn:
        channel = conn.channel()
        message = channel.basic_get(queue="inventory.commands", no_ack=False)
        channel.basic_reject(message.delivery_tag, requeue=False)
        channel.close()
    assert orchestrator.intake.take(DEAD_LETTER).taken == 1
    real = held(orchestrator)[-1]
    assert (real["attested"], real["published_by"]) == (True, service_users.user("orchestrator"))
    assert real["reason"] == "rejected by the broker"
    assert orchestrator.orchestrator.get(saga_id).status is SagaStatus.COMPENSATING


@pytest.mark.timeout(180)  # 2,000 messages through the intake, two tests at a time
def test_a_flood_of_forged_dead_letters_leaves_the_saga_small(service_users, order_app):
    """2,000 dead letters a participant forges about another's step move nothing, and
    no longer grow the saga's history by 2,000 notes nor its ``GET`` to megabytes: the
    newest few notes are kept and the rest counted, the held messages it lists are
    bounded (counted too), and the history comes a page at a time."""
    from fastapi.testclient import TestClient

    from saga_tasks.persistence.sagas import NOTES_KEPT
    from saga_tasks.web import create_web_app
    from tests.helpers import ANA_TOKEN

    orchestrator = service_users.app("orchestrator")
    saga_id = to_reserve(service_users, orchestrator, "dl-flood").saga_id
    before = orchestrator.orchestrator.get(saga_id)
    lines = scalar(orchestrator.engine, "SELECT count(*) FROM saga.saga_history")
    forged = {
        "task": "inventory.reserve",
        "saga_id": saga_id,
        "saga_step": "reserve_stock",
        "saga_message_kind": "command",
        "saga_command_id": reserve_command_id(orchestrator, saga_id),
        "saga_dead_reason": "the warehouse burned down",
        "saga_dead_from": "inventory.commands",
    }
    flood = 2000
    with Connection(service_users.url("payments")) as conn:
        channel = conn.channel()
        channel.confirm_select()
        for _ in range(flood):
            message = channel.prepare_message(
                b"[[], {}, {}]",
                content_type="application/json",
                content_encoding="utf-8",
                headers={**forged, "id": str(uuid.uuid4())},
                properties={"user_id": service_users.user("payments")},
            )
            channel.basic_publish(message, exchange="saga.dlx", routing_key="inventory.commands")
        channel.close()
    taken = 0
    while taken < flood:
        report = orchestrator.intake.take(DEAD_LETTER)
        assert report.taken, f"{taken} of {flood} taken"
        taken += report.taken

    after = orchestrator.orchestrator.get(saga_id)
    assert (after.status, after.version) == (SagaStatus.RUNNING, before.version)
    assert scalar(orchestrator.engine, "SELECT count(*) FROM saga.saga_history") == (
        lines + NOTES_KEPT
    ), "history bounded"
    with TestClient(create_web_app(order_app)) as client:
        auth = {"Authorization": f"Bearer {ANA_TOKEN}"}
        answer = client.get(f"/sagas/{saga_id}", headers=auth)
        assert answer.status_code == 200
        assert len(answer.content) < 25_000, len(answer.content)
        view = answer.json()
        assert view["notes"] == [{"event": "held_not_attested", "noted": flood,
                                  "dropped": flood - NOTES_KEPT,
                                  "last_at": view["notes"][0]["last_at"]}]  # fmt: skip
        assert view["held_count"] == {"total": flood, "pending": flood, "not_attested": flood}
        assert len(view["held_messages"]) == 20
        events = [h["event"] for h in view["history"]]
        assert events[:NOTES_KEPT] == ["held_not_attested"] * NOTES_KEPT
        assert events[NOTES_KEPT:][-1] == "saga_started", "the transitions all kept"
        page = client.get(f"/ui/sagas/{saga_id}", headers=auth)
        assert len(page.content) < 60_000, len(page.content)
        assert f"held_not_attested: {flood} notes, the {flood - NOTES_KEPT} oldest dropped" in (
            page.text
        )
        assert f"20 of {flood} shown" in page.text
    env = service_users.deploy_env(**service_users.worker_env("orchestrator"))
    shown = saga_cli("show", saga_id, env=env)
    assert shown.returncode == 0, shown.stderr
    assert f"held_not_attested: {flood}, the {flood - NOTES_KEPT} oldest dropped" in shown.stdout
    assert f"{flood} pending, {flood} not attested, 20 of {flood} shown" in shown.stdout


# -- the orchestrator's own copies do not launder a forged reply ---------------------------


def _as_delivered(message: dict) -> SimpleNamespace:
    """A drained message as a Celery task request shows it to the failure policy."""
    headers = message["headers"]
    return SimpleNamespace(
        id=headers["id"],
        task=headers["task"],
        headers=headers,
        kwargs=message["kwargs"],
        properties={"user_id": message["user_id"]},
        delivery_info={},
    )


def test_a_copy_of_a_forged_reply_made_by_the_orchestrator_is_still_refused(service_users):
    """An outage copy goes out as the orchestrator's own user; it names the original's
    sender, so on its return it is judged as the forgery it is, not as the orchestrator."""
    orchestrator = service_users.app("orchestrator")
    handle = to_reserve(service_users, orchestrator, "laundered-copy")
    forged = forged_reply(handle.saga_id, reserve_command_id(orchestrator, handle.saga_id))
    service_users.app("payments").publisher.publish([forged])
    url = service_users.url("orchestrator")
    (delivered,) = drain(url, "saga.replies")

    with orchestrator.failures.guard(_as_delivered(delivered), "saga.replies"):
        raise ServiceUnavailable("PostgreSQL", "-", "away for this test")

    (back,) = wait_for(lambda: drain(url, "saga.replies"), timeout=10, describe="the copy back")
    assert back["user_id"] == service_users.user("orchestrator")
    assert back["headers"]["saga_sent_by"] == service_users.user("payments")
    sender = orchestrator.failures.sender(_as_delivered(back))
    assert sender == service_users.user("payments")
    outcome = orchestrator.orchestrator.handle_reply(
        back["headers"]["id"], back["headers"], back["kwargs"], sender=sender
    )
    assert outcome.value == "invalid"
    assert orchestrator.orchestrator.get(handle.saga_id).status is SagaStatus.RUNNING


def test_a_forged_reply_the_orchestrator_dead_letters_is_not_attested(service_users):
    """Held by the orchestrator (its retries spent), a forged reply stays a forgery: the
    dead letter names its sender, and the intake does not let it send the saga to review."""
    orchestrator = service_users.app("orchestrator")
    handle = to_reserve(service_users, orchestrator, "laundered-hold")
    forged = forged_reply(handle.saga_id, reserve_command_id(orchestrator, handle.saga_id))
    service_users.app("payments").publisher.publish([forged])
    (delivered,) = drain(service_users.url("orchestrator"), "saga.replies")
    request = _as_delivered(delivered)
    request.headers = {**request.headers, "saga_retry": 99}  # no retry left

    with orchestrator.failures.guard(request, "saga.replies"):
        raise RuntimeError("the orchestrator failed on it")

    assert orchestrator.intake.take(DEAD_LETTER).taken == 1
    (letter,) = held(orchestrator)
    assert (letter["published_by"], letter["attested"]) == (
        service_users.user("orchestrator"),
        False,
    )
    assert f"held by broker user {service_users.user('orchestrator')!r}" in letter["reason"]
    assert orchestrator.orchestrator.get(handle.saga_id).status is SagaStatus.RUNNING


def test_a_dead_reply_moves_its_saga_only_naming_the_awaited_command(service_users):
    """The step's own participant may dead-letter its replies (attested), but knowing the
    saga's id is not enough: only a dead reply to the command the step awaits moves it."""
    orchestrator = service_users.app("orchestrator")
    handle = to_reserve(service_users, orchestrator, "dead-reply")
    saga_id = handle.saga_id
    before = orchestrator.orchestrator.get(saga_id)
    inventory = service_users.url("inventory")
    as_inventory = {"user_id": service_users.user("inventory")}

    def dead_reply(command_id: str | None) -> None:
        headers = {
            "task": "saga_tasks.reply",
            "id": str(uuid.uuid4()),
            "saga_id": saga_id,
            "saga_step": "reserve_stock",
            "saga_message_kind": "reply",
            "saga_reply_to_kind": "command",
            "x-death": [{"count": 1, "reason": "rejected", "queue": "saga.replies"}],
        }
        if command_id is not None:
            headers["saga_command_id"] = command_id
        publish_as(inventory, "saga.dlx", "saga.replies", headers, {}, **as_inventory)

    dead_reply(None)
    dead_reply(str(uuid.uuid4()))
    assert orchestrator.intake.take(DEAD_LETTER).taken == 2
    assert [h["attested"] for h in held(orchestrator)] == [True, True]
    after = orchestrator.orchestrator.get(saga_id)
    assert (after.status, after.version) == (SagaStatus.RUNNING, before.version)
    notes = rows(
        orchestrator.engine,
        "SELECT event, reason FROM saga.saga_history WHERE saga_id = :s AND event LIKE 'dead%'",
        s=saga_id,
    )
    assert [n["event"] for n in notes] == ["dead_letter_recorded"] * 2

    dead_reply(reserve_command_id(orchestrator, saga_id))
    assert orchestrator.intake.take(DEAD_LETTER).taken == 1
    assert orchestrator.orchestrator.get(saga_id).status is SagaStatus.MANUAL_REVIEW
