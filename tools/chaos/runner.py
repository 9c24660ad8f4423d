"""The chaos run: many order sagas, injected faults, processes SIGKILLed, RabbitMQ and
PostgreSQL restarted, an operator acting at random, then proof.

    saga-tasks chaos [--sagas 500] [--seconds 300] [--kill-every 3] [--json] [--overload F]
                     [--broker-restarts 1] [--db-restarts 1] [--outage 3]
                     [--operator-every 2] [--queue-type classic|quorum]

It makes its own RabbitMQ vhost and PostgreSQL database (unless ``--here``), starts an
orchestrator, a worker per participant queue, two maintenance workers and two beats (one
a standby), and starts the sagas with a mix of faults (crashes before and after commit
in participants, in the orchestrator and in outbox recovery; duplicate and slow replies;
slow work that outlives its timeout; declined payments; missing stock; commands and
compensations that fail until they are dead-lettered; a compensation refused until a
person retries it; a poison message). While they run:

- a random process is SIGKILLed every few seconds and the supervisor restarts it;
- RabbitMQ is stopped and started again (``--broker-restarts``), and so is PostgreSQL
  (``--db-restarts``), each down for ``--outage`` seconds: every worker, beat and
  publisher loses its connections and must find its way back (``services``);
- an operator acts at random (``--operator-every``): retry-step, skip-step, compensate,
  and replays of held messages, some forced, through the functions the CLI calls
  (``operator``);
- a monitor samples the database for active sagas with nothing in flight and no
  future wake-up, and for sagas the sweeper claims without progress (``monitor``).

With ``--overload F`` it first measures the machine's capacity this hour (``--warmup``
plain orders at once, before any chaos), then offers F times that rate. Either way the
report says how each saga ended against its fault's path (``paths``): good orders
compensated, sagas in review for no fault that needs a person (``manual_review_by_load``),
re-sends per saga, completion latency, sagas ended per second (goodput).

When every saga has ended (or waits for a person), and every planned restart is done,
it stops the chaos, lets the queues drain, and checks from the database that no
invariant broke and nothing published was lost (``checks``). It prints what it
injected and what it found (``--json``: one object whose ``violations`` lists every
broken invariant) and exits 1 on any violation.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, func, select, text
from sqlalchemy.pool import NullPool

from saga_tasks.config import Settings
from saga_tasks.ops.broker_users import read_env
from saga_tasks.ops.processes import (
    Supervisor,
    WorkerProcess,
    exit_on_sigterm,
    service_env,
    wait_for,
)
from tools.capacity import measure
from tools.chaos.checks import (
    PARTICIPANTS,
    check_invariants,
    evidence,
    lost_messages,
    operator_accounting,
    saga_ids_in,
)
from tools.chaos.monitor import Monitor
from tools.chaos.operator import RandomOperator
from tools.chaos.paths import outcomes
from tools.chaos.report import observed, report_text, review_reasons
from tools.chaos.services import OutageRunner, ServiceControl, plan_outages

__all__ = ["FAULTS", "check_invariants", "main", "run"]

TIME_SCALE = 0.5
"""Order saga timeouts in a chaos run: create 15 s, authorize 30 s, saga 300 s.

Short enough that timeouts, re-sends and late replies happen within a run; long enough
that the backlog a broker or database restart leaves (every saga started while it was
away waits) drains before its steps time out, on a two-core machine shared with other
work. With 0.2 (steps 6-12 s) the run is harsher on time: after a restart, steps time
out in numbers, their re-sends and the duplicates they cause load the workers further,
and many sagas end waiting for a person for want of an answer in time.
"""

SWEEP_INTERVAL = 0.5
RETRY_TIERS = "1,2,3"
"""Retry queue delays of a chaos run's own vhost: a command that fails on every try is
dead-lettered within its step's timeout, so the dead letter, not a re-send, decides."""

