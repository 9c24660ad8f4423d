"""The demo: real workers, beat and Flower, and a stream of order and return sagas through
every path.

    python -m tools.demo [--sagas 250] [--rate R | --warmup 60 --share 0.7]
                         [--exit | --keep] [--stop]

Starts the orchestrator, one worker per participant queue, beat and Flower; seeds
stock and customers; measures the deployment's capacity this hour with a short warm-up
(plain orders at once) and offers a share of it (or ``--rate``); starts the sagas at that
steady rate with a known mix of paths
(completed, out of stock, unknown SKU, declined, duplicate start, duplicate reply,
slow participant, participant crash after commit; returns accepted and rejected by a
scripted inspector, a refund declined, an inspection nobody makes in time, a
notification refused once and sent again after the pivot); restarts any worker that dies;
prints progress, then a summary that checks every saga ended as its path expects.
It stops everything it started on Ctrl-C, at the end with ``--exit``, or, for a
demo left running elsewhere, with ``--stop``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import secrets
import shutil
import signal
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import func, select, text

from saga_tasks.config import Settings
from saga_tasks.core.states import TERMINAL_SAGA, SagaStatus
from saga_tasks.errors import SagaTasksError
from saga_tasks.ops.broker_users import read_env
from saga_tasks.ops.processes import Supervisor, WorkerProcess, service_env
from saga_tasks.urls import mask_url
from tools.capacity import measure

STATE_DIR = Path(".demo")
WEB_PORT = 8000
ORCHESTRATOR_METRICS_PORT = 9101
PIDS = STATE_DIR / "pids.json"
RUNNER = "demo"


@dataclass(frozen=True)
class DemoPath:
    name: str
    weight: int
    expected: SagaStatus
    saga_type: str = "order"
    decision: str | None = None
    """For a return: what the scripted inspector decides (None: nobody decides)."""


PATHS = (
    DemoPath("completed", 69, SagaStatus.COMPLETED),
    DemoPath("out_of_stock", 8, SagaStatus.COMPENSATED),
    DemoPath("unknown_sku", 4, SagaStatus.COMPENSATED),
    DemoPath("payment_declined", 8, SagaStatus.COMPENSATED),
    DemoPath("duplicate_start", 4, SagaStatus.COMPLETED),
    DemoPath("duplicate_reply", 3, SagaStatus.COMPLETED),
    DemoPath("slow_participant", 3, SagaStatus.COMPLETED),
    DemoPath("crash_after_commit", 1, SagaStatus.COMPLETED),
    DemoPath("return_accepted", 6, SagaStatus.COMPLETED, "return", "accepted"),
    DemoPath("return_rejected", 3, SagaStatus.COMPLETED, "return", "rejected"),
    DemoPath("refund_declined", 2, SagaStatus.COMPENSATED, "return", "accepted"),
    DemoPath("inspection_timeout", 1, SagaStatus.COMPENSATED, "return"),
    DemoPath("notify_retried", 2, SagaStatus.COMPLETED, "return", "accepted"),
)
INSPECTION_SECONDS = "20"
"""How long the demo's inspector has for a return (escalation at two thirds)."""


def return_payload(path: str, key: str, rng: random.Random) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "return_id": key,
        "order_ref": f"ord-{rng.randint(1, 10_000)}",
        "customer_id": f"c-{rng.randint(1, 20)}",
        "sku": f"sku-{rng.randint(1, 10)}",
        "qty": 1,
        "amount_cents": rng.randint(500, 20_000),
    }
    if path == "refund_declined":
        payload["amount_cents"] = 150_000  # above the automatic refund limit
    elif path == "notify_retried":
        payload["demo_faults"] = {"returns.notify": "refuse"}
    return payload


def inspect_waiting(app: Any, planned: dict[str, DemoPath], decided: set[str]) -> int:
    """The scripted inspector: decide every return waiting for it, as its path says."""
    waiting = [sid for sid, p in planned.items() if p.decision is not None and sid not in decided]
    if not waiting:
        return 0
    with app.engine.connect() as conn:
        ready = conn.execute(
            text(
                "SELECT saga_id::text FROM saga.saga_step WHERE step = 'inspect' "
                "AND status = 'REQUESTED' AND saga_id = ANY(CAST(:ids AS uuid[]))"
            ),
            {"ids": waiting},
        ).scalars()
        ready = list(ready)
    for saga_id in ready:
        decision = planned[saga_id].decision
        try:
            app.orchestrator.signal(
                saga_id,
                "inspect",
                {"decision": decision},
                actor="demo-inspector",
                reason=f"scripted inspection: {decision}",
            )
        except SagaTasksError as exc:
            print(f"\ninspector: {saga_id}: {exc}")
        decided.add(saga_id)
    return len(ready)


