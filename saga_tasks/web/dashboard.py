"""The dashboard: server-rendered pages over the same views as the API and the CLI.

Lists are bounded and indexed (status and creation time, business key, held
messages pending); the counts over time come from beat's samples, not the saga
table. The status tiles count the table live, so they are exact the moment an
operator acts; that one query grows with the table (measured: README, Performance).
Reading the pages needs a token with the read scope, like the JSON API: without one a
page answers 401 with a shell that holds no data, and its script fetches the page again
with the token the person typed (kept in the tab's session storage, gone with the tab)
and shows what comes back. Operator buttons call the JSON API with the same token.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, FastAPI, Query, Request
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from jinja2 import Environment, FileSystemLoader, select_autoescape

from saga_tasks.app import SagaApp
from saga_tasks.core.definitions import SagaDefinition
from saga_tasks.core.states import SagaStatus
from saga_tasks.errors import SagaNotFound, UnknownDefinitionVersion
from saga_tasks.ops.views import (
    HISTORY_PAGE,
    HISTORY_PAGE_MOST,
    list_view,
    saga_state_and_view,
    schedules_view,
    stuck,
)
from saga_tasks.persistence import dispatch, samples
from saga_tasks.persistence import status as status_sql
from saga_tasks.persistence.db import translated
from saga_tasks.web.actions import offers
from saga_tasks.web.auth import READ, Forbidden, Gate, Unauthorized
from saga_tasks.web.deps import App

HERE = Path(__file__).parent
STATUS_ORDER = [s.value for s in SagaStatus]

_env = Environment(
    loader=FileSystemLoader(HERE / "templates"),
    autoescape=select_autoescape(["html"]),
    trim_blocks=True,
    lstrip_blocks=True,
)


PAGE_HEADERS = {
    # Scripts and styles from this origin only (no inline script: the saga page passes its
    # id and version in data attributes), no framing, no referrer leaving the site.
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    # The same URL answers a shell or a page with data, by the Authorization header.
    "Cache-Control": "no-store",
    "Vary": "Authorization",
}


router = APIRouter(include_in_schema=False)


def mount(web: FastAPI) -> None:
    """The dashboard's static files and pages on ``web``."""
    web.mount("/static", StaticFiles(directory=HERE / "static"), name="static")
    web.include_router(router)


def page(name: str, status_code: int = 200, **context: Any) -> HTMLResponse:
    headers = PAGE_HEADERS
    if status_code == 401:  # a 401 names the scheme it wants (RFC 9110)
        headers = {**PAGE_HEADERS, "WWW-Authenticate": 'Bearer realm="saga_tasks"'}
    return HTMLResponse(
        _env.get_template(name).render(**context), status_code=status_code, headers=headers
    )


def refused(request: Request) -> HTMLResponse | None:
    """The shell without data, saying why, unless the request may read."""
    gate: Gate = request.app.state.gate
    try:
        gate.require(request.headers.get("authorization"), READ)
    except Unauthorized as exc:
        return page("locked.html", 401, why=str(exc))
    except Forbidden as exc:
        return page("locked.html", 403, why=str(exc))
    return None


@router.get("/", response_class=HTMLResponse)
def overview(
    request: Request,
    app: App,
    status: SagaStatus | None = None,
    saga_type: Annotated[str | None, Query(alias="type", max_length=100)] = None,
    business_key: Annotated[str | None, Query(max_length=200)] = None,
    hours: Annotated[int, Query(ge=1, le=168)] = 6,
) -> HTMLResponse:
    if (shell := refused(request)) is not None:
        return shell
    known_type = saga_type if saga_type in {d.saga_type for d in app.registry} else None
    recent = list_view(
        app, status=status, saga_type=known_type, business_key=business_key or None, limit=50
    )
    return page(
        "overview.html",
        counts=_counts(app),
        chart=_chart(app, hours),
        history=_status_history(app, hours),
        hours=hours,
        stuck=stuck(app, limit=20),
        recent=recent["sagas"],
        held=_held_counts(app),
        flow=_flow(app),
        people=_waiting_for_people(app),
        filters={
            "status": status.value if status else "",
            "type": saga_type or "",
            "business_key": business_key or "",
        },
        statuses=STATUS_ORDER,
        types=sorted({d.saga_type for d in app.registry}),
    )


