"""The HTTP API against real PostgreSQL and RabbitMQ: shapes, errors, auth, metrics, logs."""

from __future__ import annotations

import json
import logging
import uuid

import pytest
import schemathesis
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import text

from saga_tasks.observability.logs import JsonFormatter
from saga_tasks.web import create_web_app
from tests.helpers import ANA_TOKEN, ORDER, drain, lapse, pump, run_command, run_reply, scalar

AUTH = {"Authorization": f"Bearer {ANA_TOKEN}"}


@pytest.fixture
def client(order_app):
    """A client whose requests carry ana's token (every scope) unless a test says otherwise."""
    with TestClient(create_web_app(order_app), headers=AUTH) as c:
        yield c


@pytest.fixture
def anonymous(order_app):
    with TestClient(create_web_app(order_app)) as c:
        yield c


def start(client, key="w-1", idem=None, payload=None):
    return client.post(
        "/sagas/order",
        json={"business_key": key, "payload": payload or ORDER},
        headers={"Idempotency-Key": idem or f"idem-{key}"},
    )


def test_start_returns_202_with_a_status_url_and_is_idempotent(client, order_app):
    r = start(client)
    assert r.status_code == 202, r.text
    body = r.json()
    assert set(body) == {
        "saga_id",
        "saga_type",
        "business_key",
        "correlation_id",
        "status",
        "created",
        "status_url",
    }
    assert body["created"] is True and body["status"] == "RUNNING"
    assert body["correlation_id"] == body["saga_id"]
    assert body["status_url"].endswith(f"/sagas/{body['saga_id']}")
    again = start(client)
    assert again.status_code == 202 and again.json()["saga_id"] == body["saga_id"]
    assert again.json()["created"] is False
    reused = start(client, payload={**ORDER, "amount_cents": 1}, idem="idem-w-1")
    assert reused.status_code == 409
    assert reused.headers["content-type"] == "application/problem+json"
    assert reused.json()["type"].endswith("/idempotency-key-reused")
    assert scalar(order_app.engine, "SELECT count(*) FROM saga.saga_instance") == 1
    shown = client.get(body["status_url"].replace("http://testserver", ""))
    assert shown.status_code == 200 and shown.json()["saga_id"] == body["saga_id"]


def test_a_callers_traceparent_becomes_the_sagas_trace(client, order_app, settings):
    caller = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    r = client.post(
        "/sagas/order",
        json={"business_key": "tp-1", "payload": ORDER},
        headers={"Idempotency-Key": "tp-1", "traceparent": caller},
    )
    saga = order_app.orchestrator.get(r.json()["saga_id"])
    assert saga.traceparent.split("-")[1] == "4bf92f3577b34da6a3ce929d0e0e4736"
    (command,) = drain(settings.broker_url, "orders.commands")
    assert command["headers"]["traceparent"].split("-")[1] == "4bf92f3577b34da6a3ce929d0e0e4736"
    junk = client.post(
        "/sagas/order",
        json={"business_key": "tp-2", "payload": ORDER},
        headers={"Idempotency-Key": "tp-2", "traceparent": "not-a-trace"},
    )
    assert junk.status_code == 202  # a malformed header starts a new trace
    fresh = order_app.orchestrator.get(junk.json()["saga_id"]).traceparent
    assert fresh and fresh.split("-")[1] != "4bf92f3577b34da6a3ce929d0e0e4736"


@pytest.mark.parametrize(
    ("call", "status", "kind"),
    [
        (
            lambda c: c.post("/sagas/order", json={"business_key": "k", "payload": ORDER}),
            422,
            "invalid-request",
        ),
        (
            lambda c: c.post(
                "/sagas/refund",
                json={"business_key": "k", "payload": {}},
                headers={"Idempotency-Key": "x"},
            ),
            404,
            "unknown-saga-type",
        ),
        (
            lambda c: c.post(
                "/sagas/order",
                json={"business_key": "k", "payload": {"items": []}},
                headers={"Idempotency-Key": "y"},
            ),
            422,
            "invalid-payload",
        ),
        (lambda c: c.get("/sagas/not-a-uuid"), 404, "saga-not-found"),
        (lambda c: c.get(f"/sagas/{uuid.uuid4()}"), 404, "saga-not-found"),
        (lambda c: c.get("/sagas?status=DONE"), 422, "invalid-request"),
        (lambda c: c.get("/sagas?business_key=a%00b"), 400, "bad-request"),
        (lambda c: c.get("/held/999999"), 404, "held-message-not-found"),
    ],
)
def test_errors_are_problem_json(client, call, status, kind):
    r = call(client)
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/problem+json"
    body = r.json()
    assert body["type"].endswith("/" + kind) and body["status"] == status and body["detail"]


