"""Log lines that name their saga: JSON for pipelines, ``key=value`` text for people.

Every saga_tasks log call passes its identifiers (saga_id, message_id, step, ...)
as ``extra``; the formatters here put them on the line. Payloads never are. The
``trace_id`` is the saga's W3C trace id, so a log line finds its spans.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

from saga_tasks.config import Settings

CONTEXT_FIELDS = (
    "saga_id",
    "saga_type",
    "trace_id",
    "step",
    "message_id",
    "correlation_id",
    "causation_id",
    "command_id",
    "status_before",
    "status_after",
    "step_status_before",
    "step_status_after",
    "participant",
    "consumer",
    "queue",
    "reason",
    "code",
    "error",
    "count",
    "unpublished",
    "outbox",
    "schedule",
    "tick",
)


_CONTROL = {c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7F, 0xA0))} | {
    ord("\n"): "\\n",
    ord("\r"): "\\r",
    ord("\t"): "\\t",
}
"""C0 and C1 control characters (C1's CSI, 0x9b, starts a terminal sequence as ESC [ does;
NEL, 0x85, ends a line for some readers)."""
_CONTROL |= {
    c: f"\\u{c:04x}"
    for c in (
        0x061C,
        0x200E,
        0x200F,
        0x2028,
        0x2029,
        *range(0x202A, 0x202F),
        *range(0x2066, 0x206A),
    )
}
"""Unicode's line and paragraph separators, and the bidirectional controls that make a
line read otherwise than it is written."""


def printable(text: str) -> str:
    """``text`` with control characters escaped (``\\n``, ``\\x1b``, ``\\u2028``): text from
    outside (a business key, a reason, a header) cannot forge a line or drive a terminal."""
    return text.translate(_CONTROL)


def alert(logger: logging.Logger, message: str, *args: object, **fields: Any) -> None:
    """An ``ALERT`` line at ERROR, what a log-based pager picks up. Every argument is
    escaped by ``printable`` before it is formatted, whatever formatter the process runs
    (a host application's own, Celery's before ours is set up): a reason is text from
    outside. ``fields`` go to the record as ``extra``."""
    logger.error(
        f"ALERT {message}",
        *(printable(a) if isinstance(a, str) else a for a in args),
        extra=fields,
        stacklevel=2,
    )


def _context(record: logging.LogRecord) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for name in CONTEXT_FIELDS:
        value = getattr(record, name, None)
        if value is not None:
            found[name] = str(value) if not isinstance(value, int | float) else value
    return found


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = printable(record.message)
        return super().formatMessage(record)

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        pairs = " ".join(f"{k}={printable(str(v))}" for k, v in _context(record).items())
        if not pairs:
            return line
        head, newline, rest = line.partition("\n")  # a traceback follows on its own lines
        return f"{head} {pairs}{newline}{rest}"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
            **_context(record),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


_configured: set[int] = set()


def configure_logging(settings: Settings) -> None:
    """Give the ``saga_tasks`` logger one handler in the configured format (idempotent)."""
    logger = logging.getLogger("saga_tasks")
    logger.setLevel(settings.log_level.upper())
    if id(logger) in _configured:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if settings.log_format == "json" else TextFormatter())
    logger.addHandler(handler)
    logger.propagate = False
    _configured.add(id(logger))
