"""One Idempotency-Key, one saga: concurrent POSTs against a real uvicorn server, real
PostgreSQL and RabbitMQ."""

from __future__ import annotations

import dataclasses
import json
import random
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tests.helpers import ANA_TOKEN, ORDER, build_order_app, drain, scalar

RACERS = 16


@pytest.fixture
def racing_app(settings):
    # Enough connections per process that the racers' transactions really overlap.
    app = build_order_app(dataclasses.replace(settings, db_pool_size=RACERS // 2))
    yield app
    app.close()


@pytest.fixture
def server(racing_app) -> Iterator[str]:
    """The web app on a real uvicorn server in this process; its base URL."""
    import uvicorn

    from saga_tasks.web import create_web_app

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)  # connections wait in the backlog until the server accepts them
    host, port = sock.getsockname()
    uv = uvicorn.Server(
        uvicorn.Config(create_web_app(racing_app), log_level="warning", access_log=False)
    )
    thread = threading.Thread(target=uv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    yield f"http://{host}:{port}"
    uv.should_exit = True
    thread.join(timeout=10)
    sock.close()


def post(base: str, key: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        f"{base}/sagas/order",
        data=json.dumps(body).encode(),
        headers={
            "Content-Type": "application/json",
            "Idempotency-Key": key,
            "Authorization": f"Bearer {ANA_TOKEN}",
        },
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        with error:
            return error.code, json.loads(error.read())


def race(base: str, key: str, bodies: list[dict[str, Any]]) -> list[tuple[int, dict[str, Any]]]:
    """POST every body with ``key`` at once: each thread waits at a barrier, then sends."""
    gate = threading.Barrier(len(bodies))

    def one(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        gate.wait(timeout=30)
        return post(base, key, body)

    with ThreadPoolExecutor(max_workers=len(bodies)) as pool:
        return list(pool.map(one, bodies))


def sagas(app: Any) -> int:
    return int(scalar(app.engine, "SELECT count(*) FROM saga.saga_instance"))


def test_one_key_with_different_bodies_at_once_starts_one_saga(server, racing_app, settings):
    for round_ in range(3):
        key = f"idem-race-{round_}"
        bodies = [{"business_key": f"r{round_}-{i}", "payload": ORDER} for i in range(RACERS)]
        answers = race(server, key, bodies)
        statuses = sorted(status for status, _ in answers)
        assert statuses == [202] + [409] * (RACERS - 1), answers
        (winner,) = [body for status, body in answers if status == 202]
        assert winner["created"] is True
        for status, body in answers:
            if status == 409:
                assert body["type"].endswith("/idempotency-key-reused"), body
        assert sagas(racing_app) == round_ + 1
        assert (
            scalar(
                racing_app.engine,
                "SELECT saga_id::text FROM saga.api_idempotency WHERE key = :k",
                k=key,
            )
            == winner["saga_id"]
        )
    # Only the sagas that exist sent their first command: a start that lost the key was
    # rolled back and published nothing.
    commands = drain(settings.broker_url, "orders.commands")
    assert sorted(c["headers"]["saga_id"] for c in commands) == sorted(
        scalar(racing_app.engine, "SELECT array_agg(saga_id::text) FROM saga.saga_instance")
    )


def test_one_key_with_two_payloads_for_one_business_key_at_once(server, racing_app, settings):
    # The same business key with two payloads: the requests also race on the saga's own
    # unique key, and the loser is still answered as a reused Idempotency-Key.
    first = {"business_key": "same-order", "payload": ORDER}
    other = {"business_key": "same-order", "payload": {**ORDER, "amount_cents": 1}}
    bodies = [first] * (RACERS // 2) + [other] * (RACERS // 2)
    random.Random(7).shuffle(bodies)
    answers = race(server, "idem-two-payloads", bodies)
    won = [(b, body) for b, (status, body) in zip(bodies, answers, strict=True) if status == 202]
    assert won, answers
    winning_body = won[0][0]
    saga_ids = {body["saga_id"] for _, body in won}
    assert len(saga_ids) == 1
    assert [body["created"] for _, body in won].count(True) == 1
    for sent, (status, body) in zip(bodies, answers, strict=True):
        if sent == winning_body:
            assert status == 202, body
        else:
            assert status == 409 and body["type"].endswith("/idempotency-key-reused"), body
    assert sagas(racing_app) == 1
    (command,) = drain(settings.broker_url, "orders.commands")
    assert command["headers"]["saga_id"] in saga_ids


def test_one_key_with_one_body_at_once_answers_every_request_with_the_saga(
    server, racing_app, settings
):
    body = {"business_key": "same-body", "payload": ORDER}
    answers = race(server, "idem-same-body", [body] * RACERS)
    assert {status for status, _ in answers} == {202}, answers
    assert len({answer["saga_id"] for _, answer in answers}) == 1
    assert [answer["created"] for _, answer in answers].count(True) == 1
    assert sagas(racing_app) == 1
    assert len(drain(settings.broker_url, "orders.commands")) == 1
    # A later repeat is answered from the stored key, the same saga, not created.
    status, again = post(server, "idem-same-body", body)
    assert (status, again["saga_id"], again["created"]) == (202, answers[0][1]["saga_id"], False)
