"""Tokens with scopes over real PostgreSQL and RabbitMQ: reads refused without a token
(unless public read is on), held bodies hidden from ``read`` and masked for ``operate``,
actions and starts refused without their scope and changing nothing."""

from __future__ import annotations

import base64
import hashlib
import json
import re
from dataclasses import replace

import pytest
from fastapi.testclient import TestClient
from kombu import Connection

from saga_tasks import SagaApp
from saga_tasks.core.messages import H_KIND, H_SAGA_ID, H_STEP
from saga_tasks.runtime.holding import DEAD_LETTER
from saga_tasks.web import create_web_app
from tests.helpers import ANA_TOKEN, ORDER, drain, events, reject_one, scalar

VIEWER = "token-of-viewer-0123456789"
STARTER = "token-of-starter-012345678"
OPS = "token-of-ops-0123456789abc"
TOKENS = f"ana:{ANA_TOKEN},viewer:{VIEWER}:read,starter:{STARTER}:start,ops:{OPS}:operate"

SECRETS = ("x@example.com", "4111111111111111", "hunter2", "tok-abcdef", "DE89370400440532")


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def scoped(order_app, settings):
    """A web app with one token per scope, and another with public reads on."""
    apps = []

    def build(**changes):
        app = SagaApp(
            sagas=list(order_app.registry),
            participants=list(order_app.participants.values()),
            settings=replace(settings, api_tokens=TOKENS, **changes),
        )
        apps.append(app)
        return TestClient(create_web_app(app))

    yield build
    for app in apps:
        app.close()


def start(client, key, headers):
    return client.post(
        "/sagas/order",
        json={"business_key": key, "payload": ORDER},
        headers={"Idempotency-Key": key, **headers},
    )


def hold(order_app, settings, saga_id, body, **publish):
    """A message dead-lettered with ``body`` and taken into the database; its id."""
    with Connection(settings.broker_url) as conn:
        conn.Producer().publish(
            body,
            exchange="saga.dlx",
            routing_key="inventory.commands",
            headers={
                H_SAGA_ID: saga_id,
                H_STEP: "reserve_stock",
                H_KIND: "command",
                "task": "inventory.reserve",
                "kwargsrepr": "{'password': 'hunter2'}",
                "x-api-token": "tok-abcdef",
            },
            declare=[],
            **publish,
        )
    assert order_app.intake.take(DEAD_LETTER).taken == 1
    return scalar(order_app.engine, "SELECT max(id) FROM saga.held_message")


SENSITIVE = {
    "customer_email": "x@example.com",
    "payment": {"cardNumber": "4111111111111111", "iban": "DE89370400440532", "kept": 7},
    "items": [{"sku": "sku-1", "password": "hunter2"}],
    "note": "kept",
}


def test_reads_need_a_token_with_the_read_scope(scoped, order_app):
    saga_id = order_app.start_saga("order", "r-1", ORDER).saga_id
    with scoped() as client:
        reads = [
            "/sagas",
            "/sagas?stuck=true",
            f"/sagas/{saga_id}",
            "/held",
            "/held/1",  # refused before it is looked up: no 404 tells what exists
        ]
        for path in reads:
            for headers in ({}, bearer("not-a-token-0000000000"), {"Authorization": "Basic a"}):
                r = client.get(path, headers=headers)
                assert r.status_code == 401, (path, r.text)
                assert r.headers["content-type"] == "application/problem+json"
                assert r.headers["www-authenticate"].startswith("Bearer")
            for token in (STARTER, OPS):  # neither start nor operate implies read
                r = client.get(path, headers=bearer(token))
                assert r.status_code == 403, (path, r.text)
                assert r.json()["missing_scope"] == "read" and "read" in r.json()["detail"]
                assert 'error="insufficient_scope"' in r.headers["www-authenticate"]
            if path != "/held/1":
                assert client.get(path, headers=bearer(VIEWER)).status_code == 200, path
        # Probes and the spec stay open: Prometheus and load balancers send no token.
        for path in ("/healthz", "/metrics", "/openapi.json", "/docs"):
            assert client.get(path).status_code == 200, path
        # The dashboard's pages: a shell without data, or the data for a reader.
        assert client.get("/", headers=bearer(STARTER)).status_code == 403
        page = client.get("/", headers=bearer(VIEWER))
        assert page.status_code == 200 and "r-1" in page.text