FAULTS: tuple[tuple[str, dict[str, str] | None, int], ...] = (
    ("none", None, 50),
    ("declined", None, 6),
    ("out_of_stock", None, 6),
    ("duplicate_reply", {"inventory.reserve": "duplicate_reply"}, 5),
    ("transient_errors", {"inventory.reserve": "transient:2"}, 3),
    ("slow_reply", {"payments.authorize": "slow:2"}, 5),
    ("slower_than_its_timeout", {"payments.authorize": "slow:15"}, 1),
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
    # Kills a maintenance worker (solo: ~5 s to come back) each time: rarer than the rest,
    # or recovery would do nothing but restart, and no sweep would run meanwhile.
    (
        "relay_crash_after_publish",
        {"inventory.reserve": "crash_after_commit", "saga_tasks.relay": "crash_after_publish"},
        1,
    ),
    # A step that cannot be undone, dead-lettered: the saga waits for a person.
    ("confirm_dead_lettered", {"orders.confirm": "raise"}, 2),
    # A refused payment whose stock release is dead-lettered: a person again.
    ("compensation_dead_lettered", {"inventory.release": "raise"}, 2),
    # A refused payment whose stock release is refused too, until a person retries it.
    ("compensation_refused", {"inventory.release": "refuse"}, 2),
    ("poison_command", {"payments.authorize": "poison"}, 1),
)


@dataclass
class Injected:
    faults: Counter[str] = field(default_factory=Counter)
    kills: Counter[str] = field(default_factory=Counter)
    restarts: int = 0


def chaos_processes(
    env: dict[str, str], log_dir: Path, users: Path | None = None
) -> list[WorkerProcess]:
    """The run's processes; with ``users`` (env files of ``saga-tasks broker users``) each
    as its service's own broker user, and each participant's worker given its own
    database only."""
    app = "participants.app"
    # A crash fault kills the process that runs the message. In a solo worker that is the
    # whole worker, back after a restart of ~5 s on two cores; with a crash fault in one
    # saga out of ~25 at 12 sagas/s, a solo worker would do nothing but restart. So the
    # participants run prefork (a crash costs a pool child), and beat's tasks (sweeps,
    # recovery and intake share one queue) have two solo workers: recovery killed by its
    # fault does not stop every sweep while its worker restarts. The killer's SIGKILLs
    # still take down whole workers, solo and prefork alike. Replies have two consumers:
    # a prefork one (each reply a task) and a solo one that applies them in batches (group
    # commit), whose crash faults kill it right after a batch's commit, so the other
    # receives the batch's replies again (duplicates) while it restarts.
    specs = [
        ("orchestrator", ["saga.replies"], "prefork", 2),
        ("orchestrator-batches", ["saga.replies"], "solo", 1),
        ("maintenance-a", ["saga.maintenance"], "solo", 1),
        ("maintenance-b", ["saga.maintenance"], "solo", 1),
        ("orders", ["orders.commands"], "prefork", 2),
        ("inventory", ["inventory.commands"], "prefork", 2),
        # Slow faults hold a payments child for the whole wait (and a re-send of a slow
        # command another, waiting on its ledger row): room for them and for the rest.
        ("payments", ["payments.commands"], "prefork", 8),
    ]

    def own(queues: list[str]) -> dict[str, str]:
        participant = queues[0].removesuffix(".commands")
        return service_env(env, "orchestrator" if participant == queues[0] else participant, users)

    processes = [
        WorkerProcess(app, queues=q, name=n, pool=p, concurrency=c, env=own(q), log_dir=log_dir)
        for n, q, p, c in specs
    ]
    beat_env = service_env(env, "orchestrator", users)
    processes += [
        WorkerProcess(app, name="beat-a", env=beat_env, log_dir=log_dir, role="beat"),
        WorkerProcess(app, name="beat-b", env=beat_env, log_dir=log_dir, role="beat"),
    ]
    return processes


