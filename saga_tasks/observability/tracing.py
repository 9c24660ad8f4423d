"""W3C trace context through every message of a saga, and OpenTelemetry spans when installed.

Every saga has a ``traceparent`` from its start (the caller's, or a new one), carried
by each command and copied into each reply, so logs and spans of one saga share one
trace id whether or not OpenTelemetry is installed. With the ``otel`` extra and
``SAGA_TRACE_EXPORT`` set, each start, command and reply is a span, a child of the
saga's context: one trace per saga across every process.
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

log = logging.getLogger("saga_tasks.observability.tracing")

TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")


def new_traceparent() -> str:
    """A fresh, sampled W3C trace context."""
    return f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"


def trace_id(traceparent: str | None) -> str | None:
    match = TRACEPARENT.match(traceparent or "")
    return match.group(1) if match else None


_tracer: Any = None
_setup_lock = threading.Lock()
_configured_for: str | None = None


def configure(export: str) -> bool:
    """Install a tracer provider for ``export`` (off, console, file:<path>); False if off
    or OpenTelemetry is not installed."""
    global _tracer, _configured_for  # noqa: PLW0603 - one provider per process
    if export == "off":
        return False
    with _setup_lock:
        if _configured_for == f"{os.getpid()}:{export}":
            return _tracer is not None
        try:
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import (
                ConsoleSpanExporter,
                SimpleSpanProcessor,
            )
        except ImportError:
            log.warning("SAGA_TRACE_EXPORT=%s, but OpenTelemetry is not installed", export)
            _configured_for = f"{os.getpid()}:{export}"
            return False
        provider = TracerProvider(resource=Resource.create({"service.name": "saga_tasks"}))
        exporter: Any = (
            ConsoleSpanExporter() if export == "console" else JsonLinesExporter(export[5:])
        )
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        _tracer = provider.get_tracer("saga_tasks")
        _configured_for = f"{os.getpid()}:{export}"
        return True


@contextmanager
def span(name: str, traceparent: str | None, **attributes: Any) -> Iterator[str | None]:
    """A span, child of ``traceparent`` (a root without one); yields the context to pass on:
    the span's own, or without OpenTelemetry the given one (a new one if none)."""
    tracer = _tracer
    if tracer is None:
        yield traceparent or new_traceparent()
        return
    from opentelemetry.context import Context
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    propagator = TraceContextTextMapPropagator()
    # No valid parent: this span is the root of a new trace.
    parent = (
        propagator.extract({"traceparent": traceparent})
        if traceparent and TRACEPARENT.match(traceparent)
        else Context()
    )
    with tracer.start_as_current_span(name, context=parent) as current:
        for key, value in attributes.items():
            if value is not None:
                current.set_attribute(key, str(value))
        carrier: dict[str, str] = {}
        propagator.inject(carrier)
        yield carrier.get("traceparent", traceparent)


class JsonLinesExporter:
    """Writes finished spans as JSON lines to a file (one per process, appended)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()

    def export(self, spans: Sequence[Any]) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        with self._lock, open(self.path, "a", encoding="utf-8") as out:  # noqa: PTH123
            for s in spans:
                parent = s.parent.span_id if s.parent is not None else None
                out.write(
                    json.dumps(
                        {
                            "name": s.name,
                            "trace_id": f"{s.context.trace_id:032x}",
                            "span_id": f"{s.context.span_id:016x}",
                            "parent_id": f"{parent:016x}" if parent else None,
                            "attributes": dict(s.attributes or {}),
                            "pid": os.getpid(),
                        }
                    )
                    + "\n"
                )
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def attributes(headers: Mapping[str, Any] | None) -> dict[str, Any]:
    """The saga identifiers of a message, as span attributes."""
    headers = headers or {}
    return {
        "saga.id": headers.get("saga_id"),
        "saga.step": headers.get("saga_step"),
        "saga.kind": headers.get("saga_message_kind"),
        "saga.command_id": headers.get("saga_command_id"),
    }