def test_a_read_token_sees_no_payload_and_no_held_body(scoped, order_app, settings):
    url = settings.broker_url
    handle = order_app.start_saga("order", "r-2", {**ORDER, "customer_id": "c-distinct-9"})
    assert order_app.flush(), "the start's command is on its queue"  # sent after commit
    command = reject_one(url, "orders.commands")  # the create_order command, with the payload
    assert "c-distinct-9" in command.body
    assert order_app.intake.take(DEAD_LETTER).taken == 1
    real = scalar(order_app.engine, "SELECT max(id) FROM saga.held_message")
    crafted = hold(order_app, settings, handle.saga_id, SENSITIVE)
    with scoped() as client:
        saga = client.get(f"/sagas/{handle.saga_id}", headers=bearer(VIEWER))
        assert saga.status_code == 200
        assert "c-distinct-9" not in saga.text and "payload" not in saga.json()
        assert {m["id"] for m in saga.json()["held_messages"]} == {real, crafted}
        listed = client.get("/held", headers=bearer(VIEWER)).json()["messages"]
        assert {m["id"] for m in listed} == {real, crafted}
        assert "c-distinct-9" not in json.dumps(listed)
        for held_id in (real, crafted):
            seen = client.get(f"/held/{held_id}", headers=bearer(VIEWER))
            assert seen.status_code == 200, seen.text
            view = seen.json()
            assert view["body"] is None and view["body_redacted"] is True
            assert view["headers"] and set(view["headers"].values()) == {"***"}
            assert (view["id"], view["holding"], view["saga_id"]) == (
                held_id,
                "dead_letter",
                handle.saga_id,
            )
            assert view["received_at"] and view["reason"] and view["replay_checks"]
            for secret in (*SECRETS, "c-distinct-9"):
                assert secret not in seen.text, (held_id, secret)
        # ana (read and operate): the bodies, with the listed fields masked at any depth.
        shown = client.get(f"/held/{crafted}", headers=bearer(ANA_TOKEN)).json()
        assert shown["body_redacted"] is False
        assert json.loads(shown["body"]) == {
            "customer_email": "***",
            "payment": {"cardNumber": "***", "iban": "***", "kept": 7},
            "items": [{"sku": "sku-1", "password": "***"}],
            "note": "kept",
        }
        assert shown["headers"]["x-api-token"] == shown["headers"]["kwargsrepr"] == "***"
        assert shown["headers"][H_SAGA_ID] == handle.saga_id  # not a listed field: as it was
        assert all(secret not in json.dumps(shown) for secret in SECRETS)
        real_view = client.get(f"/held/{real}", headers=bearer(ANA_TOKEN)).json()
        assert "c-distinct-9" in real_view["body"]  # customer_id is not a listed field


def test_a_body_that_cannot_be_masked_is_not_shown_even_to_operate(scoped, order_app, settings):
    saga_id = order_app.start_saga("order", "r-3", ORDER).saga_id
    drain(settings.broker_url, "orders.commands")
    binary = hold(
        order_app,
        settings,
        saga_id,
        b"\xff\xfepassword=hunter2",
        content_type="application/octet-stream",
        content_encoding="binary",
    )
    with scoped() as client:
        view = client.get(f"/held/{binary}", headers=bearer(ANA_TOKEN)).json()
    assert view["body"] is None and view["body_redacted"] is True
    assert "hunter2" not in json.dumps(view)


