"""The chaos run: many order sagas, injected faults, workers SIGKILLed at random, then proof.

    saga-tasks chaos [--sagas 500] [--seconds 300] [--kill-every 3] [--json]

It makes its own RabbitMQ vhost and PostgreSQL database (unless ``--here``), starts an
orchestrator, a worker per participant queue, and two beats (one a standby), starts the
sagas with a mix of faults (crashes before and after commit in participants, in the
orchestrator and in outbox recovery; duplicate and slow replies; slow work that outlives
its timeout; declined payments; missing stock), SIGKILLs a random process every few
seconds and lets the supervisor restart it. When every saga has ended it stops killing
and checks, from the database alone:

- every saga is COMPLETED, COMPENSATED or FAILED, or in MANUAL_REVIEW with a reason;
- stock is conserved: each SKU's reserved count is what its held reservations hold, and
  only completed sagas (or sagas waiting for a person) hold any;
- no saga has a payment authorized twice, and none left authorized unless it completed;
  each customer's open total is what their open authorizations hold;
- only completed sagas have confirmed orders;
- the history explains every saga: it starts with ``saga_started`` and records how the
  saga came to its status;
- nothing is left in any outbox unpublished.

It prints what it injected and what it found (``--json``: one object whose
``violations`` lists every broken invariant) and exits 1 on any violation.
"""

from __future__ import annotations

import json
import os
import random
import sys
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import func, select, text

from saga_tasks.config import Settings
from saga_tasks.ops.processes import Supervisor, WorkerProcess, exit_on_sigterm, wait_for

TIME_SCALE = 0.2
"""Order saga timeouts in a chaos run: create 6 s, authorize 12 s, saga 120 s.

Short enough that timeouts, re-sends and late replies happen within a run; long
enough that a worker restarted after a SIGKILL (about a second) does not turn every
step in its queue into a timeout on a two-core machine.
"""

FAULTS: tuple[tuple[str, dict[str, str] | None, int], ...] = (
    ("none", None, 50),
    ("declined", None, 6),
    ("out_of_stock", None, 6),
    ("duplicate_reply", {"inventory.reserve": "duplicate_reply"}, 5),
    ("transient_errors", {"inventory.reserve": "transient:2"}, 3),
    ("slow_reply", {"payments.authorize": "slow:2"}, 5),
    ("slower_than_its_timeout", {"payments.authorize": "slow:15"}, 2),
    ("participant_crash_after_commit", {"orders.create": "crash_after_commit"}, 4),
    ("participant_crash_before_commit", {"payments.authorize": "crash_before_commit"}, 3),
    ("compensation_slow", {"inventory.release": "slow:2"}, 3),
    (
        "orchestrator_crash_after_commit",
        {"saga_tasks.reply@reserve_stock": "crash_after_commit"},
        4,
    ),
    (
        "orchestrator_crash_after_publish",
        {"saga_tasks.reply@create_order": "crash_after_publish"},
        4,
    ),
    (
        "relay_crash_after_publish",
        {"inventory.reserve": "crash_after_commit", "saga_tasks.relay": "crash_after_publish"},
        5,
    ),
)


@dataclass
class Injected:
    faults: Counter[str] = field(default_factory=Counter)
    kills: Counter[str] = field(default_factory=Counter)
    restarts: int = 0


def chaos_processes(env: dict[str, str], log_dir: Path) -> list[WorkerProcess]:
    app = "participants.app"
    specs = [
        ("orchestrator", ["saga.replies"], "prefork", 2),
        ("maintenance", ["saga.maintenance"], "solo", 1),
        ("orders", ["orders.commands"], "solo", 1),
        ("inventory", ["inventory.commands"], "solo", 1),
        ("payments", ["payments.commands"], "prefork", 4),
    ]
    processes = [
        WorkerProcess(app, queues=q, name=n, pool=p, concurrency=c, env=env, log_dir=log_dir)
        for n, q, p, c in specs
    ]
    processes += [
        WorkerProcess(app, name="beat-a", env=env, log_dir=log_dir, role="beat"),
        WorkerProcess(app, name="beat-b", env=env, log_dir=log_dir, role="beat"),
    ]
    return processes


