"""The benchmark: the order saga against two Celery baselines, in one run, on one layout.

    saga-tasks bench [--sagas 2000] [--unloaded 200] [--long [50000]] [--sweep] [--json]

It makes its own vhost and database (unless ``--here``), and for each configuration
starts the same worker layout (one worker process per queue, same pool, same
prefetch), then measures:

- **chain** (baseline A): a Celery chain of three no-op tasks on three queues,
  ``acks_late``, no database, no publisher confirms;
- **durable_chain** (baseline B): the same chain, each task one PostgreSQL transaction
  (insert a row, update a row under a version check), publishes confirmed;
- **saga**: the order saga, every guarantee on (outbox, inbox, ledgers, confirms, acks
  after commit), every step succeeding;
- **saga_mixed**: the same with 20% of sagas declined by payments and compensated.

For each: throughput for a burst of N (first start to last final state), completion
latency p50/p95/p99 in that burst and unloaded (one at a time), peak RSS of each
worker process, and PostgreSQL write transactions and RabbitMQ publishes per item,
counted from transaction ids and the management API. ``--long N`` runs N more sagas and
reports worker RSS growth between 10k and N. ``--sweep`` measures the timeout
sweeper on a table of 1,000,000 sagas with 0, 1,000 and 10,000 due, with the plan.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

import participants
from saga_tasks.config import Settings
from saga_tasks.ops.processes import WorkerProcess, exit_on_sigterm, wait_for
from tools.bench.report import Result, build_report, percentiles, print_report, say
from tools.bench.sweep import sweep_bench
from tools.bench.web import web_bench
from tools.bench.workloads import ORDER, ChainItems, Items, SagaItems, active_sagas

CONFIGURATIONS = ("chain_stock", "chain", "durable_chain", "saga", "saga_mixed")


class Bench:
    def __init__(self, args: Any, database_url: str, broker_url: str, vhost: str) -> None:
        self.args = args
        self.database_url = database_url
        self.broker_url = broker_url
        self.vhost = vhost
        self.log_dir = Path(args.log_dir)
        self.done_key = f"saga_tasks:bench:{uuid.uuid4().hex[:8]}"
        self.env = {
            **os.environ,
            "SAGA_DATABASE_URL": database_url,
            "SAGA_BROKER_URL": broker_url,
            "SAGA_TASKS_APP": "participants.app:saga_app",
            "SAGA_LOG_LEVEL": "WARNING",
            "SAGA_PREFETCH_MULTIPLIER": str(args.prefetch),
            "BENCH_DONE_KEY": self.done_key,
        }
        # One pooled connection: polling must not fork a PostgreSQL backend per poll.
        self.engine = create_engine(database_url, pool_size=1, max_overflow=1)
        import redis

        self.redis = redis.Redis.from_url(Settings.from_env().result_backend)

    # -- processes --------------------------------------------------------------------------

    def workers(
        self, app: str, queues: Sequence[Sequence[str]], env: dict[str, str], label: str
    ) -> list[WorkerProcess]:
        """One worker process per entry of ``queues``, named ``<label>-<i>-<first queue>``."""
        started = []
        for i, qs in enumerate(queues):
            w = WorkerProcess(
                app,
                queues=qs,
                name=f"{label}-{i}-{qs[0]}",
                pool=self.args.pool,
                concurrency=self.args.concurrency,
                env={**self.env, **env},
                log_dir=self.log_dir,
                log_level=self.args.log_level,
                broker_url=self.broker_url,
            )
            w.start(wait=False)
            started.append(w)
        try:
            for w in started:
                w.wait_ready(timeout=90)
        except BaseException:
            for w in started:
                w.stop()
            raise
        return started

    def rss(self, processes: Sequence[WorkerProcess]) -> dict[str, float]:
        import psutil

        found = {}
        for w in processes:
            try:
                proc = psutil.Process(w.pid)
                total = proc.memory_info().rss + sum(
                    c.memory_info().rss for c in proc.children(recursive=True)
                )
            except psutil.Error:
                continue
            found[w.name] = round(total / 2**20, 1)
        return found

    # -- counters ---------------------------------------------------------------------------

    def cpu_seconds(self, workers: Sequence[WorkerProcess]) -> dict[str, float]:
        """CPU time used so far by the workers, PostgreSQL, RabbitMQ and this process
        (which starts the items): where the machine's two cores go."""
        import psutil

        def total(proc: psutil.Process, children: bool) -> float:
            t = proc.cpu_times()
            own = t.user + t.system
            if children:
                own += sum(
                    c.cpu_times().user + c.cpu_times().system for c in proc.children(recursive=True)
                )
            return own

        found = {"workers": 0.0, "postgresql": 0.0, "rabbitmq": 0.0, "benchmark": 0.0}
        for w in workers:
            try:
                found["workers"] += total(psutil.Process(w.pid), children=True)
            except psutil.Error:
                continue
        for proc in psutil.process_iter(["name"]):
            name = proc.info["name"] or ""
            key = (
                "postgresql"
                if name.startswith("postgres")
                else "rabbitmq"
                if "beam" in name
                else None
            )
            if key is None:
                continue
            try:
                found[key] += total(proc, children=False)
            except psutil.Error:
                continue
        found["benchmark"] = total(psutil.Process(), children=False)
        # Everything the machine did, kernel and short-lived processes included: what the
        # per-process figures miss (context switches, a backend forked for a connection).
        t = psutil.cpu_times()
        found["machine"] = t.user + t.nice + t.system + t.irq + t.softirq + t.steal
        return found

    def commits(self) -> int:
        """Write transactions so far, cluster-wide: the next transaction id, read without
        taking one. Read-only transactions (pollers, this benchmark) take no id; the
        statistics view would count them, and it lags."""
        with self.engine.connect() as conn:
            return int(
                conn.execute(
                    text("SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint")
                ).scalar_one()
            )

    def publishes(self) -> int | None:
        from saga_tasks.ops.isolation import RabbitAdmin

        admin = RabbitAdmin()
        if not admin.available():
            return None
        from urllib.parse import quote

        stats = (
            admin._request("GET", f"/vhosts/{quote(self.vhost, safe='')}").get("message_stats")
            or {}
        )
        return int(stats.get("publish") or 0)

    def settle_counters(self) -> None:
        # RabbitMQ's management statistics are collected every five seconds.
        time.sleep(6.5)

    # -- runs -------------------------------------------------------------------------------

    def run(self, name: str, items: Items, workers: list[WorkerProcess], n: int) -> Result:
        """Warm up, time a burst of ``n`` and then ``--unloaded`` items one at a time.

        Completion is polled cheaply (a count, then one query for every timing at the
        end) so the benchmark's own load stays small and the same for every
        configuration; latencies come from timestamps the items record themselves.
        """
        say(self.args, f"{name}: warming up")
        warm = 50
        for i in range(warm):
            items.start(-(i + 1))
        wait_for(
            lambda: items.done() >= warm, timeout=120, interval=0.05, describe=f"{name} warm-up"
        )
        self.settle_counters()
        commits0, publishes0 = self.commits(), self.publishes()
        say(self.args, f"{name}: burst of {n}")
        peak: dict[str, float] = {}
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(0.5):
                for k, v in self.rss(workers).items():
                    peak[k] = max(peak.get(k, 0), v)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        cpu0 = self.cpu_seconds(workers)
        t0 = time.time()
        with ThreadPoolExecutor(self.args.starters) as pool:
            list(pool.map(items.start, range(n)))
        wait_for(
            lambda: items.done() >= warm + n, timeout=900, interval=0.1, describe=f"{name} burst"
        )
        cpu1 = self.cpu_seconds(workers)
        stop.set()
        sampler.join()
        done = items.timings()[warm:]
        seconds = max(f for _, f in done) - t0
        self.settle_counters()
        commits = self.commits() - commits0
        published = self.publishes()
        burst_latency = [(f - s) * 1000 for s, f in done]
        say(self.args, f"{name}: {n / seconds:.0f}/s; unloaded latency, one at a time")
        unloaded = []
        for i in range(self.args.unloaded):
            key = items.start(n + i)
            # The interval only decides how soon the poll sees it; the timing is the item's.

            def finished(k: str = key) -> tuple[float, float] | None:
                return items.one(k)

            s, f = wait_for(finished, timeout=60, interval=0.005, describe="one item")
            unloaded.append((f - s) * 1000)
        return Result(
            name=name,
            items=n,
            seconds=round(seconds, 2),
            throughput=round(n / seconds, 1),
            burst_latency_ms=percentiles(burst_latency),
            unloaded_latency_ms=percentiles(unloaded),
            peak_rss_mb=peak,
            commits_per_item=round(commits / n, 2),
            publishes_per_item=round((published - publishes0) / n, 2)
            if published is not None and publishes0 is not None
            else None,
            cpu_ms_per_item={k: round((cpu1[k] - cpu0[k]) / n * 1000, 2) for k in cpu1},
        )

    def chain(self, durable: bool, stock: bool = False) -> Result:
        self.redis.delete(self.done_key)
        env = {"BENCH_DURABLE": "1" if durable else "0", "BENCH_ACK_FIX": "0" if stock else "1"}
        os.environ.update(env)
        os.environ["BENCH_DONE_KEY"] = self.done_key
        os.environ["SAGA_BROKER_URL"] = self.broker_url
        import importlib

        from tools.bench import baseline

        baseline = importlib.reload(baseline)
        workers = self.workers(
            "tools.bench.baseline",
            [["bench.a"], ["bench.b"], ["bench.c"]],
            env,
            label="bench_baseline",
        )
        name = ("durable_chain" if durable else "chain") + ("_stock" if stock else "")
        try:
            return self.run(
                name,
                ChainItems(baseline, self.redis, self.done_key, durable),
                workers,
                self.args.sagas,
            )
        finally:
            for w in workers:
                w.stop()
            baseline.app.close()

    def saga(self, mixed: bool) -> Result:
        from participants.app import saga_app

        queues = [["saga.replies", "saga.maintenance"]] * self.args.orchestrators + [
            ["orders.commands"],
            ["inventory.commands"],
            ["payments.commands"],
        ]
        workers = self.workers("participants.app", queues, {}, label="app")
        items = SagaItems(saga_app, self.engine, mixed)
        try:
            result = self.run("saga_mixed" if mixed else "saga", items, workers, self.args.sagas)
            result.extra["statuses"] = items.statuses()
            if not mixed and self.args.long:
                result.extra["long"] = self.long_run(saga_app, workers, items.run_id)
            return result
        finally:
            for w in workers:
                w.stop()

    def long_run(self, saga_app: Any, workers: list[WorkerProcess], run_id: str) -> dict[str, Any]:
        """RSS of each worker after 10k sagas and after ``--long`` sagas."""
        total = self.args.long
        marks: dict[int, dict[str, float]] = {10_000: {}, total: {}}
        done = 0
        say(self.args, f"long run: {total} sagas")
        with ThreadPoolExecutor(self.args.starters) as pool:
            while done < total:
                batch = min(2000, total - done)

                def start(i: int) -> None:
                    saga_app.start_saga("order", f"l-{run_id}-{i}", ORDER)

                list(pool.map(start, range(done, done + batch)))
                done += batch
                wait_for(
                    lambda: active_sagas(self.engine) == 0,
                    timeout=900,
                    interval=0.2,
                    describe="long-run batch",
                )
                if done in marks:
                    marks[done] = self.rss(workers)
                    say(self.args, f"  {done} sagas: RSS {marks[done]}")
                elif done % 10_000 == 0:
                    say(self.args, f"  {done} sagas")
        growth = {
            name: round((marks[total][name] - marks[10_000][name]) / marks[10_000][name] * 100, 1)
            for name in marks[10_000]
            if name in marks[total]
        }
        return {
            "rss_mb_at_10k": marks[10_000],
            f"rss_mb_at_{total}": marks[total],
            "growth_percent": growth,
        }