def test_operator_actions_need_a_token_and_are_audited_with_its_actor(
    client, anonymous, order_app, settings
):
    saga_id = start(client).json()["saga_id"]
    version = client.get(f"/sagas/{saga_id}").json()["version"]
    body = {"reason": "customer cancelled", "expect_version": version}
    for headers in (
        {},
        {"Authorization": "Bearer wrong-token-0000000000"},
        {"Authorization": "Basic abc"},
    ):
        r = anonymous.post(f"/sagas/{saga_id}/compensate", json=body, headers=headers)
        assert r.status_code == 401, r.text
        assert r.headers["www-authenticate"].startswith("Bearer")
    stale = client.post(
        f"/sagas/{saga_id}/compensate", json={**body, "expect_version": version + 5}, headers=AUTH
    )
    assert stale.status_code == 409 and stale.json()["current_version"] == version
    done = client.post(f"/sagas/{saga_id}/compensate", json=body, headers=AUTH)
    assert done.status_code == 200, done.text
    view = done.json()
    assert view["status"] == "COMPENSATING"
    audit = [h for h in view["history"] if h["event"] == "operator_compensate"]
    assert audit[0]["actor"] == "ana" and "customer cancelled" in audit[0]["reason"]
    refused = client.post(
        f"/sagas/{saga_id}/compensate",
        json={**body, "expect_version": view["version"]},
        headers=AUTH,
    )
    assert refused.status_code == 409 and refused.json()["type"].endswith("/action-refused")
    missing = client.post(
        f"/sagas/{saga_id}/retry-step",
        json={**body, "expect_version": view["version"]},
        headers=AUTH,
    )
    assert missing.status_code == 422


def test_list_filters(client, order_app, settings):
    ids = [start(client, key=f"l-{i}").json()["saga_id"] for i in range(3)]
    assert client.get("/sagas?type=order&limit=2").json()["count"] == 2
    assert client.get("/sagas?business_key=l-1").json()["sagas"][0]["saga_id"] == ids[1]
    assert client.get("/sagas?status=COMPLETED").json()["count"] == 0
    assert client.get("/sagas?stuck=true").json()["count"] == 0
    assert client.get("/sagas?type=refund").status_code == 404
    pump(order_app, settings.broker_url)  # all three complete
    completed = client.get("/sagas?status=COMPLETED").json()
    assert sorted(s["saga_id"] for s in completed["sagas"]) == sorted(ids)
    # Two stuck sagas (nothing moved them for an hour); the filters apply to stuck too.
    stuck_ids = [start(client, key=f"s-{i}").json()["saga_id"] for i in range(2)]
    with order_app.engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE saga.saga_instance SET updated_at = now() - interval '1 hour' "
                "WHERE saga_id = ANY(CAST(:ids AS uuid[]))"
            ),
            {"ids": stuck_ids},
        )
    stuck = client.get("/sagas?stuck=true").json()
    assert sorted(s["saga_id"] for s in stuck["sagas"]) == sorted(stuck_ids)
    assert stuck["count"] == 2 and all(s["idle_seconds"] >= 3600 for s in stuck["sagas"])
    assert set(completed["sagas"][0]) <= set(stuck["sagas"][0])  # the same shape, and more
    one = client.get("/sagas?stuck=true&business_key=s-1").json()["sagas"]
    assert [s["saga_id"] for s in one] == [stuck_ids[1]]
    assert client.get("/sagas?stuck=true&status=COMPLETED").json()["count"] == 0
    assert client.get("/sagas?stuck=true&status=RUNNING&limit=1").json()["count"] == 1


