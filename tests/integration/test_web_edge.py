"""The HTTP edge: request bodies bounded before anything reads them (413, with or without
a token, for a body that says it is too large and for a chunked one that grows too large,
and the server's memory does not grow by the body's size); security headers; status URLs
from configuration; 503s that name nothing; an access log without tokens."""

from __future__ import annotations

import http.client
import socket
import threading
from dataclasses import replace

import psutil
import pytest

from saga_tasks import SagaApp
from saga_tasks.testing import wait_for
from saga_tasks.web import create_web_app

MIB = 1024 * 1024


@pytest.fixture
def server(order_app, settings):
    import uvicorn

    app = SagaApp(
        sagas=list(order_app.registry),
        participants=list(order_app.participants.values()),
        settings=replace(settings, api_max_body=MIB),
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    served = uvicorn.Server(
        uvicorn.Config(create_web_app(app), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=served.run, daemon=True)
    thread.start()
    wait_for(lambda: served.started, describe="the web server to start")
    yield port
    served.should_exit = True
    thread.join(timeout=10)
    app.close()


def _answer(conn: http.client.HTTPConnection) -> tuple[int, bytes]:
    response = conn.getresponse()
    return response.status, response.read()


def test_a_body_that_says_it_is_too_large_is_refused_unread(server):
    rss = psutil.Process().memory_info().rss
    conn = http.client.HTTPConnection("127.0.0.1", server, timeout=10)
    conn.putrequest("POST", "/sagas/order")
    conn.putheader("Content-Type", "application/json")
    conn.putheader("Content-Length", str(64 * MIB))
    conn.endheaders()
    conn.send(b"{" + b" " * 65536)  # a start: the server answers without reading the rest
    status, body = _answer(conn)
    conn.close()
    assert status == 413 and b"body-too-large" in body
    assert psutil.Process().memory_info().rss - rss < 16 * MIB


def test_a_chunked_body_that_grows_too_large_is_cut_off(server):
    rss = psutil.Process().memory_info().rss
    conn = http.client.HTTPConnection("127.0.0.1", server, timeout=10)
    conn.putrequest("POST", "/sagas/order")
    conn.putheader("Content-Type", "application/json")
    conn.putheader("Authorization", "Bearer nobody-has-this-token")
    conn.putheader("Transfer-Encoding", "chunked")
    conn.endheaders()
    chunk = b" " * 65536
    try:
        for _ in range(48):  # 3 MiB, well past the limit
            conn.send(b"%x\r\n%s\r\n" % (len(chunk), chunk))
    except (BrokenPipeError, ConnectionResetError):
        pass  # the server answered and closed: what we want
    status, body = _answer(conn)
    conn.close()
    assert status == 413 and b"body-too-large" in body
    assert psutil.Process().memory_info().rss - rss < 16 * MIB


def test_a_body_under_the_limit_reaches_the_route(server):
    conn = http.client.HTTPConnection("127.0.0.1", server, timeout=10)
    conn.request("POST", "/sagas/order", body=b"{}", headers={"Content-Type": "application/json"})
    status, _ = _answer(conn)
    conn.close()
    assert status in (401, 422), "the route ran: its own answer, not the limit's"


def test_dashboard_pages_send_a_strict_csp_and_refuse_framing(server, order_app):
    """With data (a token) and as the shell without data (none), the same headers; the
    shell names no saga."""
    from tests.helpers import ANA_TOKEN

    handle = order_app.start_saga("order", "csp-1", {"customer_id": "c-1",
                                  "items": [{"sku": "sku-1", "qty": 1}], "amount_cents": 100})  # fmt: skip
    paths = (
        "/",
        f"/ui/sagas/{handle.saga_id}",
        "/ui/held",
        "/ui/schedules",
        "/ui/sagas/no-such-saga",
    )
    for path, auth, expected in [
        *((p, {"Authorization": f"Bearer {ANA_TOKEN}"}, 404 if "no-such" in p else 200)
          for p in paths),
        *((p, {}, 401) for p in paths),
    ]:  # fmt: skip
        conn = http.client.HTTPConnection("127.0.0.1", server, timeout=10)
        conn.request("GET", path, headers=auth)
        response = conn.getresponse()
        body = response.read().decode()
        conn.close()
        assert response.status == expected, (path, response.status)
        csp = response.getheader("Content-Security-Policy") or ""
        assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp, path
        assert response.getheader("X-Content-Type-Options") == "nosniff"
        assert response.getheader("X-Frame-Options") == "DENY"
        assert response.getheader("Referrer-Policy") == "no-referrer"
        assert response.getheader("Cache-Control") == "no-store"
        assert "<script>" not in body, f"{path}: an inline script the CSP would block"
        if expected == 401:
            assert 'id="locked"' in body and "csp-1" not in body, path
            assert response.getheader("WWW-Authenticate") == 'Bearer realm="saga_tasks"'


def _client(order_app, settings, **changes):
    from fastapi.testclient import TestClient

    app = SagaApp(
        sagas=list(order_app.registry),
        participants=list(order_app.participants.values()),
        settings=replace(settings, **changes),
    )
    return TestClient(create_web_app(app), raise_server_exceptions=False)


START = {"business_key": "edge-1", "payload": {"customer_id": "c-1",
         "items": [{"sku": "sku-1", "qty": 1}], "amount_cents": 100}}  # fmt: skip


def test_status_url_comes_from_the_configured_base_not_the_host_header(order_app, settings):
    from tests.helpers import ANA_TOKEN

    auth = {
        "Authorization": f"Bearer {ANA_TOKEN}",
        "Host": "evil.example",
        "Idempotency-Key": "e-1",
    }
    with _client(order_app, settings) as client:
        answer = client.post("/sagas/order", json=START, headers=auth)
        assert answer.status_code in (200, 202), answer.text
        body = answer.json()
        assert body["status_url"] == f"/sagas/{body['saga_id']}"
    with _client(order_app, settings, api_base_url="https://sagas.example.com/") as client:
        again = client.post("/sagas/order", json=START, headers=auth).json()
        assert again["status_url"] == f"https://sagas.example.com/sagas/{body['saga_id']}"


def test_a_503_names_no_host_user_or_driver_words(order_app, settings):
    away = "postgresql+psycopg2://someone:hunter2@127.0.0.1:5999/secretdb"
    with _client(order_app, settings, database_url=away) as client:
        answer = client.get("/healthz")
    assert answer.status_code == 503
    text = answer.text
    for word in ("127.0.0.1", "5999", "someone", "hunter2", "secretdb", "refused"):
        assert word not in text, word


def test_each_request_leaves_an_access_log_line_without_its_token(order_app, settings, caplog):
    from tests.helpers import ANA_TOKEN

    with (
        caplog.at_level("INFO", logger="saga_tasks.web.access"),
        _client(order_app, settings) as client,
    ):
        client.get("/sagas?limit=1", headers={"Authorization": f"Bearer {ANA_TOKEN}"})
        client.get("/healthz")
    lines = [r.getMessage() for r in caplog.records if r.name == "saga_tasks.web.access"]
    assert any(line.startswith("GET /sagas 200 ana ") for line in lines), lines
    assert any(line.startswith("GET /healthz 200 - ") for line in lines), lines
    assert all(ANA_TOKEN not in line and "limit=" not in line for line in lines)
