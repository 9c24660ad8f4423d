"""The alert webhook reaches its own host and nothing else, against real HTTP servers on
this host: a redirect is a failed delivery (its target hears nothing), a URL or a name
that leads to a loopback or link-local address is refused unless allowed, and so is a
URL with credentials."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from sqlalchemy import text

from saga_tasks import Settings
from saga_tasks.errors import ConfigurationError, ServiceUnavailable, WebhookRefused
from saga_tasks.observability.alerts import Alert, AlertScan, LogAlerter, WebhookAlerter
from saga_tasks.observability.webhook import post
from tests.helpers import ORDER


@dataclass
class Server:
    """A local HTTP server: what it received, and how it answers."""

    url: str
    port: int
    received: list[tuple[str, str, bytes]] = field(default_factory=list)
    status: int = 204
    location: str = ""


def serve() -> tuple[ThreadingHTTPServer, Server]:
    """A server on a free port of 127.0.0.1 that records each request and answers as told."""

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            me.received.append((self.command, self.path, self.rfile.read(length)))
            self.send_response(me.status)
            if me.location:
                self.send_header("Location", me.location)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_POST = do_PUT = _answer

        def log_message(self, *args: object) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    port = server.server_address[1]
    me = Server(url=f"http://127.0.0.1:{port}/alerts", port=port)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, me


@pytest.fixture
def servers() -> Iterator[tuple[Server, Server]]:
    """The webhook, and an "internal" service a redirect might point at."""
    made = [serve(), serve()]
    yield made[0][1], made[1][1]
    for server, _state in made:
        server.shutdown()
        server.server_close()


ALERT = {"kind": "saga_alert", "saga_id": "s-1"}


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_a_webhook_that_redirects_is_a_failed_delivery_its_target_hears_nothing(servers, status):
    hook, internal = servers
    hook.status, hook.location = status, f"http://127.0.0.1:{internal.port}/api/secrets"

    with pytest.raises(
        ServiceUnavailable, match=rf"answered {status}, a redirect to .*not followed"
    ):
        post(hook.url, json.dumps(ALERT).encode(), timeout=5, allow_local=True)

    assert [r[0] for r in hook.received] == ["POST"]
    assert internal.received == [], "a redirect is never followed"


def test_a_redirect_is_logged_and_the_alert_tried_again_at_the_next_scan(
    order_app, servers, caplog
):
    hook, internal = servers
    hook.status, hook.location = 302, f"http://127.0.0.1:{internal.port}/"
    stuck = order_app.start_saga("order", "hook-1", ORDER)
    with order_app.engine.begin() as conn:
        conn.execute(
            text("UPDATE saga.saga_instance SET updated_at = now() - interval '5 minutes' "
                 "WHERE saga_id = :s"), {"s": stuck.saga_id},
        )  # fmt: skip
    scan = AlertScan(
        engine=lambda: order_app.engine,
        clock=order_app.clock,
        stuck_after=60,
        alerters=[LogAlerter(), WebhookAlerter(hook.url, allow_local=True)],
    )

    assert scan.scan() == 1, "the log line; the webhook's delivery failed"
    failed = [r.getMessage() for r in caplog.records if "alerter webhook failed" in r.getMessage()]
    assert len(failed) == 1 and "answered 302, a redirect to http://127.0.0.1" in failed[0]
    hook.status, hook.location = 204, ""
    assert scan.scan() == 1, "tried again, delivered"
    assert internal.received == []
    delivered = json.loads(hook.received[-1][2])
    assert delivered["saga_id"] == stuck.saga_id and delivered["condition"] == "stuck"


@pytest.mark.parametrize(
    ("url", "refusal"),
    [
        ("http://169.254.169.254/latest/meta-data/", "169.254.169.254, a link-local address"),
        ("http://127.0.0.1:15672/api/", "127.0.0.1, a loopback address"),
        ("http://[::1]:5432/", "::1, a loopback address"),
        ("http://[fe80::1%25eth0]/hook", "(fe80::1), a link-local address"),
        ("http://[::ffff:169.254.169.254]/", "a link-local address"),
        ("http://localhost:8080/hook", "localhost (127.0.0.1), a loopback address"),
        ("http://2130706433/hook", "2130706433 (127.0.0.1), a loopback address"),
    ],
)
def test_a_webhook_on_a_loopback_or_link_local_address_is_refused_as_settings_load(url, refusal):
    with pytest.raises(ConfigurationError, match="SAGA_ALERT_WEBHOOK_ALLOW_LOCAL=1") as raised:
        Settings.from_env({"SAGA_ALERT_WEBHOOK": url})
    assert str(raised.value).startswith("SAGA_ALERT_WEBHOOK points at ")
    assert refusal in str(raised.value)
    assert "/hook" not in str(raised.value) and "meta-data" not in str(raised.value)
    allowed = Settings.from_env({"SAGA_ALERT_WEBHOOK": url, "SAGA_ALERT_WEBHOOK_ALLOW_LOCAL": "1"})
    assert allowed.alert_webhook == url


@pytest.mark.parametrize(
    ("url", "refusal"),
    [
        ("https://hooks:s3cr3t@hooks.example.com/x", "must not carry credentials"),
        ("https://hooks.example.com@169.254.169.254/", "must not carry credentials"),
        ("http://0.0.0.0:15672/", "0.0.0.0, the unspecified address"),
        ("http://[fd00:ec2::254]/", "a cloud metadata endpoint"),
    ],
)
def test_credentials_and_addresses_no_setting_allows_are_refused(url, refusal):
    for allow in ("0", "1"):
        with pytest.raises(ConfigurationError, match=refusal) as raised:
            Settings.from_env({"SAGA_ALERT_WEBHOOK": url, "SAGA_ALERT_WEBHOOK_ALLOW_LOCAL": allow})
        assert "s3cr3t" not in str(raised.value)


def test_each_post_checks_what_the_host_resolves_to_now(servers):
    """A name that resolves to this host when the alert goes out (DNS rebinding, a name
    changed after start) is refused then, not only as the settings load."""
    hook, _internal = servers
    alerter = WebhookAlerter(f"http://localhost:{hook.port}/alerts")

    with pytest.raises(WebhookRefused, match=r"localhost \(127\.0\.0\.1\), a loopback"):
        alerter.send(Alert("stuck", "s-1", "order", "RUNNING", None, 400.0))

    assert hook.received == []


def test_a_local_webhook_is_reached_where_allowed(servers):
    hook, _internal = servers
    assert post(hook.url, json.dumps(ALERT).encode(), timeout=5, allow_local=True) == 204
    ((method, path, body),) = hook.received
    assert (method, path, json.loads(body)) == ("POST", "/alerts", ALERT)