def test_metrics_match_the_database(client, order_app, settings):
    before = _scrape(client)
    for i in range(3):
        start(client, key=f"m-{i}")
    start(client, key="m-declined", payload={**ORDER, "customer_id": "c-low"})
    pump(order_app, settings.broker_url)
    families = {f.name: f for f in text_string_to_metric_families(client.get("/metrics").text)}
    sagas = {s.labels["status"]: s.value for s in families["saga_sagas"].samples}
    assert (
        sagas
        == {
            "COMPLETED": scalar(
                order_app.engine,
                "SELECT count(*) FROM saga.saga_instance WHERE status = 'COMPLETED'",
            ),
            "COMPENSATED": scalar(
                order_app.engine,
                "SELECT count(*) FROM saga.saga_instance WHERE status = 'COMPENSATED'",
            ),
        }
        == {"COMPLETED": 3, "COMPENSATED": 1}
    )
    assert {s.labels["status"]: s.value for s in families["saga_active"].samples} == {
        "RUNNING": 0,
        "COMPENSATING": 0,
    }
    depth = {s.labels["queue"]: s.value for s in families["saga_queue_depth"].samples}
    assert depth["saga.dead_letter"] == 0 and depth["orders.commands"] == 0
    assert all(s.value == 0 for s in families["saga_outbox_lag_seconds"].samples)
    # This process applied every reply (pump): its counters agree with the history.
    accepted = _delta(
        before, _scrape(client), "saga_messages_total", consumer="orchestrator",
        classification="accepted",
    )  # fmt: skip
    replies = scalar(
        order_app.engine,
        "SELECT count(DISTINCT causation_id) FROM saga.saga_history WHERE causation_id IS NOT NULL",
    )
    # 4 steps each; the declined one: create, reserve, authorize refused, release, cancel
    assert accepted == replies == 3 * 4 + 5
    assert families["saga_state_up"].samples[0].value == 1


