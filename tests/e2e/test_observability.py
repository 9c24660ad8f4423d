"""Seeing the sagas: worker metrics, one trace per saga across processes, alerts, the dashboard."""

from __future__ import annotations

import json
import socket
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import text

from saga_tasks.core.states import SagaStatus
from saga_tasks.testing import wait_for, wait_for_status
from saga_tasks.web import create_web_app
from tests.helpers import ANA_TOKEN, ORDER, drain, pump, rows, run_command, run_reply, scalar


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    raw = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(raw)
        for s in f.samples
    }


def test_worker_metrics_match_the_database(order_app, workers):
    port = free_port()
    workers.start(
        "orchestrator", ["saga.replies", "saga.maintenance"], env={"SAGA_METRICS_PORT": str(port)}
    )
    workers.participants()
    handles = [order_app.start_saga("order", f"mx-{i}", ORDER) for i in range(4)]
    handles.append(order_app.start_saga("order", "mx-declined", {**ORDER, "customer_id": "c-low"}))
    for h in handles:
        wait_for_status(order_app, h.saga_id, [SagaStatus.COMPLETED, SagaStatus.COMPENSATED])

    def scraped() -> dict[tuple[str, tuple], float] | None:
        try:
            return scrape(port)
        except OSError:  # not listening yet
            return None

    metrics = wait_for(scraped, describe="the worker's metrics endpoint")
    engine = order_app.engine
    accepted = metrics[
        ("saga_messages_total", (("classification", "accepted"), ("consumer", "orchestrator")))
    ]
    replies = scalar(
        engine,
        "SELECT count(DISTINCT causation_id) FROM saga.saga_history WHERE causation_id IS NOT NULL",
    )
    assert accepted == replies
    completed = metrics[("saga_finished_total", (("saga_type", "order"), ("status", "COMPLETED")))]
    compensated = metrics[
        ("saga_finished_total", (("saga_type", "order"), ("status", "COMPENSATED")))
    ]
    assert (completed, compensated) == (4, 1)
    succeeded = sum(v for (name, labels), v in metrics.items()
                    if name == "saga_step_latency_seconds_count" and ("outcome", "success") in labels)  # fmt: skip
    assert succeeded == scalar(
        engine, "SELECT count(*) FROM saga.saga_history WHERE event = 'step_succeeded'"
    )
    compensations = sum(v for (name, _), v in metrics.items() if name == "saga_compensations_total")
    assert compensations == scalar(
        engine, "SELECT count(*) FROM saga.saga_history WHERE event = 'compensation_requested'"
    )


def test_one_trace_per_saga_across_processes(settings, workers, tmp_path):
    from dataclasses import replace

    from saga_tasks.observability import tracing
    from tests.helpers import build_order_app

    spans_file = tmp_path / "spans.jsonl"
    export = f"file:{spans_file}"
    app = build_order_app(replace(settings, trace_export=export))
    try:
        workers.start(
            "orchestrator", ["saga.replies", "saga.maintenance"], env={"SAGA_TRACE_EXPORT": export}
        )
        workers.start("participants", ["orders.commands", "inventory.commands", "payments.commands"],
                      env={"SAGA_TRACE_EXPORT": export})  # fmt: skip
        caller = "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"
        handle = app.start_saga("order", "trace-1", ORDER, traceparent=caller)
        wait_for_status(app, handle.saga_id, [SagaStatus.COMPLETED])

        def spans() -> list[dict]:
            if not spans_file.exists():
                return []
            return [
                json.loads(line) for line in spans_file.read_text().splitlines() if line.strip()
            ]

        found = wait_for(lambda: s if len(s := [x for x in spans() if x["trace_id"] == "ab" * 16]) >= 9 else None,
                         describe="nine spans of the saga's trace")  # fmt: skip
        names = sorted(x["name"] for x in found)
        assert names.count("saga.start order") == 1
        assert sum(n.startswith("saga.command ") for n in names) == 4
        assert sum(n.startswith("saga.reply ") for n in names) == 4
        assert len({x["pid"] for x in found}) == 3, (
            "spans from the test, the orchestrator and a participant"
        )
        start = next(x for x in found if x["name"] == "saga.start order")
        assert start["parent_id"] == "cd" * 8, "the start span is a child of the caller's span"
        stored = scalar(app.engine, "SELECT traceparent FROM saga.saga_instance")
        assert tracing.trace_id(stored) == "ab" * 16
    finally:
        app.close()