@router.get("/ui/sagas/{saga_id}", response_class=HTMLResponse)
def saga_page(
    request: Request,
    app: App,
    saga_id: str,
    before: Annotated[int | None, Query(ge=1, le=2**62)] = None,
    limit: Annotated[int, Query(ge=1, le=HISTORY_PAGE_MOST)] = HISTORY_PAGE,
) -> HTMLResponse:
    if (shell := refused(request)) is not None:
        return shell
    try:
        state, view = saga_state_and_view(app, saga_id, history_limit=limit, history_before=before)
    except SagaNotFound as exc:
        return page("missing.html", 404, what=str(exc))
    definition = _definition(app, view)
    offered, withheld = (
        offers(definition, state, app.clock.now()) if definition is not None else (None, [])
    )
    return page(
        "saga.html",
        saga=view,
        timeline=_timeline(view),
        graph=_graph(app, view),
        signals=_signals(app, view),
        offered=offered,
        withheld=withheld,
        before=before,
        page_limit="" if limit == HISTORY_PAGE else f"&limit={limit}",
        statuses=STATUS_ORDER,
    )


@router.get("/ui/held", response_class=HTMLResponse)
def held_page(
    request: Request, app: App, holding: str = "dead_letter", status: str = "pending"
) -> HTMLResponse:
    if (shell := refused(request)) is not None:
        return shell
    holding = holding if holding in ("dead_letter", "parking") else "dead_letter"
    status = status if status in ("pending", "replayed", "discarded", "all") else "pending"
    with translated(app.settings.database_url), app.engine.connect() as conn:
        rows = status_sql.held_with_sagas(conn, holding, None if status == "all" else status, 200)
    return page("held.html", rows=rows, holding=holding, status=status, held=_held_counts(app))


@router.get("/ui/schedules", response_class=HTMLResponse)
def schedules_page(request: Request, app: App) -> HTMLResponse:
    if (shell := refused(request)) is not None:
        return shell
    view = schedules_view(app)
    return page("schedules.html", view=view, held=_held_counts(app))


def _definition(app: SagaApp, view: dict[str, Any]) -> SagaDefinition | None:
    try:
        return app.registry.get(view["saga_type"], view["definition_version"])
    except UnknownDefinitionVersion:
        return None


def _graph(app: SagaApp, view: dict[str, Any]) -> dict[str, Any] | None:
    """The saga's steps as a graph, left to right by depth, each node in its step's state;
    an edge into a conditional step carries its condition. None when the definition is
    not loaded here (the steps table still says everything)."""
    definition = _definition(app, view)
    if definition is None:
        return None
    depth: dict[str, int] = {}
    for s in definition.steps:  # dependency order: parents first
        depth[s.name] = max((depth[p] + 1 for p in definition.parents[s.name]), default=0)
    rows: dict[int, int] = {}
    place: dict[str, tuple[int, int]] = {}
    for s in definition.steps:
        row = rows.get(depth[s.name], 0)
        rows[depth[s.name]] = row + 1
        place[s.name] = (depth[s.name], row)
    status = {st["step"]: st["status"] for st in view["steps"]}
    labels = {
        s.name: (
            status.get(s.name, "PENDING"),
            "pivot" if s.pivot else ("a person" if s.human else s.queue),
        )
        for s in definition.steps
    }
    # Every box as wide as the widest text it holds, so no text runs past its border.
    text = max(
        max(text_width(name, NAME_FONT, bold=True), text_width(f"{st} · {note}", STATE_FONT))
        for name, (st, note) in labels.items()
    )
    w, h, gap_x, gap_y = max(150, round(text + 2 * NODE_PAD)), 44, 60, 22
    nodes = [
        {
            "step": s.name,
            "status": labels[s.name][0],
            "x": 10 + place[s.name][0] * (w + gap_x),
            "y": 10 + place[s.name][1] * (h + gap_y),
            "kind": "human" if s.human else ("pivot" if s.pivot else "step"),
            "note": labels[s.name][1],
        }
        for s in definition.steps
    ]
    at = {n["step"]: n for n in nodes}
    edges = [
        {
            "x1": at[p]["x"] + w,
            "y1": at[p]["y"] + h / 2,
            "x2": at[s.name]["x"],
            "y2": at[s.name]["y"] + h / 2,
            "when": str(s.when) if s.when is not None else "",
        }
        for s in definition.steps
        for p in definition.parents[s.name]
    ]
    return {
        "nodes": nodes,
        "edges": edges,
        "w": w,
        "h": h,
        "width": 20 + (max(depth.values()) + 1) * (w + gap_x) - gap_x,
        "height": 20 + max(rows.values()) * (h + gap_y) - gap_y,
    }


NAME_FONT, STATE_FONT, NODE_PAD = 12.5, 10.5, 8
"""The graph's font sizes (style.css: ``svg.graph .node .name``, ``.state``) and the
space between a box's border and its text."""
_NARROW = frozenset("fijlrt.,:;'!|()[] ·-")
_WIDE = frozenset("mwMW@%")