def _scrape(client) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = {}
    for family in text_string_to_metric_families(client.get("/metrics").text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def _delta(before, after, name, **labels):
    key = (name, tuple(sorted(labels.items())))
    return after.get(key, 0.0) - before.get(key, 0.0)


def test_every_classification_timeout_and_backlog_shows_in_metrics(clocked_app, clock, settings):
    """Counters move by exactly what happened (this process handles every message);
    the backlog gauges read what the database and the broker hold."""
    from kombu import Connection

    from saga_tasks.core.messages import H_KIND, H_SAGA_ID, H_STEP
    from saga_tasks.runtime.holding import DEAD_LETTER

    app, url = clocked_app, settings.broker_url
    with TestClient(create_web_app(app)) as client:
        before = _scrape(client)
        # A reply applied, then delivered again: accepted once, duplicate once.
        dup = app.start_saga("order", "mx-dup", ORDER)
        run_command(app, drain(url, "orders.commands")[0])
        (reply,) = drain(url, "saga.replies")
        run_reply(app, reply)
        run_reply(app, reply)
        # The reserve succeeds, then a failure for the same command: conflicting.
        (reserve,) = drain(url, "inventory.commands")
        run_command(app, reserve)
        (ok,) = drain(url, "saga.replies")
        run_reply(app, ok)
        contradiction = {
            "headers": {**ok["headers"], "id": str(uuid.uuid4())},
            "kwargs": {
                **ok["kwargs"],
                "outcome": "failure",
                "result": None,
                "error": {"code": "declined", "message": "no"},
            },
        }
        run_reply(app, contradiction)
        # A reply for no saga: invalid.
        bogus = {**ok["headers"], "id": str(uuid.uuid4()), H_SAGA_ID: str(uuid.uuid4())}
        app.orchestrator.handle_reply(bogus["id"], bogus, ok["kwargs"])
        # A command never answered: two re-sends, given up; its answer then comes late.
        late = app.start_saga("order", "mx-late", ORDER)
        (lost,) = drain(url, "orders.commands")
        for _ in range(3):
            lapse(app, clock, late.saga_id)
            app.sweeper.sweep()
            drain(url, "orders.commands")  # each re-send lost too (no backlog to wait on)
        run_command(app, lost)
        late_replies = [m for m in drain(url, "saga.replies") if m["headers"]["id"]]
        for message in late_replies:
            run_reply(app, message)
        drain(url, "orders.commands")  # the compensation, left unanswered
        # Backlog: an outbox row left unpublished, a dead letter, then taken in.
        with app.engine.begin() as conn:
            conn.execute(
                text(
                    "UPDATE saga.outbox SET published_at = NULL, created_at = now() - "
                    "interval '90 seconds' WHERE message_id = (SELECT message_id FROM "
                    "saga.outbox ORDER BY created_at LIMIT 1)"
                )
            )
        with Connection(url) as conn:
            conn.Producer().publish(
                {"x": 1},
                exchange="saga.dlx",
                routing_key="orders.commands",
                headers={H_SAGA_ID: late.saga_id, H_STEP: "create_order", H_KIND: "command"},
                declare=[],
            )
        mid = _scrape(client)
        assert mid[("saga_queue_depth", (("queue", "saga.dead_letter"),))] == 1
        assert mid[("saga_outbox_lag_seconds", (("outbox", "saga.outbox"),))] >= 90
        app.intake.take(DEAD_LETTER)
        after = _scrape(client)

    def history(event):
        return scalar(
            app.engine, "SELECT count(*) FROM saga.saga_history WHERE event = :e", e=event
        )

    orchestrator = {"consumer": "orchestrator"}
    assert (
        _delta(before, after, "saga_messages_total", **orchestrator, classification="duplicate")
        == 1
    )
    assert history("duplicate_message") == 1
    assert (
        _delta(before, after, "saga_messages_total", **orchestrator, classification="conflicting")
        == 1
    )
    assert history("conflicting_reply") == 1
    assert (
        _delta(before, after, "saga_messages_total", **orchestrator, classification="invalid") == 1
    )
    assert _delta(before, after, "saga_invalid_messages_total", **orchestrator) == 1
    assert (
        _delta(before, after, "saga_messages_total", **orchestrator, classification="late")
        == len(late_replies)
        == 1
    )
    assert history("late_reply") == 1
    order = {"saga_type": "order", "step": "create_order"}
    assert (
        _delta(before, after, "saga_timeouts_total", **order, action="resent")
        == 2
        == history("step_resent")
    )
    assert _delta(before, after, "saga_timeouts_total", **order, action="given_up") == 1
    assert _delta(before, after, "saga_started_total", saga_type="order") == 2
    assert (
        _delta(before, after, "saga_finished_total", saga_type="order", status="MANUAL_REVIEW") == 1
    )
    assert app.orchestrator.get(dup.saga_id).status.value == "MANUAL_REVIEW"
    assert after[("saga_held_pending", (("holding", "dead_letter"),))] == 1
    assert after[("saga_queue_depth", (("queue", "saga.dead_letter"),))] == 0


def test_logs_are_json_lines_naming_the_saga_without_its_payload(order_app, settings):
    stream = []

    class Capture(logging.Handler):
        def emit(self, record):
            stream.append(self.format(record))

    handler = Capture()
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("saga_tasks")
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.INFO)
    try:
        handle = order_app.start_saga("order", "log-1", {**ORDER, "customer_id": "c-secret-7"})
        run_command(order_app, drain(settings.broker_url, "orders.commands")[0])
        (reply,) = drain(settings.broker_url, "saga.replies")
        run_reply(order_app, reply)
        run_command(order_app, drain(settings.broker_url, "inventory.commands")[0])
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    lines = [json.loads(line) for line in stream]
    transition = next(e for e in lines if e["msg"] == "step_succeeded")
    for key in ("saga_id", "saga_type", "correlation_id", "causation_id", "message_id", "step",
                "status_before", "status_after", "step_status_before", "step_status_after"):  # fmt: skip
        assert key in transition, key
    assert transition["saga_id"] == handle.saga_id
    saga = order_app.orchestrator.get(handle.saga_id)
    assert transition["trace_id"] == saga.traceparent.split("-")[1]
    handled = next(e for e in lines if e["msg"] == "inventory.reserve handled: success")
    for key in ("saga_id", "saga_type", "correlation_id", "causation_id", "message_id", "step",
                "command_id", "trace_id"):  # fmt: skip
        assert key in handled, key
    assert (handled["status_before"], handled["status_after"]) == ("new", "success")
    assert handled["saga_type"] == "order"
    assert handled["causation_id"] == reply["headers"]["id"]  # the reply that caused it
    assert handled["trace_id"] == transition["trace_id"]
    assert all("c-secret-7" not in line for line in stream)


