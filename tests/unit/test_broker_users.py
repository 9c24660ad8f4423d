"""The broker users of a deployment and their permissions, read as RabbitMQ reads them:
each regular expression against each name. ``tests/integration/test_broker_trust.py``
checks the same permissions against a real broker."""

from __future__ import annotations

import re

from saga_tasks.core.senders import Senders
from saga_tasks.messaging.topology import Topology
from saga_tasks.messaging.users import broker_user, credentials, grants, service_url, vhost_of

QUEUES = {"inventory.commands": "inventory", "payments.commands": "payments"}
SENDERS = Senders(prefix="saga-", participants=QUEUES)

TOPOLOGY = Topology(command_queues=tuple(sorted(QUEUES)), retry_tiers=(1, 10))
GRANTS = {g.service: g for g in grants(TOPOLOGY, SENDERS)}
CONTROL = ["celery.pidbox", "reply.celery.pidbox", "celeryev"]


def may(expression: str, name: str) -> bool:
    return re.search(expression, name) is not None


def test_no_service_may_configure_a_saga_exchange_or_queue():
    saga_names = [q.name for q in TOPOLOGY.all_queues()] + [
        "saga.commands", "saga.replies", "saga.retry", "saga.dlx", "saga.parking",
        "amq.default",
    ]  # fmt: skip
    for grant in GRANTS.values():
        for name in saga_names:
            assert not may(grant.configure, name), (grant.user, name)
        node = f"{grant.service}-1@host.celery.pidbox"  # its worker's remote-control queue
        for name in [*CONTROL, node]:
            assert may(grant.configure, name), (grant.user, name)


def test_a_participant_reads_its_own_queue_only():
    inventory = GRANTS["inventory"]
    for name in [q.name for q in TOPOLOGY.all_queues()]:
        assert may(inventory.read, name) == (name == "inventory.commands"), name
    for node in ("inventory@host", "inventory-0@host.example"):
        assert may(inventory.read, f"{node}.celery.pidbox"), node
    for node in ("orchestrator@host", "payments-1@host", "inventory2@host", "x.inventory@h"):
        assert not may(inventory.read, f"{node}.celery.pidbox"), node


def test_a_participant_writes_replies_retries_holds_and_never_remote_control():
    inventory = GRANTS["inventory"]
    for name in ["saga.replies", "saga.retry", "saga.dlx", "saga.parking", "celeryev"]:
        assert may(inventory.write, name), name
    for name in ["celery.pidbox", "amq.default", "saga.maintenance"]:
        assert not may(inventory.write, name), name
    # saga.commands only with its own routing keys (a topic permission).
    assert may(inventory.write, "saga.commands")
    ((exchange, keys),) = inventory.topic_write
    assert exchange == "saga.commands"
    assert may(keys, "command.inventory.reserve.v1")
    assert may(keys, "command.inventory.#")  # Celery's resend of a message from a retry tier
    assert not may(keys, "command.payments.authorize.v1")
    assert not may(keys, "command.inventory2.reserve.v1")


def test_the_orchestrator_reads_replies_and_holdings_and_writes_commands():
    orchestrator = GRANTS["orchestrator"]
    for name in ["saga.replies", "saga.maintenance", "saga.dead_letter", "saga.parking_lot"]:
        assert may(orchestrator.read, name), name
    for name in ["inventory.commands", "payments.commands", "inventory.commands.retry.1s"]:
        assert not may(orchestrator.read, name), name
    for name in ["saga.commands", "saga.replies", "amq.default", "celery.pidbox"]:
        assert may(orchestrator.write, name), name
    assert orchestrator.topic_write == ()


def test_broker_urls_and_users():
    assert broker_user("amqp://guest:guest@127.0.0.1:5672//") == "guest"
    assert broker_user("amqp://127.0.0.1//") == "guest"
    assert broker_user("amqp://b%40x:p@h/v") == "b@x"
    assert broker_user("amqp://guest:Pa/ss#w0rd@127.0.0.1:5999//") == "guest"
    assert broker_user("amqp://a:b@h1//;amqp://c:d@h2//") == "a"
    url = service_url("amqp://admin:secret@rabbit:5672/saga", "saga-inventory", "p/w:@")
    assert url == "amqp://saga-inventory:p%2Fw%3A%40@rabbit:5672/saga"
    assert credentials(url) == ("saga-inventory", "p/w:@")
    assert vhost_of(url) == "saga"
    assert vhost_of("amqp://g:g@h:5672//") == "/"
