"""Log lines in both formats carry the saga's identifiers; the setting picks the format."""

from __future__ import annotations

import io
import json
import logging

import pytest

from saga_tasks.config import Settings
from saga_tasks.observability.alerts import Alert, LogAlerter
from saga_tasks.observability.logs import (
    JsonFormatter,
    TextFormatter,
    configure_logging,
    printable,
)

FIELDS = {
    "saga_id": "5a9d3c1e-0000-4000-8000-000000000001",
    "saga_type": "order",
    "trace_id": "0af7651916cd43dd8448eb211c80319c",
    "message_id": "m-1",
    "step": "reserve_stock",
    "status_before": "RUNNING",
    "status_after": "COMPENSATING",
}


def _record(**extra: object) -> logging.LogRecord:
    record = logging.LogRecord(
        "saga_tasks.test", logging.INFO, __file__, 1, "step_failed", (), None
    )
    record.__dict__.update(extra)
    return record


def test_text_lines_read_as_key_value_pairs_after_the_message():
    line = TextFormatter().format(_record(**FIELDS, payload={"customer": "x"}))
    assert " INFO saga_tasks.test step_failed " in line
    for key, value in FIELDS.items():
        assert f"{key}={value}" in line
    assert "payload" not in line and "customer" not in line  # only named identifiers


def test_json_lines_are_one_object_with_the_fields():
    entry = json.loads(JsonFormatter().format(_record(**FIELDS)))
    assert entry["msg"] == "step_failed" and entry["level"] == "INFO"
    assert {k: entry[k] for k in FIELDS} == FIELDS


@pytest.mark.parametrize(("fmt", "parse"), [("json", json.loads), ("text", str)])
def test_the_setting_picks_the_format(monkeypatch, fmt, parse):
    logger = logging.getLogger("saga_tasks")
    saved = (logger.handlers[:], logger.level, logger.propagate)
    monkeypatch.setattr("saga_tasks.observability.logs._configured", set())
    logger.handlers = []
    stream = io.StringIO()
    monkeypatch.setattr("sys.stderr", stream)
    try:
        configure_logging(Settings.from_env({"SAGA_LOG_FORMAT": fmt, "SAGA_LOG_LEVEL": "WARNING"}))
        configure_logging(Settings.from_env({"SAGA_LOG_FORMAT": fmt}))  # idempotent: one handler
        assert len(logger.handlers) == 1
        logging.getLogger("saga_tasks.x").warning("stuck", extra={"saga_id": "s-1"})
        line = stream.getvalue().strip()
        parsed = parse(line)
        assert (parsed["saga_id"] == "s-1") if fmt == "json" else ("saga_id=s-1" in parsed)
    finally:
        logger.handlers, logger.level, logger.propagate = saved


def test_text_from_outside_cannot_forge_a_log_line_or_drive_a_terminal():
    forged = "k\x1b]0;owned\x07\n2026-01-01 00:00:00 ERROR saga_tasks forged line"
    record = logging.LogRecord(
        "saga_tasks.test", logging.INFO, __file__, 1, "started %s", (forged,), None
    )
    record.__dict__.update(reason=forged)
    line = TextFormatter().format(record)
    assert "\n" not in line and "\x1b" not in line and "\x07" not in line
    assert "\\x1b]0;owned\\x07\\n2026" in line
    assert json.loads(JsonFormatter().format(record))["msg"] == f"started {forged}"


def test_a_traceback_stays_on_its_own_lines_after_the_escaped_message():
    try:
        raise ValueError("boom")
    except ValueError:
        import sys

        record = logging.LogRecord(
            "saga_tasks.test", logging.ERROR, __file__, 1, "failed\nhere", (), sys.exc_info()
        )
    record.__dict__.update(saga_id="s-1")
    first, *rest = TextFormatter().format(record).splitlines()
    assert first.endswith("failed\\nhere saga_id=s-1")
    assert rest[0].startswith("Traceback") and rest[-1] == "ValueError: boom"


FORGED = (
    '<img src=x onerror="alert(1)">\x1b[2J\n2026-01-01 00:00:00 ERROR saga_tasks forged'
    "\x9b31m\u2028\u202eenil"
)
"""A reason from outside: HTML, a terminal sequence (ESC and C1's CSI), a forged line
(a newline, Unicode's line separator) and a bidirectional override."""


def test_printable_escapes_c1_controls_line_separators_and_bidi_overrides():
    assert printable("a\x9bb\x85c\u2028d\u2029e\u202ef\u2066g") == (
        "a\\x9bb\\x85c\\u2028d\\u2029e\\u202ef\\u2066g"
    )
    assert printable("café, 東京, emoji 🙂") == "café, 東京, emoji 🙂"


def test_the_alert_line_is_escaped_whatever_formatter_writes_it():
    """A host application's formatter, or Celery's before ours is set up, does not escape:
    the ALERT line escapes the text it quotes itself, as the text format would."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    logger = logging.getLogger("saga_tasks.observability.alerts")
    saved = (logger.handlers[:], logger.propagate, logger.level)
    logger.handlers, logger.propagate = [handler], False
    logger.setLevel(logging.ERROR)
    try:
        LogAlerter().send(Alert("manual_review", "s-1", "ord\ner", "MANUAL_REVIEW", FORGED, 5.0))
    finally:
        logger.handlers, logger.propagate, logger.level = saved
    (line,) = stream.getvalue().splitlines()
    assert line.startswith("ERROR ALERT manual_review: saga s-1 (ord\\ner) is MANUAL_REVIEW")
    for raw in ("\x1b", "\x9b", "\u2028", "\u202e"):
        assert raw not in line
    assert line.endswith(
        ': <img src=x onerror="alert(1)">\\x1b[2J\\n2026-01-01 00:00:00 ERROR saga_tasks '
        "forged\\x9b31m\\u2028\\u202eenil"
    )
    assert printable(line) == line, "the text format leaves it as it is"
