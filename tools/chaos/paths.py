"""How each saga of a chaos run ended against the path its injected fault gives it: good
orders compensated, sagas waiting for a person for no fault that needs one (load alone),
re-sends per saga, and completion latency."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Collection, Mapping
from typing import Any

from sqlalchemy import text

PERSON_FAULTS = frozenset(
    {"confirm_dead_lettered", "compensation_dead_lettered", "compensation_refused"}
)
"""Faults whose saga ends waiting for a person (a dead letter of a step that cannot be
undone, a compensation dead-lettered or refused)."""

ENDS_COMPLETED = frozenset(
    {
        "none",
        "duplicate_reply",
        "transient_errors",
        "slow_reply",
        "participant_crash_after_commit",
        "participant_crash_before_commit",
        "compensation_slow",
        "orchestrator_crash_after_commit",
        "orchestrator_crash_after_publish",
        "relay_crash_after_publish",
    }
)
"""Faults that a correct engine absorbs: the order completes."""


def outcomes(engine: Any, kinds: Mapping[str, str], touched: Collection[str]) -> dict[str, Any]:
    """``kinds``: business key -> injected fault kind; ``touched``: saga ids an operator
    acted on (their end is the operator's, not the path's)."""
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT saga_id::text, business_key, status, "
                "extract(epoch FROM finished_at - created_at) AS took, "
                "extract(epoch FROM created_at) AS created, "
                "extract(epoch FROM finished_at) AS finished "
                "FROM saga.saga_instance WHERE business_key = ANY(:keys)"
            ),
            {"keys": list(kinds)},
        ).all()
        resent = conn.execute(
            text(
                "SELECT count(*) FROM saga.saga_history h JOIN saga.saga_instance s "
                "ON s.saga_id = h.saga_id WHERE s.business_key = ANY(:keys) "
                "AND h.event IN ('step_resent', 'compensation_resent')"
            ),
            {"keys": list(kinds)},
        ).scalar_one()
    by_path: dict[str, Counter[str]] = defaultdict(Counter)
    by_load = good_compensated = 0
    took: list[float] = []
    ended = [r for r in rows if r.status in ("COMPLETED", "COMPENSATED")]
    for r in rows:
        kind = kinds[r.business_key]
        by_path[kind][r.status] += 1
        mine = r.saga_id not in touched
        if r.status == "MANUAL_REVIEW" and kind not in PERSON_FAULTS and mine:
            by_load += 1
        if r.status == "COMPENSATED" and kind in ENDS_COMPLETED and mine:
            good_compensated += 1
        if r.status == "COMPLETED" and r.took is not None:
            took.append(float(r.took))
    # Goodput: sagas ended per second while sagas were still being offered (the
    # overload), from the first saga to end (the pipeline full) to the last start; not
    # over the tail that slow faults, outages and people stretch.
    first = min((float(r.finished) for r in ended), default=0.0)
    last = max((float(r.created) for r in rows), default=0.0)
    span = last - first
    in_window = sum(1 for r in ended if first <= float(r.finished) <= last)
    offered_for = last - min((float(r.created) for r in rows), default=0.0)
    return {
        "by_path": {k: dict(v) for k, v in sorted(by_path.items())},
        "manual_review_by_load": by_load,
        "good_orders_compensated": good_compensated,
        "resends_per_saga": round(int(resent) / max(len(rows), 1), 3),
        "completion_seconds": {"p50": _pct(took, 0.50), "p95": _pct(took, 0.95)},
        "goodput_window_seconds": round(max(span, 0.0), 1),
        "started_per_second": round(len(rows) / offered_for, 2) if offered_for > 0 else 0.0,
        "ended_per_second": round(in_window / span, 2) if span > 0 else 0.0,
    }


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)
