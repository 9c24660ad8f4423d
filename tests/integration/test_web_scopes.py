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

from saga_tasks.core.messages import H_KIND, H_SAGA_ID, H_STEP
from saga_tasks.core.states import SagaStatus
from saga_tasks.runtime.holding import DEAD_LETTER
from saga_tasks.web import create_web_app
from tests.helpers import (
    ANA_TOKEN,
    ORDER,
    WebClients,
    drain,
    events,
    pump,
    reject_one,
    run_command,
    run_reply,
    scalar,
)
from tests.integration.test_signal_web import RETURN
from tests.versioned_app import build as build_versions

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
    build = WebClients(order_app, settings, TOKENS)
    yield build
    build.close()


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
        # ops acts (the answer says what it did, and nothing it may not read) and the
        # history names it.
        done = client.post(f"/sagas/{handle.saga_id}/compensate", json=body, headers=bearer(OPS))
        assert done.status_code == 200, done.text
        assert done.json() == {"saga_id": handle.saga_id, "outcome": "accepted",
                               "version": version + 1}  # fmt: skip
        discarded = client.post(
            f"/held/{held_id}/discard", json={"reason": "a test message"}, headers=bearer(OPS)
        )
        assert discarded.status_code == 200, discarded.text
        assert discarded.json()["outcome"] == "discarded"
    assert ("operator_compensate", "ops") in events(order_app, handle.saga_id)
    assert scalar(order_app.engine, "SELECT resolved_by FROM saga.held_message") == "ops"


def in_review(app, url, key):
    """An order saga in MANUAL_REVIEW: its first step answered twice, contradicting."""
    saga_id = app.start_saga("order", key, ORDER).saga_id
    (command,) = [c for c in drain(url, "orders.commands") if c["headers"]["saga_id"] == saga_id]
    run_command(app, command)
    (reply,) = drain(url, "saga.replies")
    run_reply(app, reply)
    failure = {"outcome": "failure", "error": {"code": "x", "message": "no"}}
    run_reply(app, {**reply, "headers": {**reply["headers"], "id": f"{key}-c"}, "kwargs": failure})
    assert app.orchestrator.get(saga_id).status is SagaStatus.MANUAL_REVIEW
    return saga_id


def test_an_operate_only_token_is_answered_what_it_did_not_the_saga(scoped, order_app, settings):
    """Every action route answers a token with ``operate`` alone ``{saga_id, outcome,
    version}`` (and a held message's id): no history, steps or reasons, which its ``GET``
    would refuse it. A token that may read is answered the saga."""
    url = settings.broker_url
    versioned = build_versions("1,2", replace(settings, api_tokens=TOKENS))
    try:
        returned = order_app.start_saga("return", "r-op", RETURN).saga_id
        pump(order_app, url)  # the return saga waits for a person
        sagas = {key: versioned.start_saga("order", key, ORDER).saga_id for key in "abcdef"}
        review = in_review(versioned, url, "g")
        held_ids = [hold(versioned, settings, sagas["e"], {"x": 1})]
        # A real dead letter, to replay: the broker dead-letters a command it was refused.
        sagas["h"] = versioned.start_saga("order", "h", ORDER).saga_id
        versioned.flush()
        assert reject_one(url, "orders.commands").headers["saga_id"] == sagas["h"]
        assert versioned.intake.take(DEAD_LETTER).taken == 1
        held_ids.append(scalar(versioned.engine, "SELECT max(id) FROM saga.held_message"))
        actions = [
            (versioned, f"/sagas/{sagas['a']}/retry-step", {"step": "create_order"}),
            (versioned, f"/sagas/{sagas['b']}/skip-step", {"step": "create_order"}),
            (versioned, f"/sagas/{sagas['c']}/compensate", {}),
            (versioned, f"/sagas/{review}/resolve", {"status": "FAILED"}),
            (versioned, f"/sagas/{sagas['d']}/migrate", {"to_version": 1}),
            (order_app, f"/sagas/{returned}/steps/inspect/signal",
             {"data": {"decision": "rejected"}}),
            (versioned, f"/held/{held_ids[0]}/discard", {}),
            (versioned, f"/held/{held_ids[1]}/replay", {"force": True, "force_reason": "test"}),
        ]  # fmt: skip
        with TestClient(create_web_app(versioned)) as on_versions, scoped() as on_orders:
            clients = {id(versioned): on_versions, id(order_app): on_orders}
            for app, path, extra in actions:
                saga_id = path.split("/")[2] if path.startswith("/sagas/") else None
                body = {"reason": "checked", **extra}
                if saga_id and not path.endswith(("/migrate", "/signal")):
                    body["expect_version"] = app.orchestrator.get(saga_id).version
                r = clients[id(app)].post(path, json=body, headers=bearer(OPS))
                assert r.status_code == 200, (path, r.text)
                answer = r.json()
                if saga_id is None:
                    held_id = int(path.split("/")[2])
                    saga_id = scalar(versioned.engine,
                                     "SELECT saga_id::text FROM saga.held_message WHERE id = :i",
                                     i=held_id)  # fmt: skip
                    assert answer.pop("held_id") == held_id
                    assert answer.pop("outcome") == ("replayed" if "replay" in path
                                                     else "discarded")  # fmt: skip
                else:
                    assert answer.pop("outcome") == "accepted", path
                assert answer == {"saga_id": saga_id,
                                  "version": app.orchestrator.get(saga_id).version}, path  # fmt: skip
                assert "checked" not in r.text and "history" not in r.text, path
            # read+operate is answered the saga, as GET would show it.
            saga_id = sagas["f"]
            body = {
                "reason": "checked",
                "expect_version": versioned.orchestrator.get(saga_id).version,
            }
            full = on_versions.post(f"/sagas/{saga_id}/compensate", json=body,
                                    headers=bearer(ANA_TOKEN))  # fmt: skip
            assert full.status_code == 200, full.text
            seen = on_versions.get(f"/sagas/{saga_id}", headers=bearer(ANA_TOKEN)).json()
            assert full.json() == {**seen, "outcome": "accepted"}
    finally:
        versioned.close()


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
