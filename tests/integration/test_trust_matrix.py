"""The trust matrix (``saga_tasks.ops.trust``), cell by cell, against a real RabbitMQ with
the users ``saga-tasks broker users`` makes: for every row, each credential acts (the
orchestrator's user, each participant about its own queue and steps and about every other
participant's, the administrator that deploys) and the outcome is compared with the cell.

What the broker refuses is the broker's word (a channel error). What a worker does with
what the broker delivered is the workers' own decision code run on the delivered message
in this process (``saga_tasks.testing.run``: the task gate, then the reply or command
path, as the worker task calls them; ``tests/e2e/test_task_gate.py`` shows real workers
apply the same gate). Held messages go through the intake.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from amqp.exceptions import AccessRefused, PreconditionFailed
from kombu import Connection

from saga_tasks.core.messages import REPLY_TASK, command_headers
from saga_tasks.core.states import MessageKind, SagaStatus, StepStatus
from saga_tasks.messaging.topology import (
    MAINTENANCE_QUEUE,
    REPLY_QUEUE,
    REPLY_ROUTING_KEY,
    retry_queue,
)
from saga_tasks.messaging.users import REMOTE_CONTROL
from saga_tasks.ops.trust import MATRIX, Credential, Verdict, markdown
from saga_tasks.runtime.holding import DEAD_LETTER, PARKING
from saga_tasks.testing import drain, run, wait_for
from tests.docs import page
from tests.helpers import ORDER, held, publish_task

PARTICIPANTS = ("orders", "inventory", "payments")
STEP = {"orders": "create_order", "inventory": "reserve_stock", "payments": "authorize_payment"}
TASK = {
    "orders": "orders.create",
    "inventory": "inventory.reserve",
    "payments": "payments.authorize",
}
BROKER_ROWS = {r.key for r in MATRIX if r.key.split(".")[0] in ("read", "publish", "configure")}
PLAIN = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}


def actors(users) -> list[tuple[Credential, str, str]]:
    """(column, who acts, the participant the action is about), every combination."""
    admin = users.admin_settings.broker_url
    found = [(Credential.ORCHESTRATOR, "orchestrator", t) for t in PARTICIPANTS]
    found += [(Credential.OWN, p, p) for p in PARTICIPANTS]
    found += [(Credential.OTHER, p, t) for p in PARTICIPANTS for t in PARTICIPANTS if t != p]
    found += [(Credential.ADMINISTRATOR, admin, t) for t in PARTICIPANTS]
    return found


def url_of(users, actor: str) -> str:
    return actor if "://" in actor else users.url(actor)


def user_of(users, actor: str) -> str:
    return "guest" if "://" in actor else users.user(actor)


def test_the_trust_guide_shows_the_matrix():
    guide = page("guides/security.md").read_text()
    assert markdown() in guide, "the trust guide's trust matrix differs from saga_tasks.ops.trust"


# -- the broker -----------------------------------------------------------------------------


def broker_verdict(url: str, action: Callable[[Any], None]) -> Verdict:
    with Connection(url) as conn:
        channel = conn.channel()
        try:
            action(channel)
            channel.basic_qos(0, 1, False)  # a round trip: an asynchronous refusal shows here
        except (AccessRefused, PreconditionFailed):
            return Verdict.BROKER
        return Verdict.ALLOWED


def publish(exchange: str, key: str, **properties: Any) -> Callable[[Any], None]:
    def act(channel: Any) -> None:
        channel.confirm_select()
        message = channel.prepare_message(b"[[], {}, {}]", properties=properties)
        channel.basic_publish(message, exchange=exchange, routing_key=key)

    return act


def broker_action(users, key: str, actor: str, target: str) -> Callable[[Any], None]:
    own = f"{target}.commands"
    get = {
        "read.commands": own,
        "read.replies": REPLY_QUEUE,
        "read.maintenance": MAINTENANCE_QUEUE,
        "read.dead_letter": "saga.dead_letter",
        "read.parking": "saga.parking_lot",
        "read.retry": retry_queue(own, 1),
    }
    if key in get:
        return lambda ch: ch.basic_get(queue=get[key])
    if key == "publish.commands":
        return publish("saga.commands", f"command.{target}.anything.v1")
    if key == "publish.by_name":
        return publish("", own)
    if key == "publish.maintenance":
        return publish(MAINTENANCE_QUEUE, MAINTENANCE_QUEUE)
    if key == "publish.remote_control":
        return publish(REMOTE_CONTROL, "")
    if key == "publish.as_another":
        someone = users.user("payments" if user_of(users, actor).endswith("orders") else "orders")
        return publish("saga.replies", REPLY_ROUTING_KEY, user_id=someone)
    if key == "configure.queue":
        queue = users.admin_app.topology.queue(own)
        return lambda ch: queue(ch).declare()
    raise AssertionError(f"no broker action for {key}")


def test_what_the_broker_lets_each_credential_do(service_users, order_app):
    users = service_users
    users.admin_app = order_app
    with Connection(order_app.settings.broker_url) as conn:  # as Celery's workers declare it
        conn.channel().exchange_declare(REMOTE_CONTROL, "fanout", auto_delete=False)
    wrong = []
    for row in (r for r in MATRIX if r.key in BROKER_ROWS):
        for column, actor, target in actors(users):
            action = broker_action(users, row.key, actor, target)
            found = broker_verdict(url_of(users, actor), action)
            if found is not row.verdict(column):
                wrong.append(f"{row.key} by {user_of(users, actor)} about {target}: {found}")
    assert wrong == []


# -- the workers ----------------------------------------------------------------------------


class Deployment:
    """The example run in this process as its services would run it, each with its own
    broker user: sagas moved to a step, messages handled as a worker would."""

    def __init__(self, users) -> None:
        self.users = users
        self.apps = {name: users.app(name) for name in ("orchestrator", *PARTICIPANTS)}
        self.orchestrator = self.apps["orchestrator"]

    def handle(self, queue: str) -> list[str]:
        """Drain ``queue`` as its consumer and handle each message; the outcomes."""
        consumer = "orchestrator" if queue == REPLY_QUEUE else queue.removesuffix(".commands")
        messages = drain(self.users.url(consumer), queue)
        return [run(self.apps[consumer], m) for m in messages]

    def at_step(self, target: str) -> tuple[str, str]:
        """A new order saga whose ``target`` step is requested, its command taken off the
        queue unrun; (saga id, command id)."""
        for name in PARTICIPANTS:  # what earlier cells' sagas sent on: not this saga's
            drain(self.users.url(name), f"{name}.commands")
        handle = self.orchestrator.start_saga("order", f"trust-{uuid.uuid4()}", ORDER)
        for name in PARTICIPANTS:
            if name == target:
                break
            assert self.handle(f"{name}.commands") == ["success"]
            assert self.handle(REPLY_QUEUE) == ["accepted"]
        drain(self.users.url(target), f"{target}.commands")
        state = self.orchestrator.orchestrator.get(handle.saga_id)
        assert state.steps[STEP[target]].status is StepStatus.REQUESTED
        return handle.saga_id, str(state.steps[STEP[target]].command_id)

    def version(self, saga_id: str) -> tuple[SagaStatus, int]:
        state = self.orchestrator.orchestrator.get(saga_id)
        return state.status, state.version


def reply(saga_id: str, step: str, command_id: str, embed: dict[str, Any]) -> tuple[list, dict]:
    headers = {
        "saga_id": saga_id,
        "saga_step": step,
        "saga_message_kind": "reply",
        "saga_reply_to_kind": "command",
        "saga_command_id": command_id,
    }
    return [[], {"outcome": "success", "result": {"by": "whoever"}}, embed], headers


def command(target: str) -> tuple[list, dict]:
    saga_id = str(uuid.uuid4())
    headers = command_headers(
        saga_id=saga_id,
        saga_type="order",
        step=STEP[target],
        kind=MessageKind.COMMAND,
        command_id=str(uuid.uuid4()),
        attempt=1,
        correlation_id=saga_id,
        causation_id=None,
        compensates=None,
        traceparent=None,
    )
    return [[], {"saga_payload": ORDER, "results": {}}, PLAIN], dict(headers)


def worker_verdict(d: Deployment, key: str, actor: str, target: str) -> Verdict:
    url = url_of(d.users, actor)
    if key == "reply.step":
        saga_id, command_id = d.at_step(target)
        body, headers = reply(saga_id, STEP[target], command_id, PLAIN)
        publish_task(url, "saga.replies", REPLY_ROUTING_KEY, REPLY_TASK, body, **headers)
        (outcome,) = d.handle(REPLY_QUEUE)
        if outcome == "accepted":
            return Verdict.ALLOWED
        assert outcome.startswith("refused") or outcome == "invalid", outcome
        assert d.version(saga_id)[0] is SagaStatus.RUNNING
        return Verdict.WORKER
    if key == "task.follow_up":
        saga_id, command_id = d.at_step(target)
        before = d.version(saga_id)
        chained = {**PLAIN, "chain": [{"task": TASK[target], "options": {}}]}
        body, headers = reply(saga_id, STEP[target], command_id, chained)
        publish_task(url, "saga.replies", REPLY_ROUTING_KEY, REPLY_TASK, body, **headers)
        (outcome,) = d.handle(REPLY_QUEUE)
        assert d.version(saga_id) == before
        return Verdict.WORKER if outcome.startswith("refused: ") else Verdict.ALLOWED
    if key == "task.not_its_queue":
        body, headers = command(target)
        for task in ("celery.accumulate", "saga_tasks.sample_status", TASK[target]):
            publish_task(url, "saga.replies", REPLY_ROUTING_KEY, task, body, **headers)
        outcomes = d.handle(REPLY_QUEUE)
        assert len(outcomes) == 3
        refused = all(o.startswith("refused: ") for o in outcomes)
        return Verdict.WORKER if refused else Verdict.ALLOWED
    if key == "command.retry_tier":
        body, headers = command(target)
        tier = retry_queue(f"{target}.commands", 1)
        publish_task(url, "saga.retry", tier, TASK[target], body, **headers)
        queue, owner = f"{target}.commands", d.users.url(target)
        (message,) = wait_for(
            lambda: drain(owner, queue), timeout=10, describe="back from the tier"
        )
        outcome = run(d.apps[target], message)
        ran = not outcome.startswith("refused") and outcome != "invalid"
        return Verdict.ALLOWED if ran else Verdict.WORKER
    if key in ("dead_letter.step", "park"):
        saga_id, command_id = d.at_step(target)
        before = d.version(saga_id)
        headers = {
            "saga_id": saga_id,
            "saga_step": STEP[target],
            "saga_message_kind": "command",
            "saga_command_id": command_id,
            "x-death": [{"count": 1, "reason": "rejected", "queue": f"{target}.commands"}],
        }
        holding = DEAD_LETTER if key == "dead_letter.step" else PARKING
        exchange, routing = (
            ("saga.dlx", f"{target}.commands")
            if holding == DEAD_LETTER
            else ("saga.parking", "saga.parking_lot")
        )
        sent = publish_task(url, exchange, routing, TASK[target], [[], {}, PLAIN], **headers)
        assert d.orchestrator.intake.take(holding).taken == 1
        (row,) = [h for h in held(d.orchestrator, holding) if h["message_id"] == sent]
        if d.version(saga_id) == before:
            return Verdict.HELD
        assert row["attested"], row["reason"]
        return Verdict.ALLOWED
    raise AssertionError(f"no worker action for {key}")


@pytest.mark.parametrize("key", [r.key for r in MATRIX if r.key not in BROKER_ROWS])
def test_what_the_workers_do_with_what_each_credential_sends(service_users, key):
    d = Deployment(service_users)
    row = next(r for r in MATRIX if r.key == key)
    wrong = []
    for column, actor, target in actors(service_users):
        found = worker_verdict(d, key, actor, target)
        if found is not row.verdict(column):
            wrong.append(f"{key} by {user_of(service_users, actor)} about {target}: {found}")
    assert wrong == []


def test_every_row_is_performed():
    performed = BROKER_ROWS | {
        "reply.step",
        "task.follow_up",
        "task.not_its_queue",
        "command.retry_tier",
        "dead_letter.step",
        "park",
    }
    assert {r.key for r in MATRIX} == performed
    with pytest.raises(AssertionError, match="no broker action"):
        broker_action(None, "nothing", "", "")
