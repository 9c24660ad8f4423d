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


class Tracing:
    """Spans for one app: OpenTelemetry's when ``export`` is on (off, console,
    file:<path>) and it is installed, else none; the trace context flows either way.

    Each app holds its own tracer provider (none is installed process-wide), built in
    the process that first opens a span (a forked worker child builds its own).
    """

    def __init__(self, export: str = "off") -> None:
        self.export = export
        self._lock = threading.Lock()
        self._tracer: Any = None
        self._built_in: int | None = None

    def _get_tracer(self) -> Any:
        if self.export == "off":
            return None
        pid = os.getpid()
        if self._built_in == pid:
            return self._tracer
        with self._lock:
            if self._built_in != pid:
                self._tracer = _build_tracer(self.export)
                self._built_in = pid
        return self._tracer

    @contextmanager
    def span(self, name: str, traceparent: str | None, **attributes: Any) -> Iterator[str | None]:
        """A span, child of ``traceparent`` (a root without one); yields the context to
        pass on: the span's own, or without OpenTelemetry the given one (a new one if
        none)."""
        tracer = self._get_tracer()
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


OFF = Tracing("off")


def _build_tracer(export: str) -> Any:
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor
    except ImportError:
        log.warning("SAGA_TRACE_EXPORT=%s, but OpenTelemetry is not installed", export)
        return None
    provider = TracerProvider(resource=Resource.create({"service.name": "saga_tasks"}))
    exporter: Any = ConsoleSpanExporter() if export == "console" else JsonLinesExporter(export[5:])
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider.get_tracer("saga_tasks")


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