def payload_for(kind: str, faults: dict[str, str] | None, rng: random.Random) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "customer_id": f"c-{rng.randint(1, 20)}",
        "items": [{"sku": f"sku-{rng.randint(1, 10)}", "qty": rng.randint(1, 3)}],
        "amount_cents": rng.randint(500, 20_000),
    }
    if kind == "declined":
        payload["customer_id"], payload["amount_cents"] = "c-low", 5_000
    elif kind == "out_of_stock":
        payload["items"] = [{"sku": "sku-empty", "qty": 1}]
    if faults:
        payload["demo_faults"] = dict(faults)
    return payload


OBSERVED_EVENTS = (
    "step_resent",
    "step_given_up",
    "compensation_resent",
    "late_reply",
    "duplicate_reply",
    "duplicate_message",
    "conflicting_reply",
    "invalid_message",
    "manual_review",
    "demo_fault",
)


def observed(engine: Any) -> dict[str, int]:
    """What the history and the outboxes show happened: re-sends, late and duplicate replies."""
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT event, count(*) FROM saga.saga_history WHERE event = ANY(:e) GROUP BY 1"),
            {"e": list(OBSERVED_EVENTS)},
        )
        found = dict.fromkeys(OBSERVED_EVENTS, 0) | {r[0]: r[1] for r in rows}
        found["held_dead_letters"] = int(
            conn.execute(
                text("SELECT count(*) FROM saga.held_message WHERE holding = 'dead_letter'")
            ).scalar_one()
        )
        found["held_parked"] = int(
            conn.execute(
                text("SELECT count(*) FROM saga.held_message WHERE holding = 'parking'")
            ).scalar_one()
        )
        found["outbox_rows_recovered"] = sum(
            int(conn.execute(text(f"SELECT count(*) FROM {s}.outbox WHERE recovered")).scalar_one())  # noqa: S608
            for s in ("saga", "orders", "inventory", "payments")
        )
    return found


def check_invariants(engine: Any) -> tuple[list[str], dict[str, int]]:
    """Every broken invariant as one line, and the final status counts."""
    violations: list[str] = []
    with engine.connect() as conn:

        def q(sql: str) -> list[Any]:
            return list(conn.execute(text(sql)))

        statuses = {
            r[0]: r[1] for r in q("SELECT status, count(*) FROM saga.saga_instance GROUP BY 1")
        }
        for saga_id, status in q(
            "SELECT saga_id, status FROM saga.saga_instance WHERE status IN ('RUNNING', 'COMPENSATING')"
        ):
            violations.append(f"saga {saga_id} is still {status}")
        for (saga_id,) in q(
            "SELECT saga_id FROM saga.saga_instance WHERE status = 'MANUAL_REVIEW' "
            "AND coalesce(status_reason, '') = ''"
        ):
            violations.append(f"saga {saga_id} is in MANUAL_REVIEW without a reason")
        # Stock: reserved counts match held reservations, held only by completed sagas.
        for sku, reserved, held in q(
            """SELECT s.sku, s.reserved, coalesce(sum((i->>'qty')::int), 0)
               FROM inventory.stock s
               LEFT JOIN inventory.reservation r ON r.status = 'RESERVED'
               LEFT JOIN LATERAL jsonb_array_elements(r.items) i ON i->>'sku' = s.sku
               GROUP BY s.sku, s.reserved HAVING s.reserved <> coalesce(sum((i->>'qty')::int), 0)"""
        ):
            violations.append(f"stock of {sku}: {reserved} reserved, reservations hold {held}")
        for saga_id, status in q(
            """SELECT r.saga_id, s.status FROM inventory.reservation r
               JOIN saga.saga_instance s USING (saga_id)
               WHERE r.status = 'RESERVED' AND s.status NOT IN ('COMPLETED', 'MANUAL_REVIEW')"""
        ):
            violations.append(f"saga {saga_id} is {status} but still holds stock")
        for saga_id, n in q(
            """SELECT saga_id, count(*) FROM payments.authorization WHERE status = 'AUTHORIZED'
               GROUP BY saga_id HAVING count(*) > 1"""
        ):
            violations.append(f"saga {saga_id} has {n} payments authorized")
        for customer_id, total, held in q(
            """SELECT c.customer_id, c.authorized_cents, coalesce(sum(a.amount_cents), 0)
               FROM payments.customer c
               LEFT JOIN payments.authorization a
                 ON a.customer_id = c.customer_id AND a.status = 'AUTHORIZED'
               GROUP BY c.customer_id, c.authorized_cents
               HAVING c.authorized_cents <> coalesce(sum(a.amount_cents), 0)"""
        ):
            violations.append(
                f"customer {customer_id}: {total} cents authorized, open authorizations hold {held}"
            )
        for saga_id, status in q(
            """SELECT a.saga_id, s.status FROM payments.authorization a
               JOIN saga.saga_instance s USING (saga_id)
               WHERE a.status = 'AUTHORIZED' AND s.status NOT IN ('COMPLETED', 'MANUAL_REVIEW')"""
        ):
            violations.append(f"saga {saga_id} is {status} but its payment is still authorized")
        for saga_id, status in q(
            """SELECT o.saga_id, s.status FROM orders.orders o JOIN saga.saga_instance s USING (saga_id)
               WHERE o.status = 'CONFIRMED' AND s.status NOT IN ('COMPLETED', 'MANUAL_REVIEW')"""
        ):
            violations.append(f"saga {saga_id} is {status} but its order is confirmed")
        # History explains every saga.
        final_event = {
            "COMPLETED": "saga_completed",
            "COMPENSATED": "saga_compensated",
            "MANUAL_REVIEW": "manual_review",
        }
        for saga_id, status, first, events in q(
            """SELECT s.saga_id, s.status,
                      (SELECT event FROM saga.saga_history h WHERE h.saga_id = s.saga_id ORDER BY id LIMIT 1),
                      (SELECT array_agg(DISTINCT event) FROM saga.saga_history h WHERE h.saga_id = s.saga_id)
               FROM saga.saga_instance s"""
        ):
            if first != "saga_started":
                violations.append(f"saga {saga_id}: history does not start with saga_started")
            wanted = final_event.get(status)
            if wanted and wanted not in (events or []):
                violations.append(f"saga {saga_id} is {status} but its history has no {wanted}")
        for schema in ("saga", "orders", "inventory", "payments"):
            (left,) = conn.execute(
                text(f"SELECT count(*) FROM {schema}.outbox WHERE published_at IS NULL")  # noqa: S608
            ).one()
            if left:
                violations.append(f"{left} messages never published from {schema}.outbox")
    return violations, statuses