def payload_for(
    kind: str, faults: dict[str, str] | None, rng: random.Random, time_scale: float = TIME_SCALE
) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "customer_id": f"c-{rng.randint(1, 20)}",
        "items": [{"sku": f"sku-{rng.randint(1, 10)}", "qty": rng.randint(1, 3)}],
        "amount_cents": rng.randint(500, 20_000),
    }
    if kind in ("declined", "compensation_dead_lettered", "compensation_refused"):
        payload["customer_id"], payload["amount_cents"] = "c-low", 5_000
    elif kind == "out_of_stock":
        payload["items"] = [{"sku": "sku-empty", "qty": 1}]
    if faults:
        payload["demo_faults"] = dict(faults)
        if kind == "slower_than_its_timeout":  # the payment's timeout is 60 s, scaled
            payload["demo_faults"]["payments.authorize"] = f"slow:{60 * time_scale + 3:g}"
    return payload


def run(args: Any) -> int:
    from saga_tasks.ops.isolation import Isolation

    base = Settings.from_env()
    isolation = (
        None
        if args.here
        else Isolation(
            admin_database_url=_admin_url(base.database_url),
            prefix=args.prefix,
            participants=tuple(p.name for p in PARTICIPANTS),  # a database each
        )
    )
    with exit_on_sigterm():
        if isolation is not None:
            isolation.__enter__()
        try:
            database_url = isolation.database_url if isolation else base.database_url
            broker_url = isolation.broker_url if isolation else base.broker_url
            participant_url = (
                isolation.participant_database_url if isolation else base.participant_database_url
            )
            return _run(args, database_url, participant_url, broker_url, isolation)
        finally:
            if isolation is not None and not args.keep:
                _forget_users(f"{isolation.ident}-")
                isolation.__exit__(None, None, None)


def _forget_users(prefix: str) -> None:
    from saga_tasks.messaging.admin import RabbitAdmin

    admin = RabbitAdmin()
    for user in admin.users(prefix):
        admin.delete_user(user)