def payload_for(path: str, rng: random.Random) -> dict[str, Any]:
    items = [
        {"sku": f"sku-{rng.randint(1, 10)}", "qty": rng.randint(1, 3)}
        for _ in range(rng.randint(1, 3))
    ]
    payload: dict[str, Any] = {
        "customer_id": f"c-{rng.randint(1, 20)}",
        "items": items,
        "amount_cents": rng.randint(500, 20_000),
    }
    if path == "out_of_stock":
        payload["items"] = [{"sku": "sku-empty", "qty": 1}]
    elif path == "unknown_sku":
        payload["items"] = [*items, {"sku": "sku-ghost", "qty": 1}]
    elif path == "payment_declined":
        payload["customer_id"], payload["amount_cents"] = "c-low", 5_000
    elif path == "duplicate_reply":
        payload["demo_faults"] = {"inventory.reserve": "duplicate_reply"}
    elif path == "slow_participant":
        payload["demo_faults"] = {"payments.authorize": "slow:1"}
    elif path == "crash_after_commit":
        payload["demo_faults"] = {"inventory.reserve": "crash_after_commit"}
    return payload


def demo_processes(
    env: dict[str, str],
    log_dir: Path,
    flower_port: int,
    flower_address: str,
    users: Path | None = None,
) -> list[WorkerProcess]:
    """The orchestrator, a worker per participant queue (two on inventory), beat, Flower;
    with ``users`` (``saga-tasks broker users``' env files) each as its service's own
    broker user, and each participant's worker given its own database only."""
    orchestrator_env = service_env(env, "orchestrator", users)
    app = "participants.app"
    # Two inventory workers on one queue: when the crash fault kills one,
    # the other keeps the queue moving and gets the dead one's unacked messages.
    queues = {
        # Solo: it applies the replies it holds in one transaction (group commit).
        "orchestrator": (["saga.replies", "saga.maintenance"], "solo", 1),
        "orders": (["orders.commands"], "solo", 1),
        "inventory-a": (["inventory.commands"], "solo", 1),
        "inventory-b": (["inventory.commands"], "solo", 1),
        "payments": (["payments.commands"], "prefork", 2),
        "returns": (["returns.commands"], "solo", 1),
    }
    # The orchestrator serves its counters (under prefork: the children's, added up).
    prometheus_dir = STATE_DIR / "prometheus"
    shutil.rmtree(prometheus_dir, ignore_errors=True)
    prometheus_dir.mkdir(parents=True)
    metrics_env = {
        "SAGA_METRICS_PORT": str(ORCHESTRATOR_METRICS_PORT),
        "PROMETHEUS_MULTIPROC_DIR": str(prometheus_dir),
    }
    processes = [
        WorkerProcess(
            app,
            queues=qs,
            name=name,
            pool=pool,
            concurrency=concurrency,
            env=(
                {**orchestrator_env, **metrics_env}
                if name == "orchestrator"
                else service_env(env, name.split("-")[0], users)
            ),
            log_dir=log_dir,
            extra_args=("-E",),
        )
        for name, (qs, pool, concurrency) in queues.items()
    ]
    env = orchestrator_env  # beat, Flower and the web app are the orchestrator's
    processes.append(WorkerProcess(app, name="beat", env=env, log_dir=log_dir, role="beat"))
    flower_args = [f"--port={flower_port}", f"--address={flower_address}"]
    if _management_api():
        flower_args.append("--broker_api=http://guest:guest@127.0.0.1:15672/api/")
    processes.append(
        WorkerProcess(
            app, name="flower", env=env, log_dir=log_dir, role="flower", extra_args=flower_args
        )
    )
    processes.append(
        WorkerProcess(
            app,
            name="web",
            env=env,
            log_dir=log_dir,
            role="web",
            extra_args=("--host", flower_address, "--port", str(WEB_PORT)),
        )
    )
    return processes


