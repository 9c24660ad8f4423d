"""One configuration measured: its worker layout started (one process per queue, the
same pool and prefetch for all), a warm-up, a timed burst, items timed one at a time,
and the counters read around the burst (CPU, RSS, commits, publishes)."""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text

from saga_tasks.config import Settings
from saga_tasks.ops.processes import WorkerProcess, wait_for
from tools.bench.report import Result, percentiles, say
from tools.bench.workloads import ORDER, ChainItems, Items, SagaItems, active_sagas


class Bench:
    """Measures configurations in turn on one database and vhost: starts each one's
    workers, drives its items, reads the counters around the burst, stops the workers."""

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
                extra_args=("-E",) if getattr(self.args, "events", True) else (),
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

    def vacuum_analyze(self) -> None:
        """``--analyze-after-warmup``: statistics taken while the queues are quiet, as
        autovacuum takes them on a live server between bursts; the worst case for a
        queue table's plans (they say "almost empty" when the burst arrives)."""
        with self.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("VACUUM ANALYZE"))

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
        warm = self.args.warmup
        for i in range(warm):
            items.start(-(i + 1))
        wait_for(
            lambda: items.done() >= warm, timeout=120, interval=0.05, describe=f"{name} warm-up"
        )
        if self.args.analyze_after_warmup:
            self.vacuum_analyze()
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

    def chain(self, durable: bool, stock: bool = False, eight: bool = False) -> Result:
        """A baseline chain: three tasks (``chain``, ``durable_chain``) or the saga's
        eight over its four queues (``saga_floor``, ``durable_chain8``)."""
        self.redis.delete(self.done_key)
        env = {
            "BENCH_DURABLE": "1" if durable else "0",
            "BENCH_ACK_FIX": "0" if stock else "1",
            "BENCH_SHAPE": "8" if eight else "3",
        }
        os.environ.update(env)
        os.environ["BENCH_DONE_KEY"] = self.done_key
        os.environ["SAGA_BROKER_URL"] = self.broker_url
        import importlib

        from tools.bench import baseline

        baseline = importlib.reload(baseline)
        # The saga's layout: the orchestrator's queue(s), then one per participant.
        queues = (
            [["bench.orch"]] * self.args.orchestrators
            + [["bench.orders"], ["bench.inventory"], ["bench.payments"]]
            if eight
            else [["bench.a"], ["bench.b"], ["bench.c"]]
        )
        workers = self.workers("tools.bench.baseline", queues, env, label="bench_baseline")
        if eight:
            name = "durable_chain8" if durable else "saga_floor"
        else:
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

    def dbos(self) -> Result:
        """The order saga as a DBOS workflow through a DBOS queue, one executor per core."""
        from dbos import DBOSClient

        from tools.bench import dbos_app
        from tools.bench.workloads import DbosItems

        self.redis.delete(self.done_key)
        env = {**self.env, "BENCH_DONE_KEY": self.done_key}
        executors: list[Executor] = []
        try:
            # One at a time: the first creates DBOS's system tables.
            count = int(os.environ.get("BENCH_DBOS_EXECUTORS") or os.cpu_count() or 2)
            for i in range(count):
                executor = Executor(f"dbos-{i}", env, self.log_dir)
                executors.append(executor)
                executor.wait_ready()
            client = DBOSClient(system_database_url=dbos_app.system_url(self.database_url))
            try:
                items = DbosItems(client, self.redis, self.done_key)
                return self.run("dbos", items, executors, self.args.sagas)  # type: ignore[arg-type]
            finally:
                client.destroy()
        finally:
            for e in executors:
                e.stop()

    def saga(self, mixed: bool, *, batched: bool = True) -> Result:
        from participants.app import saga_app

        queues = [["saga.replies", "saga.maintenance"]] * self.args.orchestrators + [
            ["orders.commands"],
            ["inventory.commands"],
            ["payments.commands"],
        ]
        env = {} if batched else {"SAGA_GROUP_COMMIT": "0"}
        workers = self.workers("participants.app", queues, env, label="app")
        items = SagaItems(saga_app, self.engine, mixed)
        name = "saga_mixed" if mixed else "saga" if batched else "saga_unbatched"
        try:
            result = self.run(name, items, workers, self.args.sagas)
            result.extra["statuses"] = items.statuses()
            if self.args.unloaded:
                ledgers = [p.ledger for p in saga_app.participants.values()]
                result.extra["unloaded_hops_ms"] = items.hops(
                    self.args.sagas, self.args.unloaded, ledgers
                )
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


class Executor:
    """A DBOS executor process (``python -m tools.bench.dbos_app``), named and stopped as
    the benchmark does its Celery workers."""

    def __init__(self, name: str, env: dict[str, str], log_dir: Path) -> None:
        import subprocess
        import sys

        self.name = name
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / f"{name}.log"
        self._log = self.log_path.open("w")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tools.bench.dbos_app"],
            env={**env, "BENCH_DBOS_EXECUTOR": name},
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.pid = self.process.pid

    def wait_ready(self, timeout: float = 90.0) -> None:
        def ready() -> bool:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited: see {self.log_path}")
            return "dbos executor ready" in self.log_path.read_text()

        wait_for(ready, timeout=timeout, interval=0.1, describe=f"{self.name} to launch")

    def stop(self, timeout: float = 20.0) -> None:
        import signal
        import subprocess

        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self._log.close()