def _service_users(env_dir: Path) -> Path:
    """As the administrator: declare the topology, then a broker user per service (their
    env files in ``env_dir``); the app is loaded by each command, not here."""
    for command in (["broker", "declare"], ["broker", "users", "--env-dir", str(env_dir)]):
        done = subprocess.run(
            [sys.executable, "-m", "saga_tasks.ops.cli", *command],
            env=dict(os.environ),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if done.returncode != 0:
            raise SystemExit(f"saga-tasks {' '.join(command)} failed: {done.stderr.strip()}")
    return env_dir


def _admin_url(database_url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(database_url).set(database="postgres").render_as_string(hide_password=False)


def _settings_env(
    args: Any, database_url: str, participant_url: str, broker_url: str
) -> dict[str, str]:
    env = {
        "SAGA_DATABASE_URL": database_url,
        "SAGA_PARTICIPANT_DATABASE_URL": participant_url,
        "SAGA_BROKER_URL": broker_url,
        "SAGA_TASKS_DEMO_FAULTS": "1",
        "ORDER_SAGA_TIME_SCALE": str(args.time_scale),
        "SAGA_SWEEP_INTERVAL": str(SWEEP_INTERVAL),
        "SAGA_RELAY_INTERVAL": "0.5",
        "SAGA_RELAY_MIN_AGE": "1",
        "SAGA_INTAKE_INTERVAL": "0.5",
        "SAGA_BEAT_LOCK_TIMEOUT": "3",
        "SAGA_TASKS_APP": "participants.app:saga_app",
    }
    if not args.here:  # queue arguments are fixed once declared: only in a vhost of our own
        env["SAGA_RETRY_TIERS"] = RETRY_TIERS
        env["SAGA_QUEUE_TYPE"] = args.queue_type or "classic"
    elif args.queue_type:
        env["SAGA_QUEUE_TYPE"] = args.queue_type
    return env


def _run(
    args: Any, database_url: str, participant_url: str, broker_url: str, isolation: Any
) -> int:
    os.environ.update(_settings_env(args, database_url, participant_url, broker_url))
    users = None
    if isolation is not None:
        # In a vhost of its own the run deploys as production would: the topology and a
        # broker user per service made by an administrator; no worker runs as it.
        os.environ["SAGA_BROKER_USER_PREFIX"] = f"{isolation.ident}-"
        users = _service_users(Path(args.log_dir) / "broker")
        os.environ.update(read_env(users, "orchestrator"))  # this process starts sagas
    from participants.app import saga_app
    from participants.seed import seed
    from saga_tasks.messaging.topology import declare_topology
    from saga_tasks.ops.services import upgrade_all

    upgrade_all(saga_app, saga_app.settings)  # the saga database, then each participant's

    started_at = time.monotonic()

    def say(line: str) -> None:
        if not args.json:
            print(f"{time.monotonic() - started_at:7.1f}s  {line}", flush=True)

    declare_topology(broker_url, saga_app.topology)  # as the administrator (idempotent)
    seed(saga_app.participant_engine, *_stock_and_credit(args.sagas))
    # The run's own reads: a fresh connection each, so a database restart costs one try.
    probe = _probe(database_url)
    probes = {p.name: _probe(saga_app.settings.participant_database(p.name)) for p in PARTICIPANTS}
    probe_of = probes.__getitem__
    log_dir = Path(args.log_dir)
    injected = Injected()

    def restarted(process: WorkerProcess) -> None:
        injected.restarts += 1

    supervisor = Supervisor(chaos_processes(dict(os.environ), log_dir, users), on_restart=restarted)
    supervisor.start()
    keys = f"chaos-{uuid.uuid4().hex[:6]}-"  # a run's own business keys, also with --here
    capacity: float | None = None
    interval = args.interval
    if args.overload > 0:
        # Before any chaos: the rate this machine sustains this hour, then F times it.
        say(f"warm-up: {args.warmup} plain orders at once, to measure this hour's capacity")
        capacity = measure(
            saga_app, f"{keys}warm-", args.warmup, lambda r: payload_for("none", None, r)
        )
        say(f"warm-up: {capacity:.1f} sagas/s")
        if args.admit_seconds > 0:
            # Admission control as a deployment under overload would run it: at most
            # about admit_seconds of work active; a refused start is tried again later.
            admitted = max(1, round(capacity * args.admit_seconds))
            saga_app.admission.max_active["order"] = admitted
            say(f"admission control: at most {admitted} order sagas active")
        interval = 1.0 / (args.overload * capacity)
    load_seconds = args.sagas * interval
    plan = plan_outages(
        broker_restarts=args.broker_restarts,
        database_restarts=args.db_restarts,
        load_seconds=load_seconds,
        down_for=args.outage,
        gap=args.restart_gap,
    )
    say(
        f"chaos: {args.sagas} sagas over {load_seconds:.0f}s, a process killed every "
        f"{args.kill_every}s, outages {[f'{o.kind}@{o.at:.0f}s' for o in plan]}, an operator "
        f"every {args.operator_every}s, {os.environ.get('SAGA_QUEUE_TYPE', 'classic')} queues, "
        f"logs in {log_dir}/"
        + (
            f"; offered {1 / interval:.1f} sagas/s, {args.overload:g} x the "
            f"{capacity:.1f}/s sustained in the warm-up"
            if capacity
            else ""
        )
    )
    started_at = time.monotonic()
    rng = random.Random(args.seed)  # noqa: S311 - a reproducible run, not a secret
    kinds: dict[str, str] = {}
    refusals = 0
    capacities: tuple[float, ...] = ()
    outages = OutageRunner(
        ServiceControl(broker_url, database_url, broker_mode=args.broker_restart_mode),
        plan,
        started_at,
        on_event=say,
        guard=args.outage_guard,
    )
    monitor = Monitor(
        database_url,
        started_at,
        interval=args.sample_every,
        overdue_after=args.overdue_after,
        outages=outages.windows,
    )
    operator = RandomOperator(
        saga_app,
        database_url,
        random.Random(args.seed + 1),  # noqa: S311 - reproducible
        args.operator_every,
        started_at,
        force_ratio=args.force_ratio,
        keys=keys,
    )
    stop_killing = threading.Event()

    def killer() -> None:
        while not stop_killing.wait(args.kill_every):
            victim = rng.choice(supervisor.processes)
            if victim.alive():
                injected.kills[victim.name] += 1
                supervisor.kill(victim)

    killing = threading.Thread(target=killer, daemon=True, name="killer")
    queues_left: dict[str, int] = {}
    try:
        monitor.start()
        outages.start()
        if args.kill_every > 0:
            killing.start()
        if args.operator_every > 0:
            operator.start()
        mix = FAULTS[:1] if args.no_faults else FAULTS  # "none" only: plain orders
        weights = [w for _, _, w in mix]
        # Starts on a schedule, by several threads (as an application's many requests):
        # one thread alone could not offer more than one start's latency allows.
        with ThreadPoolExecutor(args.starters, thread_name_prefix="starter") as starters:
            pending = []
            offered_from = time.monotonic()
            for i in range(args.sagas):
                kind, faults, _ = rng.choices(mix, weights)[0]
                injected.faults[kind] += 1
                kinds[f"{keys}{i:05d}"] = kind
                payload = payload_for(kind, faults, rng, args.time_scale)
                pending.append(
                    starters.submit(_start_with_retry, saga_app, f"{keys}{i:05d}", payload)
                )
                delay = offered_from + (i + 1) * interval - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
            refusals = sum(f.result() for f in pending)
        say(f"all {args.sagas} started; waiting for them to end")

        def waiting() -> int:
            """Active sagas the run still waits for: those the monitor flagged are done."""
            return len(_retrying(lambda: _active_ids(probe)) - monitor.flagged())

        deadline = time.monotonic() + args.seconds
        while (waiting() or not outages.done()) and time.monotonic() < deadline:
            time.sleep(1)
        say("stopping the chaos; settling")
        stop_killing.set()
        operator.stop()
        outages.stop()
        if killing.is_alive():
            killing.join()
        # Settle: no more kills; let recovery, sweeps, late replies and the intake finish.
        with contextlib.suppress(AssertionError):
            wait_for(
                lambda: (
                    waiting() == 0
                    and _retrying(lambda: _unpublished(probe, probe_of, saga_app)) == 0
                ),
                timeout=90,
                interval=0.5,
            )
        queues_left = _drain(broker_url, saga_app)
        if capacity:
            # The machine's speed drifts within minutes: measure again, and compare
            # the goodput with the mean of before and after.
            after = measure(
                saga_app, f"{keys}cool-", args.warmup, lambda r: payload_for("none", None, r)
            )
            say(f"cool-down: {after:.1f} sagas/s (warm-up {capacity:.1f})")
            capacities = (capacity, after)
    finally:
        stop_killing.set()
        operator.stop()
        outages.stop()
        monitor.stop()
        supervisor.stop()
        from saga_tasks.messaging.celery_config import forget_beat_state

        forget_beat_state(saga_app.settings)
    say("checking")
    violations, statuses = check_invariants(probe, probe_of)
    violations += monitor.violations()
    violations += lost_messages(probe, probe_of)
    violations += operator_accounting(probe, operator.done)
    violations += [f"{n} messages left in queue {q}" for q, n in queues_left.items() if n]
    harness_errors = outages.errors()
    elapsed = time.monotonic() - started_at
    paths = outcomes(probe, kinds, {d.saga_id for d in operator.done})
    load: dict[str, Any] = {
        "offered_per_second": round(1 / interval, 2),
        "starts_refused": refusals,
    }
    if capacity:
        mean = sum(capacities or (capacity,)) / len(capacities or (capacity,))
        load |= {
            "overload": args.overload,
            "warmup_sagas": args.warmup,
            "capacity_per_second": round(mean, 2),
            "capacity_before_after": [round(c, 2) for c in capacities or (capacity,)],
            "max_active": saga_app.admission.max_active.get("order", 0),
            "goodput_ratio": round(paths["ended_per_second"] / mean, 2),
        }
    report = {
        "sagas": args.sagas,
        "seconds": round(elapsed, 1),
        "queue_type": os.environ.get("SAGA_QUEUE_TYPE", "classic"),
        "time_scale": args.time_scale,
        "injected": {
            "faults": dict(injected.faults),
            "kills": dict(injected.kills),
            "restarts": injected.restarts,
            "outages": [o.report() for o in plan],
            "operator": operator.report(),
        },
        "found": {
            "statuses": statuses,
            "manual_review_reasons": review_reasons(probe),
            "events": observed(probe, probe_of),
            "monitor": monitor.report(),
        },
        "paths": paths,
        "manual_review_by_load": paths["manual_review_by_load"],
        "load": load,
        "violations": violations,
        "evidence": evidence(probe, saga_ids_in(violations)),
        "harness_errors": harness_errors,
    }
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True))
    else:
        print(report_text(report))
    for engine in (probe, *probes.values()):
        engine.dispose()
    saga_app.close()
    from saga_tasks.persistence.db import dispose_all

    dispose_all()
    return 1 if violations or harness_errors else 0


