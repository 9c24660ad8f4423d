"""/metrics where each participant has a database of its own (the web app is given the
orchestrator's only, as the README's table of processes says)."""

from __future__ import annotations

from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import text

from saga_tasks.web import create_web_app
from tests.helpers import ANA_TOKEN, ORDER, pump


def test_state_gauges_read_the_saga_database_only(order_app, settings):
    """Found by review: the gauges read every participant's outbox through the
    orchestrator's engine; with participants' databases apart the whole scrape failed
    (saga_state_up 0, no saga gauges)."""
    assert settings.participants_apart
    with order_app.engine.connect() as conn:
        # As deployed: the orchestrator's database holds the saga schema only.
        found = conn.execute(text("SELECT to_regclass('inventory.outbox')")).scalar()
    assert found is None
    order_app.start_saga("order", "metrics-apart", ORDER)
    pump(order_app, settings.broker_url)
    with TestClient(
        create_web_app(order_app), headers={"Authorization": f"Bearer {ANA_TOKEN}"}
    ) as client:
        body = client.get("/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(body)}
    assert families["saga_state_up"].samples[0].value == 1
    sagas = {s.labels["status"]: s.value for s in families["saga_sagas"].samples}
    assert sagas == {"COMPLETED": 1}