def _save_pids(processes: Sequence[WorkerProcess]) -> None:
    STATE_DIR.mkdir(exist_ok=True)
    pids = {p.name: p.pid for p in processes if p.process is not None}
    PIDS.write_text(json.dumps({RUNNER: os.getpid(), **pids}))


def _announce_restart(process: WorkerProcess) -> None:
    code = process.process.returncode if process.process is not None else "?"
    print(f"\n  {process.name} died (exit {code}); restarting it", flush=True)


def _management_api() -> bool:
    from saga_tasks.ops.isolation import RabbitAdmin

    return RabbitAdmin().available()


def stop_previous() -> int:
    """``--stop``: end a demo left running: its runner first (it supervises the rest and
    would restart what is killed under it, then stops them itself), then any process
    group still there."""
    if not PIDS.exists():
        print("no demo is running (no .demo/pids.json)")
        return 0
    pids: dict[str, int] = json.loads(PIDS.read_text())
    runner = pids.pop(RUNNER, None)
    if runner is not None and _alive(runner):
        os.kill(runner, signal.SIGTERM)
        deadline = time.monotonic() + 60
        while _alive(runner) and time.monotonic() < deadline:
            time.sleep(0.2)
        print(f"stopped the demo runner (pid {runner}) and what it supervised")
    for name, pid in pids.items():
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
            print(f"stopped {name} (pid {pid})")
    PIDS.unlink(missing_ok=True)
    return 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


@contextlib.contextmanager
def progress_line() -> Iterator[Any]:
    interactive = sys.stdout.isatty()
    last = [0.0]

    def show(message: str, force: bool = False) -> None:
        now = time.monotonic()
        if interactive:
            print(f"\r  {message}\033[K", end="", flush=True)
        elif force or now - last[0] >= 2:
            print(f"  {message}", flush=True)
            last[0] = now

    yield show
    if interactive:
        print()


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("SAGA_TASKS_DEMO_FAULTS", "1")
    os.environ.setdefault("SAGA_RELAY_MIN_AGE", "2")
    os.environ.setdefault("SAGA_RELAY_INTERVAL", "1")
    os.environ.setdefault("SAGA_SAMPLE_INTERVAL", "5")  # the dashboard's history fills quickly
    os.environ.setdefault("RETURN_INSPECTION_SECONDS", INSPECTION_SECONDS)
    token = None
    if not os.environ.get("SAGA_API_TOKENS"):
        # A token for this run only (every scope), so the dashboard reads and its buttons work.
        token = secrets.token_urlsafe(18)
        os.environ["SAGA_API_TOKENS"] = f"demo:{token}"
    if args.users is not None:
        # This process starts sagas as application code would: as the orchestrator's user.
        os.environ.update(read_env(args.users, "orchestrator"))
    settings = Settings.from_env()
    from participants.app import saga_app
    from participants.seed import seed

    env = {**os.environ, "SAGA_TASKS_APP": "participants.app:saga_app"}
    print(f"PostgreSQL {mask_url(settings.database_url)} (orchestrator)")
    for name in saga_app.participants:
        print(f"           {mask_url(settings.participant_database(name))} ({name})")
    print(f"RabbitMQ   {mask_url(settings.broker_url)}")
    if args.users is not None:
        print(f"           each service as its own broker user ({settings.broker_user_prefix}...)")
    log_dir = STATE_DIR / "logs"
    supervisor = Supervisor(
        demo_processes(env, log_dir, args.flower_port, args.flower_address, args.users),
        on_restart=_announce_restart,
        on_change=_save_pids,
    )
    print("starting the orchestrator, a worker per participant queue, beat, Flower, the dashboard")

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    try:
        supervisor.start()
        print(f"all started; logs in {log_dir}/")
        with saga_app.participant_engine("inventory").begin() as conn:
            conn.execute(text("TRUNCATE inventory.reservation"))
        with saga_app.participant_engine("payments").begin() as conn:
            conn.execute(text("TRUNCATE payments.authorization, payments.refund"))
        seed(saga_app.participant_engine)
        ok = stream(saga_app, args, supervisor)
        flower = f"http://{args.flower_address}:{args.flower_port}"
        print(f"\nFlower:    {flower}  (workers and tasks; broker tab via the management API)")
        dashboard = f"http://{args.flower_address}:{WEB_PORT}"
        print(f"Dashboard: {dashboard}  (sagas, timelines, dead letters)")
        if token:
            print(f"           token for this run (paste it top right): {token}")
        print(
            f"Metrics:   {dashboard}/metrics (state) and "
            f"http://127.0.0.1:{ORCHESTRATOR_METRICS_PORT}/metrics (the orchestrator's counters)"
        )
        print("CLI:       saga-tasks list  |  saga-tasks show <saga_id>  |  saga-tasks dlq list")
        keep = args.keep or (sys.stdin.isatty() and not args.exit)
        if keep:
            print("Everything keeps running; press Ctrl-C to stop it.")
            while True:
                time.sleep(3600)
        return 0 if ok else 1
    except KeyboardInterrupt:
        print("\nstopping ...")
        return 130
    finally:
        supervisor.stop()
        with contextlib.suppress(FileNotFoundError):
            PIDS.unlink()
        print("stopped every process the demo started")


