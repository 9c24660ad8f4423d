"""A person's decision over HTTP and on the dashboard: the waiting list, the form, the
graph of the saga's steps, and the refusals that leave the saga unchanged."""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient

from saga_tasks.core.states import SagaStatus, StepStatus
from saga_tasks.web import create_web_app
from tests.helpers import ANA_TOKEN, events, pump

AUTH = {"Authorization": f"Bearer {ANA_TOKEN}"}
RETURN = {"return_id": "r-1", "order_ref": "o-1", "customer_id": "c-1", "sku": "sku-1",
          "qty": 1, "amount_cents": 500}  # fmt: skip


@pytest.fixture
def waiting(order_app, settings):
    handle = order_app.start_saga("return", "r-1", RETURN)
    pump(order_app, settings.broker_url)
    assert order_app.orchestrator.get(handle.saga_id).steps["inspect"].status is (
        StepStatus.REQUESTED
    )
    return handle.saga_id


def _node(html: str, step: str) -> str:
    found = re.search(rf'data-step="{step}" data-status="(\w+)"', html)
    assert found, f"no node for {step}"
    return found.group(1)


def test_a_decision_over_http_and_what_the_dashboard_shows(order_app, settings, waiting):
    saga_id = waiting
    url = f"/sagas/{saga_id}/steps/inspect/signal"
    with TestClient(create_web_app(order_app)) as anonymous:
        assert anonymous.post(url, json={"data": {}, "reason": "x"}).status_code == 401
    with TestClient(create_web_app(order_app), headers=AUTH) as client:
        overview = client.get("/").text
        assert 'id="people"' in overview and saga_id[:8] in overview
        page = client.get(f"/ui/sagas/{saga_id}").text
        assert 'id="signal-inspect"' in page and "data: Inspection" in page
        listed = re.search(r'id="signal-fields-inspect".*?</table>', page, re.S).group(0)
        assert re.findall(r"<tr><td><code>(\w+)</code></td><td><code>(.*?)</code></td>"
                          r"<td>(\w+)</td></tr>", listed) == [
            ("decision", "&#34;accepted&#34; | &#34;rejected&#34;", "required"),
            ("note_ref", "string | null", "optional"),
        ], "the schema's fields, each with what it takes"  # fmt: skip
        assert 'placeholder="{&#34;decision&#34;: &#34;accepted&#34;}"' in page
        assert _node(page, "inspect") == "REQUESTED"
        assert _node(page, "create_return") == "SUCCEEDED"
        before = order_app.orchestrator.get(saga_id).version

        bad = client.post(url, json={"data": {"decision": "perhaps"}, "reason": "looked"})
        assert bad.status_code == 422 and bad.json()["type"].endswith("/invalid-payload")
        assert "decision" in bad.json()["detail"] and "perhaps" not in bad.json()["detail"]
        not_human = client.post(
            f"/sagas/{saga_id}/steps/refund/signal", json={"data": {}, "reason": "x"}
        )
        assert not_human.status_code == 409
        assert order_app.orchestrator.get(saga_id).version == before, "refusals change nothing"

        done = client.post(url, json={"data": {"decision": "rejected"}, "reason": "worn"})
        assert done.status_code == 200, done.text
        signalled = [h for h in done.json()["history"] if h["event"] == "step_signalled"]
        assert signalled[0]["actor"] == "ana"
        again = client.post(url, json={"data": {"decision": "rejected"}, "reason": "retry"})
        assert again.status_code == 200, "the same decision again is a duplicate, not an error"
        pump(order_app, settings.broker_url)
        state = order_app.orchestrator.get(saga_id)
        assert state.status is SagaStatus.COMPLETED
        page = client.get(f"/ui/sagas/{saga_id}").text
        assert _node(page, "refund") == "SKIPPED" and _node(page, "send_back") == "SUCCEEDED"
        assert "inspect.decision == &#39;accepted&#39;" in page, "conditions on the edges"
        assert 'id="signal-inspect"' not in page
        assert 'id="people"' not in client.get("/").text, "nobody's decision is awaited now"


def test_the_same_decision_posted_twice_from_the_form_is_a_duplicate(order_app, waiting):
    """The dashboard's form sends the version the page showed. Posted again (a double
    click, a retry after a lost answer), the saga has moved past that version: the same
    decision is answered as the duplicate it is, not as a stale view; only a decision
    that would change the saga is held to the version."""
    saga_id = waiting
    url = f"/sagas/{saga_id}/steps/inspect/signal"
    with TestClient(create_web_app(order_app), headers=AUTH) as client:
        page = client.get(f"/ui/sagas/{saga_id}").text
        shown = int(re.search(r'data-saga-version="(\d+)"', page).group(1))
        form = {"data": {"decision": "accepted"}, "reason": "fine", "expect_version": shown}
        first = client.post(url, json=form)
        assert first.status_code == 200, first.text
        after = order_app.orchestrator.get(saga_id)
        assert after.version > shown
        again = client.post(url, json=form)
        assert again.status_code == 200, again.text
        assert again.json()["version"] == after.version, "a duplicate changes nothing"
        assert order_app.orchestrator.get(saga_id) == after
        other = client.post(url, json={**form, "data": {"decision": "rejected"}})
        assert other.status_code == 409, other.text
        assert other.json()["type"].endswith("/version-mismatch"), "a new decision is checked"
        current = {**form, "data": {"decision": "rejected"}, "expect_version": after.version}
        refused = client.post(url, json=current)
        assert refused.status_code == 409 and refused.json()["type"].endswith("/action-refused")
    notes = [h for h in events(order_app, saga_id) if h[0] == "duplicate_signal"]
    assert notes == [("duplicate_signal", "ana")]