def text_width(text: str, size: float, *, bold: bool = False) -> float:
    """How wide ``text`` runs at font ``size``, over-estimated for the common sans
    fonts (a box a little too wide is better than text past its border): the page
    cannot measure it before the browser draws it."""
    ems = sum(
        0.4 if c in _NARROW else 0.95 if c in _WIDE else 0.75 if c.isupper() or c.isdigit()
        else 0.62
        for c in text
    )  # fmt: skip
    return ems * size * (1.08 if bold else 1.0)


def _signals(app: SagaApp, view: dict[str, Any]) -> list[dict[str, Any]]:
    """The human steps waiting for a person's decision, with the fields their schema asks."""
    definition = _definition(app, view)
    if definition is None or view["status"] not in ("RUNNING", "COMPENSATING"):
        return []
    waiting = []
    for st in view["steps"]:
        s = definition.by_name.get(st["step"])
        if s is None or s.human is None or st["status"] != "REQUESTED":
            continue
        fields = [
            {"name": f.name, "takes": f.takes, "required": f.required} for f in s.human.fields
        ]
        example = {f.name: _example(f.takes) for f in s.human.fields if f.required}
        waiting.append(
            {
                "step": s.name,
                "schema": s.human.schema_name,
                "fields": fields,
                "example": json.dumps(example),
            }
        )
    return waiting


def _example(takes: str) -> Any:
    """A value of what a field takes, for the form's placeholder: its first allowed
    value, or an empty one of its type."""
    first = takes.partition(" | ")[0]
    empty = {"string": "", "integer": 0, "number": 0, "boolean": False, "object": {}}
    if first in empty:
        return empty[first]
    if first.startswith("array"):
        return []
    try:
        return json.loads(first)
    except ValueError:
        return None


def _waiting_for_people(app: SagaApp) -> list[dict[str, Any]]:
    """Sagas whose human step waits for a decision, the longest waiting first."""
    human = sorted(
        (d.saga_type, d.version, s.name) for d in app.registry for s in d.steps if s.human
    )
    if not human:
        return []
    with translated(app.settings.database_url), app.engine.connect() as conn:
        return status_sql.waiting_for_people(conn, human, limit=50)


def _counts(app: SagaApp) -> dict[str, int]:
    with translated(app.settings.database_url), app.engine.connect() as conn:
        counted = status_sql.counts_by_status(conn)
    found = dict.fromkeys(STATUS_ORDER, 0)
    found.update(counted)
    return found


def _held_counts(app: SagaApp) -> dict[str, int]:
    with translated(app.settings.database_url), app.engine.connect() as conn:
        pending = status_sql.pending_held(conn)
    return {"dead_letter": 0, "parking": 0} | pending


def _flow(app: SagaApp) -> list[dict[str, Any]]:
    """Each command queue's commands in flight and waiting for capacity, with its limits."""
    with translated(app.settings.database_url), app.engine.connect() as conn:
        flows = dispatch.counts(conn)
    found = []
    for queue in app.topology.command_queues:
        flow = flows.get(queue, dispatch.QueueFlow(0, 0, 0.0))
        limit = app.flow.limits.get(queue)
        found.append(
            {
                "queue": queue,
                "in_flight": flow.in_flight,
                "waiting": flow.waiting,
                "oldest_wait": flow.oldest_wait_seconds,
                "max_in_flight": limit.max_in_flight if limit else 0,
                "rate_limit": limit.rate_limit if limit else 0,
            }
        )
    return found