def stream(app: Any, args: argparse.Namespace, supervisor: Supervisor) -> bool:
    rng = random.Random(args.seed)  # noqa: S311 - a reproducible demo mix, not a secret
    weights = [p.weight for p in PATHS]
    run_id = time.strftime("%Y%m%d%H%M%S")
    planned: dict[str, DemoPath] = {}
    decided: set[str] = set()
    duplicates_refused = 0
    rate = args.rate
    if rate is None:
        print(f"warm-up: {args.warmup} plain orders at once, to measure this machine's capacity")
        capacity = measure(
            app, f"demo-{run_id}-warm-", args.warmup, lambda r: payload_for("completed", r)
        )
        rate = round(capacity * args.share, 1)
        print(
            f"capacity this hour: {capacity:.1f} sagas/s; offering {rate}/s "
            f"({args.share:.0%} of it: a rate it sustains, so latency is the work, not a queue)"
        )
    interval = 1.0 / rate
    started_at = time.monotonic()
    print(f"starting {args.sagas} order and return sagas at {rate}/s ...")
    with progress_line() as show:
        for i in range(args.sagas):
            path = rng.choices(PATHS, weights)[0]
            key = f"demo-{run_id}-{i:05d}"
            if path.saga_type == "return":
                payload = return_payload(path.name, key, rng)
            else:
                payload = payload_for(path.name, rng)
            handle = app.start_saga(path.saga_type, key, payload)
            planned[handle.saga_id] = path
            if path.name == "duplicate_start":
                again = app.start_saga("order", key, payload)
                duplicates_refused += again.saga_id == handle.saga_id and not again.created
            delay = started_at + (i + 1) * interval - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            if i % 10 == 0:
                inspect_waiting(app, planned, decided)
                show(f"started {i + 1}/{args.sagas}  {_counts_text(app, planned)}")
        deadline = time.monotonic() + args.timeout
        while True:
            inspect_waiting(app, planned, decided)
            counts = _status_counts(app, planned)
            show(f"started {args.sagas}/{args.sagas}  {_counts_text(app, planned, counts)}")
            if sum(counts.get(s, 0) for s in (*TERMINAL_SAGA, SagaStatus.MANUAL_REVIEW)) == len(
                planned
            ):
                break
            if time.monotonic() > deadline:
                show("timed out waiting for the sagas to end", force=True)
                break
            time.sleep(0.5)
    return summary(app, planned, duplicates_refused, supervisor)


def _status_counts(app: Any, planned: dict[str, DemoPath]) -> Counter[SagaStatus]:
    with app.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT status, count(*) FROM saga.saga_instance "
                "WHERE saga_id = ANY(CAST(:ids AS uuid[])) GROUP BY status"
            ),
            {"ids": list(planned)},
        )
        return Counter({SagaStatus(r[0]): r[1] for r in rows})


def _counts_text(
    app: Any, planned: dict[str, DemoPath], counts: Counter[SagaStatus] | None = None
) -> str:
    counts = counts if counts is not None else _status_counts(app, planned)
    return "  ".join(f"{s.value.lower()} {n}" for s, n in sorted(counts.items()))