def _stock_and_credit(sagas: int) -> tuple[dict[str, int], dict[str, int]]:
    """The seed's stock and credit, grown with the run: a completed saga keeps its stock
    and its authorization, and a long run must not turn into one of missing stock."""
    from participants.seed import DEFAULT_CUSTOMERS, DEFAULT_STOCK

    stock = {sku: n + sagas // 2 if n >= 1_000 else n for sku, n in DEFAULT_STOCK.items()}
    credit = {
        c: max(limit, sagas * 2_000) if limit >= 1_000_000 else limit
        for c, limit in DEFAULT_CUSTOMERS.items()
    }
    return stock, credit


def _retrying(read: Callable[[], Any], timeout: float = 120.0) -> Any:
    """A read of the run's own that waits out a database restart."""
    from sqlalchemy.exc import DBAPIError

    give_up = time.monotonic() + timeout
    while True:
        try:
            return read()
        except DBAPIError:
            if time.monotonic() > give_up:
                raise
            time.sleep(0.5)


def _active_ids(engine: Any) -> set[str]:
    with engine.connect() as conn:
        return {
            r[0]
            for r in conn.execute(
                text(
                    "SELECT saga_id::text FROM saga.saga_instance "
                    "WHERE status IN ('RUNNING', 'COMPENSATING')"
                )
            )
        }


def _start_with_retry(app: Any, key: str, payload: dict[str, Any]) -> int:
    """Start a saga; while the database is away, try again (a start is idempotent), and
    when admission control refuses it, after the ``Retry-After`` it gives, as a client
    would. How many times it was refused."""
    from saga_tasks.errors import SagaOverloaded, ServiceUnavailable

    give_up = time.monotonic() + 120
    refused = 0
    while True:
        try:
            app.start_saga("order", key, payload)
            return refused
        except SagaOverloaded as exc:
            refused += 1
            time.sleep(exc.retry_after)
        except ServiceUnavailable:
            if time.monotonic() > give_up:
                raise
            time.sleep(0.5)


def _probe(url: str) -> Any:
    return create_engine(url, poolclass=NullPool, connect_args={"connect_timeout": 3})


def _unpublished(engine: Any, engine_of: Any, app: Any) -> int:
    """Rows left unpublished in every outbox, each read in its own database."""
    owners = {p.outbox.schema: p.name for p in app.participants.values()}
    left = 0
    for table in app.outbox_tables():
        owner = owners.get(table.schema)
        with (engine if owner is None else engine_of(owner)).connect() as conn:
            query = select(func.count()).where(table.c.published_at.is_(None))
            left += int(conn.execute(query).scalar_one())
    return left


def _drain(broker_url: str, app: Any, timeout: float = 60.0) -> dict[str, int]:
    """Wait until no queue holds a message, ready or unacknowledged; what is left."""
    from saga_tasks.messaging.topology import MAINTENANCE_QUEUE

    names = [q.name for q in app.topology.all_queues() if q.name != MAINTENANCE_QUEUE]
    left: dict[str, int] = {}

    def empty() -> bool:
        nonlocal left
        try:
            left = _queue_backlog(broker_url, names)
        except Exception:  # noqa: BLE001 - not reachable this moment: not drained
            return False
        return not any(left.values())

    with contextlib.suppress(AssertionError):
        wait_for(empty, timeout=timeout, interval=0.5)
    return {q: n for q, n in left.items() if n}


def _queue_backlog(broker_url: str, names: Sequence[str]) -> dict[str, int]:
    """Messages per queue, ready and unacknowledged (the management API), or ready only
    (passive declares) where the API is not there."""
    from urllib.parse import unquote, urlsplit

    from saga_tasks.ops.isolation import RabbitAdmin, queue_depths

    admin = RabbitAdmin()
    if admin.available():
        vhost = unquote(urlsplit(broker_url).path[1:]) or "/"
        from urllib.parse import quote

        found = {
            q["name"]: int(q.get("messages", 0) or 0)
            for q in admin._request("GET", f"/queues/{quote(vhost, safe='')}")
        }
        return {n: found.get(n, 0) for n in names}
    return queue_depths(broker_url, names)


def add_arguments(parser: Any) -> None:
    parser.add_argument("--sagas", type=int, default=500)
    parser.add_argument(
        "--seconds",
        type=float,
        default=300.0,
        help="budget for the sagas to end, once all are started",
    )
    parser.add_argument(
        "--kill-every", type=float, default=3.0, help="seconds between SIGKILLs (0: none)"
    )
    parser.add_argument("--interval", type=float, default=0.08, help="seconds between starts")
    parser.add_argument(
        "--overload",
        type=float,
        default=0.0,
        help="offer F times the rate the machine sustained in a warm-up (replaces --interval)",
    )
    parser.add_argument(
        "--warmup", type=int, default=150, help="plain orders the --overload warm-up runs"
    )
    parser.add_argument(
        "--starters", type=int, default=4, help="threads starting sagas on the schedule"
    )
    parser.add_argument(
        "--no-faults",
        action="store_true",
        help="plain orders only (with --kill-every 0 and no restarts: overload alone)",
    )
    parser.add_argument(
        "--admit-seconds",
        type=float,
        default=30.0,
        help="with --overload: admission control lets about this many seconds of the "
        "warm-up's capacity be active (0: off)",
    )
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument(
        "--time-scale",
        type=float,
        default=TIME_SCALE,
        help="order saga timeouts times this (0.5: steps 15-30 s, the saga 300 s)",
    )
    parser.add_argument(
        "--broker-restarts", type=int, default=1, help="RabbitMQ restarts during the run"
    )
    parser.add_argument(
        "--db-restarts", type=int, default=1, help="PostgreSQL restarts during the run"
    )
    parser.add_argument(
        "--outage", type=float, default=3.0, help="seconds a restarted service stays down"
    )
    parser.add_argument(
        "--restart-gap", type=float, default=12.0, help="least seconds between two restarts"
    )
    parser.add_argument(
        "--outage-guard",
        default=None,
        help="shell command that must succeed before a service is stopped (polled)",
    )
    parser.add_argument(
        "--broker-restart-mode",
        choices=("app", "node"),
        default="app",
        help="app: rabbitmqctl stop_app/start_app; node: the whole node down and up",
    )
    parser.add_argument(
        "--operator-every",
        type=float,
        default=2.0,
        help="seconds between random operator actions (0: none)",
    )
    parser.add_argument(
        "--force-ratio",
        type=float,
        default=0.3,
        help="share of refused replays the operator forces",
    )
    parser.add_argument(
        "--queue-type",
        choices=("classic", "quorum"),
        default=None,
        help="queue type of the run's own vhost (default classic)",
    )
    parser.add_argument(
        "--sample-every", type=float, default=1.0, help="seconds between monitor samples"
    )
    parser.add_argument(
        "--overdue-after",
        type=float,
        default=30.0,
        help="seconds a due saga may stay unchanged before it is a violation",
    )
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