def reset_sagas(database_url: str) -> None:
    """Empty the saga tables, so a phase measures the table size it made."""
    engine = create_engine(database_url, poolclass=NullPool)
    with engine.begin() as conn:
        conn.execute(
            text(
                "TRUNCATE saga.saga_instance, saga.saga_step, saga.saga_history, saga.outbox, "
                "saga.inbox"
            )
        )
    engine.dispose()


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="saga-tasks bench", description=__doc__.splitlines()[0])
    parser.add_argument("--sagas", type=int, default=2000, help="burst size (default 2000)")
    parser.add_argument("--unloaded", type=int, default=200, help="items timed one at a time")
    parser.add_argument(
        "--long",
        type=int,
        nargs="?",
        const=50_000,
        default=0,
        help="also run N more sagas (default 50000) and report worker RSS growth from 10k to N",
    )
    parser.add_argument(
        "--sweep", action="store_true", help="also benchmark the sweeper on 1M sagas"
    )
    parser.add_argument("--sweep-rows", type=int, default=1_000_000)
    parser.add_argument(
        "--web", action="store_true", help="also time the dashboard and API at 1k and 100k sagas"
    )
    parser.add_argument("--web-rows", type=int, default=100_000)
    parser.add_argument("--web-requests", type=int, default=20, help="requests per page")
    parser.add_argument("--web-port", type=int, default=8799)
    parser.add_argument(
        "--only", default=",".join(CONFIGURATIONS), help="comma-separated configurations"
    )
    parser.add_argument("--pool", default="solo", choices=["solo", "prefork", "threads"])
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument(
        "--orchestrators", type=int, default=1, help="worker processes on saga.replies"
    )
    parser.add_argument("--prefetch", type=int, default=4)
    parser.add_argument("--starters", type=int, default=4, help="threads starting the burst")
    parser.add_argument("--log-level", default="WARNING", help="worker log level, the same for all")
    parser.add_argument("--json", action="store_true", help="print one JSON object, no table")
    parser.add_argument("--save", metavar="PATH", help="also write the JSON report to PATH")
    parser.add_argument(
        "--here", action="store_true", help="use SAGA_DATABASE_URL and SAGA_BROKER_URL"
    )
    parser.add_argument("--log-dir", default=".bench/logs")
    args = parser.parse_args(argv)
    from saga_tasks.ops.isolation import Isolation

    base = Settings.from_env()
    admin = (
        make_url(base.database_url).set(database="postgres").render_as_string(hide_password=False)
    )
    isolation = None if args.here else Isolation(admin_database_url=admin, prefix="saga_bench_")
    with exit_on_sigterm():
        if isolation is not None:
            isolation.__enter__()
        try:
            database_url = isolation.database_url if isolation else base.database_url
            broker_url = isolation.broker_url if isolation else base.broker_url
            vhost = isolation.ident if isolation else "/"
            return _main(args, database_url, broker_url, vhost)
        finally:
            if isolation is not None:
                isolation.__exit__(None, None, None)