def summary(
    app: Any, planned: dict[str, DemoPath], duplicates_refused: int, supervisor: Supervisor
) -> bool:
    with app.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT saga_id::text, status, extract(epoch FROM finished_at - created_at) * 1000 "
                "FROM saga.saga_instance WHERE saga_id = ANY(CAST(:ids AS uuid[]))"
            ),
            {"ids": list(planned)},
        ).all()
        invalid = conn.execute(text("SELECT count(*) FROM saga.invalid_message")).scalar_one()
    recovered = 0
    for table in app.outbox_tables():  # each in its own database
        with app.table_engine(table).connect() as conn:
            recovered += conn.execute(select(func.count()).where(table.c.recovered)).scalar_one()
    by_path: dict[str, Counter[str]] = {p.name: Counter() for p in PATHS}
    mismatched = []
    latencies = []
    for saga_id, status, latency in rows:
        path = planned[saga_id]
        by_path[path.name][status] += 1
        if status != path.expected.value:
            mismatched.append((saga_id, path.name, status))
        if latency is not None:
            latencies.append(float(latency))
    totals = Counter(status for _, status, _ in rows)
    print(f"\n{'path':<20} {'sagas':>5}  {'expected':<12} got")
    for p in PATHS:
        got = ", ".join(f"{s} {n}" for s, n in sorted(by_path[p.name].items())) or "-"
        print(f"{p.name:<20} {sum(by_path[p.name].values()):>5}  {p.expected.value:<12} {got}")
    print("\nfinal status counts: " + ", ".join(f"{s} {n}" for s, n in sorted(totals.items())))
    if latencies:
        print(
            f"completion latency (start to final status): p50 {percentile(latencies, 0.5):.0f} ms, "
            f"p95 {percentile(latencies, 0.95):.0f} ms, max {max(latencies):.0f} ms"
        )
        plain = [
            lat for (sid, _, lat) in rows if planned[sid].name == "completed" and lat is not None
        ]
        if plain:
            print(
                f"  of which the plain completed path: p50 {percentile(plain, 0.5):.0f} ms, "
                f"p95 {percentile(plain, 0.95):.0f} ms"
            )
    print(
        f"duplicate starts answered with the existing saga: {duplicates_refused}; "
        f"invalid messages: {invalid}; outbox rows published by recovery: {recovered}; "
        f"worker restarts after crashes: {supervisor.restarts}"
    )
    if mismatched:
        print(f"\n{len(mismatched)} sagas did not end as their path expects:")
        for saga_id, path_name, status in mismatched[:20]:
            print(f"  {saga_id}  {path_name}: {status}")
        return False
    print(f"\nall {len(rows)} sagas ended as their path expects")
    return True


def main(argv: Sequence[str] | None = None, prog: str = "python -m tools.demo") -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("--sagas", type=int, default=250, help="sagas to start (default 250)")
    parser.add_argument(
        "--rate",
        type=float,
        default=None,
        help="sagas started per second (default: a share of the capacity a warm-up measures)",
    )
    parser.add_argument(
        "--warmup", type=int, default=60, help="plain orders the warm-up runs (default 60)"
    )
    parser.add_argument(
        "--share",
        type=float,
        default=0.7,
        help="share of the measured capacity offered when --rate is not given (default 0.7)",
    )
    parser.add_argument(
        "--timeout", type=float, default=180.0, help="seconds to wait for the sagas to end"
    )
    parser.add_argument("--seed", type=int, default=7, help="seed of the random mix")
    parser.add_argument(
        "--users",
        type=Path,
        default=None,
        metavar="DIR",
        help="env files of saga-tasks broker users: each process as its own broker user",
    )
    parser.add_argument("--flower-port", type=int, default=5555)
    parser.add_argument("--flower-address", default="127.0.0.1")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--exit", action="store_true", help="stop everything after the summary")
    group.add_argument(
        "--keep", action="store_true", help="keep running after the summary until Ctrl-C"
    )
    group.add_argument(
        "--stop", action="store_true", help="stop the processes of a demo left running"
    )
    args = parser.parse_args(argv)
    if args.stop:
        return stop_previous()
    if args.sagas < 1 or (args.rate is not None and args.rate <= 0):
        parser.error("--sagas and --rate must be positive")
    if args.rate is None and (args.warmup < 2 or not 0 < args.share <= 1):
        parser.error("--warmup must be at least 2 and --share in (0, 1]")
    try:
        return run(args)
    except SagaTasksError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