def test_no_input_makes_a_server_error(order_app):
    """Schemathesis: every operation of the OpenAPI spec, many generated inputs, no 5xx."""
    from hypothesis import HealthCheck, given, settings
    from schemathesis.checks import not_a_server_error

    schema = schemathesis.openapi.from_asgi("/openapi.json", create_web_app(order_app))
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 9
    for operation in operations:

        @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
        @given(case=operation.as_strategy())
        def no_server_error(case) -> None:
            case.call_and_validate(checks=[not_a_server_error], headers=AUTH)

        no_server_error()


def test_counts_over_time_come_from_beats_samples(clocked_app, clock, settings):
    """Beat's samples of the counts by status are the dashboard's history of counts."""
    import re

    app = clocked_app
    with TestClient(create_web_app(app), headers=AUTH) as client:
        assert "No samples yet" in client.get("/").text
        app.start_saga("order", "h-1", ORDER)
        app.start_saga("order", "h-2", {**ORDER, "customer_id": "c-low"})
        assert app.maintenance.sample_status() == 1  # one row: order, RUNNING
        clock.advance(60)
        pump(app, settings.broker_url)
        assert app.maintenance.sample_status() == 2  # COMPLETED and COMPENSATED
        clock.advance(60)
        app.start_saga("order", "h-3", ORDER)
        assert app.maintenance.sample_status() == 3
        page = client.get("/?hours=1").text
    lines = dict(re.findall(r'<g data-status="(\w+)" data-last="(\d+)">', page))
    assert lines == {"RUNNING": "1", "COMPLETED": "1", "COMPENSATED": "1"}
    assert "3 samples" in page
    running = re.search(r'data-status="RUNNING".*?points="([^"]+)"', page, re.S).group(1)
    heights = [float(point.split(",")[1]) for point in running.split()]
    # 2 running, then none (no row in that sample: zero, not a gap), then 1.
    assert len(heights) == 3 and heights[1] > heights[2] > heights[0]
    # Samples older than SAGA_SAMPLE_KEEP are dropped when the next one is taken.
    clock.advance(app.settings.sample_keep + 1)
    app.maintenance.sample_status()
    assert scalar(app.engine, "SELECT count(DISTINCT at) FROM saga.status_sample") == 1


def _offered(page: str) -> dict[str, list[str]]:
    """The page's operator buttons, each with the steps or statuses its select offers."""
    import re

    found = {}
    for action in re.findall(r'<button data-action="([\w-]+)"', page):
        select = "resolution" if action == "resolve" else f"{action}-step"
        options = re.search(rf'<select id="{select}"[^>]*>(.*?)</select>', page, re.S)
        found[action] = re.findall(r"<option>(\w+)</option>", options.group(1)) if options else []
    return found


def _withheld(page: str) -> list[tuple[str, str, str]]:
    import html
    import re

    return [
        (label, choice.strip(), html.unescape(why))
        for label, choice, why in re.findall(
            r"<li><b>([\w ]+)</b>(.*?): (.*?)</li>", page.partition('id="withheld"')[2], re.S
        )
    ]


LABELS = {"Retry step": "retry-step", "Skip step": "skip-step", "Compensate": "compensate",
          "Resolve": "resolve"}  # fmt: skip