def _main(args: Any, database_url: str, broker_url: str, vhost: str) -> int:
    os.environ.update(
        {
            "SAGA_DATABASE_URL": database_url,
            "SAGA_BROKER_URL": broker_url,
            "SAGA_LOG_LEVEL": "WARNING",
        }
    )
    from saga_tasks.ops.services import upgrade

    upgrade(database_url, [participants.MIGRATIONS])
    from participants.app import saga_app
    from participants.seed import seed
    from saga_tasks.messaging.topology import declare_topology

    declare_topology(broker_url, saga_app.topology)
    seed(
        saga_app.engine,
        {f"sku-{i}": 10**9 for i in range(1, 11)},
        {"c-1": 2**31 - 1, "c-low": 1_000},
    )
    with saga_app.engine.begin() as conn:
        conn.execute(text("CREATE SCHEMA IF NOT EXISTS bench"))
        conn.execute(
            text(
                "CREATE TABLE IF NOT EXISTS bench.chain_row (id bigserial PRIMARY KEY, chain_id text, step text, at timestamptz DEFAULT now())"
            )
        )
        conn.execute(
            text(
                "CREATE TABLE IF NOT EXISTS bench.chain_state (chain_id text PRIMARY KEY, version int NOT NULL)"
            )
        )
    bench = Bench(args, database_url, broker_url, vhost)
    results: dict[str, Result] = {}
    wanted = args.only.split(",")
    try:
        for name in CONFIGURATIONS:
            if name not in wanted:
                continue
            if "chain" in name:
                results[name] = bench.chain(
                    durable=name.startswith("durable"), stock=name.endswith("_stock")
                )
            else:
                results[name] = bench.saga(mixed=name == "saga_mixed")
        sweep = web = None
        if args.sweep:
            reset_sagas(database_url)
            sweep = sweep_bench(args, database_url, broker_url)
        if args.web:
            reset_sagas(database_url)
            web = web_bench(args, database_url, broker_url)
    finally:
        saga_app.close()  # publishes of the sweep confirmed and marked before the drop
        bench.redis.delete(bench.done_key)
        from saga_tasks.messaging.celery_config import forget_beat_state

        forget_beat_state(saga_app.settings)
    report = build_report(args, results, sweep)
    report["web"] = web
    if args.save:
        Path(args.save).write_text(json.dumps(report, indent=2, default=str))
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        print_report(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