class Hook(BaseHTTPRequestHandler):
    received: list[dict] = []
    fail = False

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if Hook.fail:
            self.send_response(503)
            self.end_headers()
            return
        Hook.received.append(body)
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        return


@pytest.fixture
def webhook():
    Hook.received, Hook.fail = [], False
    server = HTTPServer(("127.0.0.1", 0), Hook)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/alerts", Hook
    server.shutdown()
    server.server_close()


def test_alerts_go_out_once_per_saga_and_channel(order_app, settings, webhook):
    from dataclasses import replace

    from saga_tasks import SagaApp

    url, hook = webhook
    app = SagaApp(
        sagas=list(order_app.registry),
        settings=replace(
            settings, alert_webhook=url, alert_webhook_allow_local=True, stuck_after=60
        ),
    )
    stuck = order_app.start_saga("order", "al-1", ORDER)
    review = order_app.start_saga("order", "al-2", ORDER)
    for command in drain(settings.broker_url, "orders.commands"):
        run_command(order_app, command)
    replies = drain(settings.broker_url, "saga.replies")
    for reply in replies:
        run_reply(order_app, reply)
    conflicting = next(r for r in replies if r["headers"]["saga_id"] == review.saga_id)
    run_reply(order_app, {**conflicting, "headers": {**conflicting["headers"], "id": "c-1"},
                          "kwargs": {"outcome": "failure", "error": {"code": "x", "message": ""}}})  # fmt: skip
    with order_app.engine.begin() as conn:
        conn.execute(text("UPDATE saga.saga_instance SET updated_at = now() - interval '5 minutes' WHERE saga_id = :s"),
                     {"s": stuck.saga_id})  # fmt: skip
    hook.fail = True
    assert app.alerts.scan() == 2  # the log channel; the webhook failed and will be tried again
    hook.fail = False
    assert app.alerts.scan() == 2  # now the webhook
    assert app.alerts.scan() == 0  # and never again
    by_saga = {a["saga_id"]: a for a in hook.received}
    assert (
        by_saga[stuck.saga_id]["condition"] == "stuck"
        and by_saga[stuck.saga_id]["idle_seconds"] >= 300
    )
    assert by_saga[review.saga_id]["condition"] == "manual_review"
    assert "conflicting replies" in by_saga[review.saga_id]["reason"]
    assert all("payload" not in a and '"c-1"' not in json.dumps(a) for a in hook.received)
    # The stuck saga moves: that episode is over. Stuck again later, it is an alert again.
    idle = "UPDATE saga.saga_instance SET updated_at = now() - make_interval(secs => :i) WHERE saga_id = :s"
    with order_app.engine.begin() as conn:
        conn.execute(text(idle), {"s": stuck.saga_id, "i": 0})
    assert app.alerts.scan() == 0
    assert scalar(order_app.engine, "SELECT count(*) FROM saga.alert_sent WHERE saga_id = :s",
                  s=stuck.saga_id) == 0  # fmt: skip
    with order_app.engine.begin() as conn:
        conn.execute(text(idle), {"s": stuck.saga_id, "i": 600})
    assert app.alerts.scan() == 2
    assert [a["condition"] for a in hook.received if a["saga_id"] == stuck.saga_id] == [
        "stuck",
        "stuck",
    ]
    app.close()


@pytest.fixture
def served(order_app):
    import uvicorn

    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(create_web_app(order_app), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started, describe="the web server to start")
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)


def chromium(playwright):
    return playwright.chromium.launch(
        executable_path="/usr/bin/chromium",
        args=[
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
        ],
    )