def _chart(app: SagaApp, hours: int) -> dict[str, Any]:
    """Sagas started per time bucket over the last ``hours``, stacked by their status now."""
    now = app.clock.now()
    bucket = max(60, hours * 3600 // 36)
    since = now - timedelta(hours=hours)
    with translated(app.settings.database_url), app.engine.connect() as conn:
        rows = status_sql.started_by_slot(conn, bucket, since)
    first = int(since.timestamp() // bucket)
    last = int(now.timestamp() // bucket)
    slots: dict[int, dict[str, int]] = {s: {} for s in range(first, last + 1)}
    for slot, status, n in rows:
        slots.setdefault(int(slot), {})[status] = n
    peak = max((sum(v.values()) for v in slots.values()), default=0) or 1
    width, height = 900, 180.0
    bar = width / len(slots)
    bars = []
    for i, (slot, counts) in enumerate(sorted(slots.items())):
        y = float(height)
        for status in STATUS_ORDER:
            n = counts.get(status, 0)
            if not n:
                continue
            h = n / peak * (height - 10)
            y -= h
            started = datetime.fromtimestamp(slot * bucket, UTC)
            bars.append(
                {
                    "x": round(i * bar + 1, 1),
                    "y": round(y, 1),
                    "w": round(max(bar - 2, 1), 1),
                    "h": round(h, 1),
                    "status": status,
                    "n": n,
                    "label": f"{started:%H:%M} UTC: {n} {status.lower()}",
                }
            )
    return {
        "bars": bars,
        "width": width,
        "height": height,
        "peak": peak,
        "bucket_minutes": bucket // 60,
    }


def _status_history(app: SagaApp, hours: int) -> dict[str, Any]:
    """How many sagas were in each status over the last ``hours``, from beat's samples:
    a line per status (the large terminal counts and the small ones on one axis would
    hide the small ones, so each line has its own scale and says its range)."""
    now = app.clock.now()
    since = now - timedelta(hours=hours)
    with translated(app.settings.database_url), app.engine.connect() as conn:
        found = samples.since(conn, since)
    width, height, gap = 900.0, 46.0, 8.0
    # A sample has rows only for the statuses that had sagas: missing means none.
    times = sorted({sample["at"] for sample in found})
    counted = {(sample["at"], sample["status"]): sample["count"] for sample in found}
    by_status: dict[str, list[tuple[datetime, int]]] = {
        status: [(at, counted.get((at, status), 0)) for at in times]
        for status in {sample["status"] for sample in found}
    }
    span = max((now - since).total_seconds(), 1.0)
    lines = []
    for index, status in enumerate(s for s in STATUS_ORDER if s in by_status):
        points = by_status[status]
        low, high = min(n for _, n in points), max(n for _, n in points)
        top = index * (height + gap)

        def y(n: int, low: int = low, high: int = high, top: float = top) -> float:
            return round(top + height - (n - low) / ((high - low) or 1) * (height - 6) - 3, 1)

        lines.append(
            {
                "status": status,
                "points": " ".join(
                    f"{round((at - since).total_seconds() / span * width, 1)},{y(n)}"
                    for at, n in points
                ),
                "last": points[-1][1],
                "low": low,
                "high": high,
                "top": top,
            }
        )
    return {
        "lines": lines,
        "width": width,
        "height": max(len(lines) * (height + gap), height),
        "row": height,
        "samples": len({s["at"] for s in found}),
        "interval": int(app.settings.sample_interval),
    }


def _timeline(view: dict[str, Any]) -> dict[str, Any]:
    """Each step's forward and compensation spans on one time axis, from the page of
    history the view holds (newest first: read here oldest first)."""

    def at(value: str | None) -> datetime | None:
        return datetime.fromisoformat(value) if value else None

    history = view["history"][::-1]
    start = at(view["created_at"]) or datetime.now(UTC)
    times = [at(h["at"]) for h in history if h["at"]]
    end = at(view["finished_at"]) or max([*(t for t in times if t), datetime.now(UTC)])
    span = max((end - start).total_seconds(), 0.001)
    width, label, row = 900, 180, 26
    open_forward = {"step_requested", "step_resent"}
    close_forward = {"step_succeeded", "step_failed", "step_given_up"}
    open_comp = {"compensation_requested", "compensation_resent"}
    close_comp = {"step_compensated", "compensation_failed", "compensation_exhausted"}
    rows = []
    for index, step in enumerate(view["steps"]):
        spans: list[dict[str, Any]] = []
        fwd: datetime | None = None
        comp: datetime | None = None
        fwd_end: tuple[datetime, str] | None = None
        comp_end: tuple[datetime, str] | None = None
        for h in history:
            if h["step"] != step["step"] or not h["at"]:
                continue
            t = at(h["at"])
            assert t is not None
            if h["event"] in open_forward and fwd is None:
                fwd = t
            elif h["event"] in close_forward:
                fwd_end = (t, h["event"])
            elif h["event"] in open_comp and comp is None:
                comp = t
            elif h["event"] in close_comp:
                comp_end = (t, h["event"])
        for begin, finish, kind in ((fwd, fwd_end, "forward"), (comp, comp_end, "compensation")):
            if begin is None:
                continue
            stop, how = finish if finish else (end, "open")
            x = label + (begin - start).total_seconds() / span * (width - label - 10)
            w = max((stop - begin).total_seconds() / span * (width - label - 10), 3)
            seconds = (stop - begin).total_seconds()
            spans.append(
                {
                    "x": round(x, 1),
                    "w": round(w, 1),
                    "kind": kind,
                    "how": how,
                    "title": f"{step['step']} {kind}: {seconds * 1000:.0f} ms ({how})",
                }
            )
        rows.append(
            {"step": step["step"], "status": step["status"], "y": 20 + index * row, "spans": spans}
        )
    return {
        "rows": rows,
        "width": width,
        "height": 30 + len(rows) * row,
        "label": label,
        "total_ms": round(span * 1000),
    }