def test_a_saga_page_offers_only_the_actions_its_state_allows(client, order_app, settings):
    """The operator buttons are what the decider would accept, and what it would refuse
    is listed with its reason; the API refuses each of those with the very same reason."""
    declined = start(client, key="o-low", payload={**ORDER, "customer_id": "c-low"})
    declined = declined.json()["saga_id"]
    pump(order_app, settings.broker_url)
    assert order_app.orchestrator.get(declined).status.value == "COMPENSATED"
    running = start(client, key="o-run").json()["saga_id"]  # its first step awaits its answer

    page = client.get(f"/ui/sagas/{declined}").text
    assert _offered(page) == {} and 'id="no-action"' in page
    withheld = _withheld(page)
    assert [label for label, _, _ in withheld] == list(LABELS), "one reason for each"
    assert withheld[0][2] == "cannot retry a step: the saga is COMPENSATED"
    assert withheld[3][2] == "only a saga in MANUAL_REVIEW can be resolved; this one is COMPENSATED"

    page = client.get(f"/ui/sagas/{running}").text
    assert _offered(page) == {
        "retry-step": ["create_order"],
        "skip-step": ["create_order"],
        "compensate": [],
    }
    withheld = _withheld(page)
    assert ("Resolve", "", "only a saga in MANUAL_REVIEW can be resolved; this one is RUNNING") in (
        withheld
    )
    assert ("Retry step", "reserve_stock") in [(label, choice) for label, choice, _ in withheld]
    # The same rules: each action left out is refused by the API with the reason shown.
    for saga_id in (declined, running):
        page = client.get(f"/ui/sagas/{saga_id}").text
        version = order_app.orchestrator.get(saga_id).version
        for label, choice, why in _withheld(page):
            action = LABELS[label]
            body = {"reason": "try", "expect_version": version}
            if action == "resolve":
                body["status"] = choice or "FAILED"
            elif action != "compensate":
                body["step"] = choice or "create_order"
            refused = client.post(f"/sagas/{saga_id}/{action}", json=body)
            assert refused.status_code == 409, (saga_id, label, choice, refused.text)
            assert refused.json()["detail"] == why
        assert order_app.orchestrator.get(saga_id).version == version


def test_history_comes_a_page_at_a_time_newest_first(client, order_app, settings):
    """``GET /sagas/{id}`` holds a page of the history and the cursor of the next; the
    dashboard links to the older page and back to the newest."""
    import re

    saga_id = start(client, key="pages").json()["saga_id"]
    pump(order_app, settings.broker_url)
    with order_app.engine.connect() as conn:
        everything = (
            conn.execute(
                text("SELECT id FROM saga.saga_history WHERE saga_id = :s ORDER BY id DESC"),
                {"s": saga_id},
            )
            .scalars()
            .all()
        )
    assert len(everything) > 8
    whole = client.get(f"/sagas/{saga_id}").json()
    assert [h["id"] for h in whole["history"]] == everything and whole["history_next"] is None
    seen, cursor = [], None
    while True:
        query = {"history_limit": 4, **({"history_before": cursor} if cursor else {})}
        page = client.get(f"/sagas/{saga_id}", params=query).json()
        assert 1 <= len(page["history"]) <= 4
        seen += [h["id"] for h in page["history"]]
        cursor = page["history_next"]
        if cursor is None:
            break
    assert seen == everything
    for bad in ({"history_limit": 0}, {"history_limit": 1001}, {"history_before": 0}):
        assert client.get(f"/sagas/{saga_id}", params=bad).status_code == 422, bad

    first = client.get(f"/ui/sagas/{saga_id}").text
    assert 'id="history-older"' not in first  # the whole history fits the page
    first = client.get(f"/ui/sagas/{saga_id}?limit=4").text
    assert len(re.findall(r'<tr><td class="t">', first.partition('id="history"')[2])) == 4
    older = re.search(r'href="(/ui/sagas/[^"?]+\?before=(\d+)&amp;limit=4)" id="history-older"',
                      first)  # fmt: skip
    assert older and int(older.group(2)) == everything[3]
    second = client.get(older.group(1).replace("&amp;", "&")).text
    assert 'id="history-newest"' in second and "older than line" in second
    assert len(re.findall(r'<tr><td class="t">', second.partition('id="history"')[2])) == 4