def run(args: Any) -> int:
    from saga_tasks.ops.isolation import Isolation
    from saga_tasks.ops.services import upgrade

    base = Settings.from_env()
    isolation = (
        None
        if args.here
        else Isolation(admin_database_url=_admin_url(base.database_url), prefix=args.prefix)
    )
    with exit_on_sigterm():
        if isolation is not None:
            isolation.__enter__()
        try:
            database_url = isolation.database_url if isolation else base.database_url
            broker_url = isolation.broker_url if isolation else base.broker_url
            return _run(args, database_url, broker_url, upgrade)
        finally:
            if isolation is not None and not args.keep:
                isolation.__exit__(None, None, None)


def _admin_url(database_url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(database_url).set(database="postgres").render_as_string(hide_password=False)


def _run(args: Any, database_url: str, broker_url: str, upgrade: Any) -> int:
    os.environ.update(
        {
            "SAGA_DATABASE_URL": database_url,
            "SAGA_BROKER_URL": broker_url,
            "SAGA_TASKS_DEMO_FAULTS": "1",
            "ORDER_SAGA_TIME_SCALE": str(TIME_SCALE),
            "SAGA_SWEEP_INTERVAL": "0.5",
            "SAGA_RELAY_INTERVAL": "0.5",
            "SAGA_RELAY_MIN_AGE": "1",
            "SAGA_BEAT_LOCK_TIMEOUT": "3",
            "SAGA_TASKS_APP": "participants.app:saga_app",
        }
    )
    upgrade(database_url)
    from participants.app import saga_app
    from participants.seed import seed
    from saga_tasks.messaging.topology import declare_topology

    def say(line: str) -> None:
        if not args.json:
            print(line, flush=True)

    declare_topology(broker_url, saga_app.topology)
    seed(saga_app.engine)
    log_dir = Path(args.log_dir)
    injected = Injected()

    def restarted(process: WorkerProcess) -> None:
        injected.restarts += 1

    supervisor = Supervisor(chaos_processes(dict(os.environ), log_dir), on_restart=restarted)
    say(f"chaos: {args.sagas} sagas, a process killed every {args.kill_every}s, logs in {log_dir}/")
    supervisor.start()
    rng = random.Random(args.seed)  # noqa: S311 - a reproducible run, not a secret
    stop_killing = threading.Event()

    def killer() -> None:
        while not stop_killing.wait(args.kill_every):
            victim = rng.choice(supervisor.processes)
            if victim.alive():
                injected.kills[victim.name] += 1
                supervisor.kill(victim)

    killing = threading.Thread(target=killer, daemon=True, name="killer")
    started_at = time.monotonic()
    deadline = started_at + args.seconds
    try:
        killing.start()
        weights = [w for _, _, w in FAULTS]
        for i in range(args.sagas):
            kind, faults, _ = rng.choices(FAULTS, weights)[0]
            injected.faults[kind] += 1
            _start_with_retry(saga_app, f"chaos-{i:05d}", payload_for(kind, faults, rng))
            time.sleep(args.interval)
        say(
            f"all {args.sagas} started in {time.monotonic() - started_at:.1f}s; waiting for them to end"
        )

        def active() -> int:
            with saga_app.engine.connect() as conn:
                return int(
                    conn.execute(
                        text(
                            "SELECT count(*) FROM saga.saga_instance WHERE status IN ('RUNNING','COMPENSATING')"
                        )
                    ).scalar_one()
                )

        while active() and time.monotonic() < deadline:
            time.sleep(1)
        stop_killing.set()
        killing.join()
        # Settle: no more kills; let recovery, sweeps and late replies finish.
        try:
            wait_for(
                lambda: active() == 0 and _unpublished(saga_app) == 0, timeout=90, interval=0.5
            )
            time.sleep(3 * 0.5 + 1)  # one more sweep and recovery pass for stragglers
        except AssertionError:
            pass
    finally:
        stop_killing.set()
        supervisor.stop()
        from saga_tasks.tasks import forget_beat_state

        forget_beat_state(saga_app.settings)
    violations, statuses = check_invariants(saga_app.engine)
    elapsed = time.monotonic() - started_at
    report = {
        "sagas": args.sagas,
        "seconds": round(elapsed, 1),
        "injected": {
            "faults": dict(injected.faults),
            "kills": dict(injected.kills),
            "restarts": injected.restarts,
        },
        "found": {"statuses": statuses, "events": observed(saga_app.engine)},
        "violations": violations,
    }
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True))
    else:
        _print_report(report)
    saga_app.close()
    from saga_tasks.persistence.db import dispose_all

    dispose_all()
    return 1 if violations else 0