def test_actions_need_operate_and_starts_need_start(scoped, order_app, settings):
    handle = order_app.start_saga("order", "r-4", ORDER)
    drain(settings.broker_url, "orders.commands")
    held_id = hold(order_app, settings, handle.saga_id, {"x": 1})
    version = order_app.orchestrator.get(handle.saga_id).version
    body = {"reason": "customer cancelled", "expect_version": version}
    history = events(order_app, handle.saga_id)
    with scoped() as client:
        for token in (VIEWER, STARTER):
            refused = client.post(
                f"/sagas/{handle.saga_id}/compensate", json=body, headers=bearer(token)
            )
            assert refused.status_code == 403 and refused.json()["missing_scope"] == "operate"
            discard = client.post(
                f"/held/{held_id}/discard", json={"reason": "no"}, headers=bearer(token)
            )
            assert discard.status_code == 403 and discard.json()["missing_scope"] == "operate"
        for token in (VIEWER, OPS):
            r = start(client, f"s-{token[:8]}", bearer(token))
            assert r.status_code == 403 and r.json()["missing_scope"] == "start"
        assert start(client, "s-anon", {}).status_code == 401
        assert scalar(order_app.engine, "SELECT count(*) FROM saga.saga_instance") == 1
        assert events(order_app, handle.saga_id) == history
        assert order_app.orchestrator.get(handle.saga_id).version == version
        assert scalar(order_app.engine, "SELECT status FROM saga.held_message") == "pending"
        # The starter starts, and may not read what it started: status_url needs read.
        started = start(client, "s-ok", bearer(STARTER))
        assert started.status_code == 202, started.text
        status_url = started.json()["status_url"]
        assert client.get(status_url, headers=bearer(STARTER)).status_code == 403
        assert client.get(status_url, headers=bearer(VIEWER)).status_code == 200
        # ops acts (the answer shows what it changed) and the history names it.
        done = client.post(f"/sagas/{handle.saga_id}/compensate", json=body, headers=bearer(OPS))
        assert done.status_code == 200, done.text
        assert done.json()["status"] == "COMPENSATING"
        discarded = client.post(
            f"/held/{held_id}/discard", json={"reason": "a test message"}, headers=bearer(OPS)
        )
        assert discarded.status_code == 200 and discarded.json()["resolved_by"] == "ops"
    assert ("operator_compensate", "ops") in events(order_app, handle.saga_id)


def test_public_read_lets_reads_through_without_a_token_still_redacted(scoped, order_app, settings):
    handle = order_app.start_saga("order", "r-5", ORDER)
    drain(settings.broker_url, "orders.commands")
    held_id = hold(order_app, settings, handle.saga_id, SENSITIVE)
    version = order_app.orchestrator.get(handle.saga_id).version
    with scoped(api_public_read=True) as client:
        assert client.get("/sagas").json()["count"] == 1
        assert client.get(f"/sagas/{handle.saga_id}").status_code == 200
        page = client.get("/")
        assert page.status_code == 200 and "r-5" in page.text
        view = client.get(f"/held/{held_id}").json()
        assert view["body"] is None and view["body_redacted"] is True
        assert all(secret not in json.dumps(view) for secret in SECRETS)
        # A token that is sent is still checked; one with operate sees the masked body.
        assert client.get("/sagas", headers=bearer("not-a-token-0000000000")).status_code == 401
        assert client.get("/sagas", headers=bearer(STARTER)).status_code == 200
        masked = client.get(f"/held/{held_id}", headers=bearer(OPS)).json()
        assert json.loads(masked["body"])["customer_email"] == "***"
        # Public read opens reads only.
        action = {"reason": "r", "expect_version": version}
        assert client.post(f"/sagas/{handle.saga_id}/compensate", json=action).status_code == 401
        assert start(client, "pr-1", {}).status_code == 401
        assert client.post(f"/held/{held_id}/discard", json={"reason": "r"}).status_code == 401


def test_docs_are_served_from_the_package_under_a_strict_csp(scoped):
    with scoped() as client:
        docs = client.get("/docs")
        assert docs.status_code == 200
        sources = re.findall(r'(?:src|href)="([^"]+)"', docs.text)
        assert sources and all(s.startswith("/docs/assets/") for s in sources), sources
        csp = docs.headers["content-security-policy"]
        inline = re.findall(r"<script>(.*?)</script>", docs.text, re.S)
        assert len(inline) == 1
        digest = base64.b64encode(hashlib.sha256(inline[0].encode()).digest()).decode()
        assert f"script-src 'self' 'sha256-{digest}';" in csp
        assert "http" not in csp and "unsafe" not in csp
        for name, kind in (("swagger-ui-bundle.js", "javascript"), ("swagger-ui.css", "css")):
            asset = client.get(f"/docs/assets/{name}")
            assert asset.status_code == 200 and kind in asset.headers["content-type"]
        for path in ("/docs/assets/index.html", "/docs/assets/swagger-initializer.js", "/redoc"):
            assert client.get(path).status_code == 404, path
        spec = client.get("/openapi.json").json()
        assert spec["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
