"""What a chaos run prints: the events the history and the outboxes show, and the table."""

from __future__ import annotations

from collections import Counter
from typing import Any

from sqlalchemy import text

OBSERVED_EVENTS = (
    "step_resent",
    "resend_deferred",
    "dispatch_waiting",
    "deadline_from_dispatch",
    "step_overdue",
    "compensation_overdue",
    "step_given_up",
    "compensation_resent",
    "late_reply",
    "duplicate_reply",
    "duplicate_message",
    "conflicting_reply",
    "invalid_message",
    "dead_lettered",
    "manual_review",
    "saga_resumed",
    "demo_fault",
)


PARTICIPANT_SCHEMAS = ("orders", "inventory", "payments")
"""The example's participants, each with its outbox in a database of its own."""


def observed(engine: Any, engine_of: Any) -> dict[str, int]:
    """What the history and the outboxes show happened: re-sends, late and duplicate replies."""
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT event, count(*) FROM saga.saga_history WHERE event = ANY(:e) GROUP BY 1"),
            {"e": list(OBSERVED_EVENTS)},
        )
        found = dict.fromkeys(OBSERVED_EVENTS, 0) | {r[0]: r[1] for r in rows}
        for holding, status, n in conn.execute(
            text("SELECT holding, status, count(*) FROM saga.held_message GROUP BY 1, 2")
        ):
            found[f"held_{holding}_{status}"] = int(n)
    found["outbox_rows_recovered"] = 0
    for schema, db in [("saga", engine), *((s, engine_of(s)) for s in PARTICIPANT_SCHEMAS)]:
        with db.connect() as conn:
            sql = f"SELECT count(*) FROM {schema}.outbox WHERE recovered"  # noqa: S608
            found["outbox_rows_recovered"] += int(conn.execute(text(sql)).scalar_one())
    return found


def review_reasons(engine: Any) -> dict[str, int]:
    """Why the sagas that wait for a person wait, their reasons' first words grouped."""
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT status_reason, count(*) FROM saga.saga_instance "
                "WHERE status = 'MANUAL_REVIEW' GROUP BY 1"
            )
        )
        reasons: Counter[str] = Counter()
        for reason, n in rows:
            reasons[_reason_kind(reason or "")] += int(n)
    return dict(reasons.most_common())


def _reason_kind(reason: str) -> str:
    """A reason without its ids and numbers, so that like reasons count together."""
    words = [w for w in reason.split() if not any(c.isdigit() for c in w)]
    return " ".join(words)[:90]


def report_text(report: dict[str, Any]) -> str:
    """The report as the table a person reads."""
    out: list[str] = []
    say = out.append
    injected = report["injected"]
    say(f"\ninjected faults ({report['sagas']} sagas, {report['queue_type']} queues)")
    for kind, n in sorted(injected["faults"].items()):
        say(f"  {kind:<34} {n:>5}")
    say("SIGKILLs")
    for name, n in sorted(injected["kills"].items()):
        say(f"  {name:<34} {n:>5}")
    say(f"  {'restarts by the supervisor':<34} {injected['restarts']:>5}")
    say("outages")
    for o in injected["outages"]:
        waited = f" (waited {o['waited']}s for the guard)" if o["waited"] else ""
        say(
            f"  {o['kind']:<10} down at {o['stopped_at']}s, back at {o['back_at']}s{waited}"
            + (f"  ERROR {o['error']}" if o["error"] else "")
        )
    op = injected["operator"]
    say(f"operator actions ({op['attempts']} tried, {op['done']} accepted)")
    for what, n in op["by_outcome"].items():
        say(f"  {what:<34} {n:>5}")
    for line in op["errors"][:20]:
        say(f"  error: {line}")
    say("found")
    for status, n in sorted(report["found"]["statuses"].items()):
        say(f"  {status:<34} {n:>5}")
    for reason, n in report["found"]["manual_review_reasons"].items():
        say(f"    {n:>5}  {reason}")
    for event, n in report["found"]["events"].items():
        say(f"  {event:<34} {n:>5}")
    for key, value in report["found"]["monitor"].items():
        say(f"  monitor {key:<26} {value:>5}")
    paths, load = report["paths"], report["load"]
    say("paths")
    say(f"  {'good orders compensated':<34} {paths['good_orders_compensated']:>5}")
    say(f"  {'manual review by load':<34} {paths['manual_review_by_load']:>5}")
    say(f"  {'re-sends per saga':<34} {paths['resends_per_saga']:>5}")
    latency = paths["completion_seconds"]
    say(f"  {'completion p50 / p95 (s)':<34} {latency['p50']} / {latency['p95']}")
    say(f"  {'ended per second':<34} {paths['ended_per_second']:>5}")
    if "capacity_per_second" in load:
        say(
            f"  load: offered {load['offered_per_second']}/s = {load['overload']} x the "
            f"warm-up's {load['capacity_per_second']}/s; goodput {load['goodput_ratio']} of it"
        )
        say(
            f"  admission: at most {load['max_active']} active; "
            f"{load['starts_refused']} starts refused and tried again"
        )
    for line in report["harness_errors"]:
        say(f"HARNESS ERROR {line}")
    if report["violations"]:
        say(f"\n{len(report['violations'])} VIOLATIONS")
        for line in report["violations"][:50]:
            say(f"  {line}")
        for saga_id, lines in report["evidence"].items():
            say(f"\nsaga {saga_id}")
            for line in lines:
                say(f"  {line}")
    else:
        say(f"\nno invariant broken ({report['seconds']}s)")
    return "\n".join(out)
