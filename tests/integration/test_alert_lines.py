"""The orchestrator's ALERT line quotes a participant's words (a refused compensation's
error reaches the review reason): escaped as the text log format escapes, whatever
formatter writes the line."""

from __future__ import annotations

from saga_tasks.core.states import SagaStatus
from tests.helpers import ORDER, drain, run_command, run_reply

EVIL = '<b onmouseover="x">\x1b]0;pwned\x07\n2026-01-01 00:00:00 ERROR saga_tasks forged\u2028'


def _failed(reply: dict, message: str) -> dict:
    return {**reply, "kwargs": {"outcome": "failure", "error": {"code": "x", "message": message}}}


def test_a_refused_compensation_alerts_with_the_participants_words_escaped(
    order_app, settings, caplog
):
    app, url = order_app, settings.broker_url
    handle = app.start_saga("order", "alert-esc", ORDER)
    run_command(app, drain(url, "orders.commands")[0])
    run_reply(app, drain(url, "saga.replies")[0])  # create_order succeeded
    run_command(app, drain(url, "inventory.commands")[0])
    run_reply(app, _failed(drain(url, "saga.replies")[0], "out of stock"))
    run_command(app, drain(url, "orders.commands")[0])  # create_order's compensation
    caplog.set_level("ERROR", logger="saga_tasks.orchestrator")
    run_reply(app, _failed(drain(url, "saga.replies")[0], EVIL))

    state = app.orchestrator.get(handle.saga_id)
    assert state.status is SagaStatus.MANUAL_REVIEW and EVIL in (state.reason or "")
    (line,) = [
        r.getMessage() for r in caplog.records if r.getMessage().startswith("ALERT saga needs")
    ]
    assert "\n" not in line and "\x1b" not in line and "\x07" not in line
    assert "\u2028" not in line
    assert '<b onmouseover="x">\\x1b]0;pwned\\x07\\n2026-01-01 00:00:00 ERROR' in line