def _start_with_retry(app: Any, key: str, payload: dict[str, Any]) -> None:
    from saga_tasks.errors import ServiceUnavailable

    for attempt in range(5):
        try:
            app.start_saga("order", key, payload)
            return
        except ServiceUnavailable:
            time.sleep(0.5 * (attempt + 1))
    app.start_saga("order", key, payload)


def _unpublished(app: Any) -> int:
    with app.engine.connect() as conn:
        return sum(
            int(conn.execute(select(func.count()).where(t.c.published_at.is_(None))).scalar_one())
            for t in app.outbox_tables()
        )


def _print_report(report: dict[str, Any]) -> None:
    print(f"\ninjected faults ({report['sagas']} sagas)")
    for kind, n in sorted(report["injected"]["faults"].items()):
        print(f"  {kind:<34} {n:>5}")
    print("SIGKILLs")
    for name, n in sorted(report["injected"]["kills"].items()):
        print(f"  {name:<34} {n:>5}")
    print(f"  {'restarts by the supervisor':<34} {report['injected']['restarts']:>5}")
    print("found")
    for status, n in sorted(report["found"]["statuses"].items()):
        print(f"  {status:<34} {n:>5}")
    for event, n in report["found"]["events"].items():
        print(f"  {event:<34} {n:>5}")
    if report["violations"]:
        print(f"\n{len(report['violations'])} VIOLATIONS")
        for line in report["violations"][:50]:
            print(f"  {line}")
    else:
        print(f"\nno invariant broken ({report['seconds']}s)")


def add_arguments(parser: Any) -> None:
    parser.add_argument("--sagas", type=int, default=500)
    parser.add_argument("--seconds", type=float, default=300.0, help="budget for the sagas to end")
    parser.add_argument("--kill-every", type=float, default=3.0, help="seconds between SIGKILLs")
    parser.add_argument("--interval", type=float, default=0.08, help="seconds between starts")
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--here", action="store_true", help="use SAGA_DATABASE_URL and SAGA_BROKER_URL"
    )
    parser.add_argument("--keep", action="store_true", help="keep the chaos vhost and database")
    parser.add_argument("--log-dir", default=".chaos/logs")
    parser.add_argument(
        "--prefix", default="saga_chaos_", help="name prefix of its vhost and database"
    )


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="saga-tasks chaos", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