OVERFLOWING_TEXT = """() => [...document.querySelectorAll("svg.graph g.node")].flatMap((g) => {
  const box = g.querySelector("rect").getBBox();
  return [...g.querySelectorAll("text")]
    .filter((t) => { const b = t.getBBox(); return b.x < box.x || b.x + b.width > box.x + box.width; })
    .map((t) => t.textContent + " (" + t.getBBox().width + " > " + box.width + ")");
})"""
"""The texts of the graph's nodes that run past their box, as the browser draws them."""


def test_dashboard_in_a_real_browser(order_app, settings, served, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    declined = order_app.start_saga("order", "ui-declined", {**ORDER, "customer_id": "c-low"})
    pump(order_app, settings.broker_url)
    assert order_app.orchestrator.get(declined.saga_id).status is SagaStatus.COMPENSATED
    done = order_app.start_saga("order", "ui-ok", ORDER)
    review = order_app.start_saga("order", "ui-review", ORDER)
    for command in drain(settings.broker_url, "orders.commands"):
        run_command(order_app, command)
    replies = drain(settings.broker_url, "saga.replies")
    for reply in replies:
        run_reply(order_app, reply)
    conflicting = next(r for r in replies if r["headers"]["saga_id"] == review.saga_id)
    run_reply(order_app, {**conflicting, "headers": {**conflicting["headers"], "id": "ui-c"},
                          "kwargs": {"outcome": "failure", "error": {"code": "x", "message": ""}}})  # fmt: skip
    assert order_app.orchestrator.get(review.saga_id).status is SagaStatus.MANUAL_REVIEW
    done_version = order_app.orchestrator.get(done.saga_id).version
    # A dead letter of the running saga, taken in: the held page joins it with its saga.
    from kombu import Connection

    from saga_tasks.core.messages import H_KIND, H_SAGA_ID, H_STEP
    from saga_tasks.runtime.holding import DEAD_LETTER

    with Connection(settings.broker_url) as conn:
        conn.Producer().publish(
            {"x": 1},
            exchange="saga.dlx",
            routing_key="inventory.commands",
            headers={
                H_SAGA_ID: done.saga_id,
                H_STEP: "reserve_stock",
                H_KIND: "command",
                "task": "inventory.reserve",
            },
            declare=[],
        )
    assert order_app.intake.take(DEAD_LETTER).taken == 1
    with sync_playwright() as p:
        browser = chromium(p)
        page = browser.new_page(viewport={"width": 1280, "height": 1000})
        # Without a token the page is a shell with no data; the token brings the data in.
        page.goto(served + "/")
        expect(page.locator("#locked")).to_contain_text("needs a bearer token")
        expect(page.locator("#token")).to_be_focused()
        expect(page.locator("#recent")).to_have_count(0)
        page.screenshot(path=str(tmp_path / "locked.png"))
        page.fill("#token", ANA_TOKEN)
        page.dispatch_event("#token", "change")
        expect(page.locator('.tile[data-status="MANUAL_REVIEW"] .n')).to_have_text("1")
        expect(page.locator("#recent")).to_contain_text("ui-review")
        expect(page.locator("#recent")).to_contain_text("ui-ok")
        page.screenshot(path=str(tmp_path / "overview.png"), full_page=True)
        page.locator("#recent a", has_text=review.saga_id[:8]).click()
        expect(page.locator("#status")).to_have_text("MANUAL_REVIEW")  # the tab kept the token
        expect(page.locator("svg.timeline rect.span")).to_have_count(2)
        page.fill("#reason", "checked with the warehouse")
        page.select_option("#resolution", "FAILED")
        page.click('button[data-action="resolve"]')
        expect(page.locator("#status")).to_have_text("FAILED", timeout=10_000)
        expect(page.locator("#history")).to_contain_text("operator_resolve")
        expect(page.locator("#history")).to_contain_text("ana")
        page.screenshot(path=str(tmp_path / "saga.png"), full_page=True)
        # A compensated saga: each box of its graph holds its text (the longest state
        # and queue line included), and no action is offered, each one with why not.
        page.goto(served + f"/ui/sagas/{declined.saga_id}")
        expect(page.locator("#status")).to_have_text("COMPENSATED")
        expect(page.locator("svg.graph")).to_contain_text("COMPENSATED · inventory.commands")
        expect(page.locator("svg.graph")).to_contain_text("SKIPPED · orders.commands")
        past_border = page.evaluate(OVERFLOWING_TEXT)
        assert past_border == [], past_border
        expect(page.locator("button[data-action]")).to_have_count(0)
        expect(page.locator("#no-action")).to_be_visible()
        expect(page.locator("#withheld li")).to_have_count(4)
        expect(page.locator("#withheld")).to_contain_text(
            "Retry step: cannot retry a step: the saga is COMPENSATED"
        )
        page.screenshot(path=str(tmp_path / "compensated.png"), full_page=True)
        # A wrong token is refused and said so on the page.
        page.goto(served + f"/ui/sagas/{done.saga_id}")
        # The page arrives as a shell and its script fetches it again with the tab's
        # token: wait for that, or the wrong token below would be the one it fetches with.
        expect(page.locator("#reason")).to_be_visible()
        page.fill("#token", "not-the-token-000000")
        page.dispatch_event("#token", "change")
        page.fill("#reason", "should not work")
        page.click('button[data-action="compensate"]')
        expect(page.locator("#result")).to_contain_text("Unauthorized")
        # The held page: the wrong token reads nothing; with the right one, the dead letter
        # next to its saga, discarded.
        page.goto(served + "/ui/held")
        expect(page.locator("#locked-why")).to_have_text("unknown token")
        page.fill("#token", ANA_TOKEN)
        page.dispatch_event("#token", "change")
        row = page.locator("#held tbody tr", has_text="inventory.reserve")
        expect(row).to_contain_text(done.saga_id[:8])
        expect(row.locator(".pill")).to_have_text("RUNNING")
        page.fill("#reason", "a test message, not a real command")
        row.locator('button[data-verb="discard"]').click()
        expect(page.locator("#held")).to_contain_text("Nothing held.", timeout=10_000)
        page.screenshot(path=str(tmp_path / "held.png"), full_page=True)
        browser.close()
    held = rows(order_app.engine, "SELECT status, resolved_by FROM saga.held_message")
    assert held == [{"status": "discarded", "resolved_by": "ana"}]
    state = order_app.orchestrator.get(review.saga_id)
    assert state.status is SagaStatus.FAILED
    assert [
        h["actor"]
        for h in rows(
            order_app.engine, "SELECT actor FROM saga.saga_history WHERE event = 'operator_resolve'"
        )
    ] == ["ana"]
    # The wrong token changed nothing: not the status, not the version, not the history;
    # the discard is in the history, by the token's actor.
    after = order_app.orchestrator.get(done.saga_id)
    assert (after.status, after.version) == (SagaStatus.RUNNING, done_version)
    by_operators = rows(
        order_app.engine,
        "SELECT event, actor FROM saga.saga_history WHERE saga_id = :s AND actor <> 'system'",
        s=done.saga_id,
    )
    assert [(h["event"], h["actor"]) for h in by_operators] == [("operator_discard", "ana")]


def test_api_docs_render_from_this_origin_only(served, tmp_path):
    """Swagger UI draws every operation from the package's assets: no request leaves the
    origin and the page's CSP blocks nothing it needs."""
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as p:
        browser = chromium(p)
        page = browser.new_page(viewport={"width": 1280, "height": 1000})
        requested: list[str] = []
        complaints: list[str] = []
        page.on("request", lambda request: requested.append(request.url))
        page.on(
            "console",
            lambda message: complaints.append(message.text) if message.type == "error" else None,
        )
        page.goto(served + "/docs")
        expect(page.locator(".opblock-summary-path").first).to_be_visible(timeout=10_000)
        expect(page.locator(".opblock-summary-path", has_text="/held/{held_id}")).to_have_count(2)
        expect(page.locator("button.authorize")).to_be_visible()
        page.screenshot(path=str(tmp_path / "docs.png"), full_page=True)
        browser.close()
    assert requested and all(url.startswith(served + "/") for url in requested), requested
    assert complaints == [], complaints
