"""Service outages for the chaos run: RabbitMQ and PostgreSQL stopped and started again.

An outage stops the service for ``down_for`` seconds, starts it and waits until it
answers (an AMQP connection to the run's vhost, a query to the run's database). The
commands are the local machine's (a Debian PostgreSQL cluster, a local RabbitMQ node);
both restarts end every client connection, as a crash or a maintenance restart of the
service would:

- RabbitMQ, mode ``app``: ``rabbitmqctl stop_app`` / ``start_app`` (the node's
  applications stop; every connection closes; queues come back from disk);
  mode ``node``: ``rabbitmqctl shutdown`` / ``rabbitmq-server -detached`` (the whole
  Erlang node goes and comes back);
- PostgreSQL: ``pg_ctlcluster --skip-systemctl-redirect <version> main stop -m fast``
  (every session is ended, open transactions roll back) / ``start``, the version
  found under ``/etc/postgresql``.

A service that is down when the run ends is started again before it returns.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from saga_tasks.ops.processes import wait_for

BROKER = "broker"
DATABASE = "database"
KINDS = (BROKER, DATABASE)


def _run(command: Sequence[str], timeout: float = 120.0) -> None:
    result = subprocess.run(
        list(command), capture_output=True, text=True, timeout=timeout, check=False
    )
    if result.returncode != 0:
        raise RuntimeError(
            f"{' '.join(command)} exited with {result.returncode}: "
            f"{(result.stderr or result.stdout).strip()[-500:]}"
        )


def postgres_cluster(config_dir: Path = Path("/etc/postgresql")) -> tuple[str, str]:
    """The (version, name) of the local PostgreSQL cluster, newest version first."""
    clusters = sorted(
        (p.parent.name, p.name) for p in config_dir.glob("*/*") if (p / "postgresql.conf").exists()
    )
    if not clusters:
        raise RuntimeError(f"no PostgreSQL cluster under {config_dir}")
    main = [c for c in clusters if c[1] == "main"] or clusters
    return max(main, key=lambda c: [int(x) for x in c[0].split(".") if x.isdigit()])


@dataclass
class ServiceControl:
    """How to stop and start the two services, and how to tell they answer again."""

    broker_url: str
    database_url: str
    broker_mode: str = "app"

    def stop(self, kind: str) -> None:
        if kind == BROKER:
            if self.broker_mode == "node":
                _run(["rabbitmqctl", "shutdown"])
            else:
                _run(["rabbitmqctl", "stop_app"])
        else:
            version, name = postgres_cluster()
            _run(["pg_ctlcluster", "--skip-systemctl-redirect", version, name, "stop", "-m",
                  "fast"])  # fmt: skip

    def start(self, kind: str) -> None:
        if kind == BROKER:
            if self.broker_mode == "node":
                # The node registers with epmd a moment after -detached returns; until then
                # await_startup fails at once. Whether it answers is awaited by the caller.
                _run(["rabbitmq-server", "-detached"])
            else:
                _run(["rabbitmqctl", "start_app"])
        else:
            version, name = postgres_cluster()
            _run(["pg_ctlcluster", "--skip-systemctl-redirect", version, name, "start"])

    def answers(self, kind: str) -> bool:
        from saga_tasks.errors import ServiceUnavailable

        try:
            if kind == BROKER:
                from saga_tasks.ops.services import check_broker

                check_broker(self.broker_url)
            else:
                from saga_tasks.persistence.db import check_database

                check_database(self.database_url)
        except ServiceUnavailable:
            return False
        return True

    def wait_answers(self, kind: str, timeout: float = 120.0) -> None:
        wait_for(lambda: self.answers(kind), timeout=timeout, interval=0.25,
                 describe=f"the {kind} answering again")  # fmt: skip


@dataclass
class Outage:
    """One planned outage: which service, when (seconds into the run), for how long."""

    kind: str
    at: float
    down_for: float
    waited: float = 0.0
    """Seconds the outage waited for ``OutageRunner.guard`` to allow it."""
    stopped_at: float | None = None
    """Seconds into the run when the stop command returned."""
    back_at: float | None = None
    """Seconds into the run when the service answered again."""
    error: str | None = None

    def report(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "planned_at": round(self.at, 1),
            "waited": round(self.waited, 1),
            "stopped_at": None if self.stopped_at is None else round(self.stopped_at, 1),
            "back_at": None if self.back_at is None else round(self.back_at, 1),
            "error": self.error,
        }


def plan_outages(
    *,
    broker_restarts: int,
    database_restarts: int,
    load_seconds: float,
    down_for: float,
    gap: float,
    first_at: float = 3.0,
) -> list[Outage]:
    """Spread the outages over the time the sagas are being started, broker first and
    the kinds alternating, at least ``gap`` seconds apart."""
    kinds: list[str] = []
    for i in range(max(broker_restarts, database_restarts)):
        kinds += [BROKER] if i < broker_restarts else []
        kinds += [DATABASE] if i < database_restarts else []
    plan: list[Outage] = []
    previous = first_at - gap
    for i, kind in enumerate(kinds):
        at = max(load_seconds * (i + 1) / (len(kinds) + 1), first_at, previous + gap)
        plan.append(Outage(kind, at, down_for))
        previous = at
    return plan


@dataclass
class OutageRunner:
    """Runs a plan of outages in a thread of its own, one after the other."""

    control: ServiceControl
    plan: list[Outage]
    started_at: float
    on_event: Callable[[str], None] = lambda _line: None
    guard: str | None = None
    """A shell command that must succeed before a service is stopped (on a shared machine,
    e.g. no test run in progress); polled every 5 s, for ``guard_timeout`` seconds at most,
    after which the outage is skipped and reported."""
    guard_timeout: float = 600.0
    _stop: threading.Event = field(default_factory=threading.Event)
    _down: set[str] = field(default_factory=set)
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._work, daemon=True, name="outages")
        self._thread.start()

    def done(self) -> bool:
        return self._thread is None or not self._thread.is_alive()

    def windows(self) -> list[tuple[float, float]]:
        """(from, to) in seconds into the run of every outage so far, the current one open."""
        now = time.monotonic() - self.started_at
        return [
            (o.at + o.waited, o.back_at if o.back_at is not None else now)
            for o in self.plan
            if o.stopped_at is not None
        ]

    def _work(self) -> None:
        for outage in self.plan:
            wait = self.started_at + outage.at - time.monotonic()
            if self._stop.wait(max(wait, 0)):
                return
            if not self._allowed(outage):
                continue
            self._one(outage)

    def _allowed(self, outage: Outage) -> bool:
        if not self.guard:
            return True
        since = time.monotonic()
        while True:
            result = subprocess.run(["sh", "-c", self.guard], capture_output=True, check=False)
            outage.waited = time.monotonic() - since
            if result.returncode == 0:
                return True
            if outage.waited > self.guard_timeout:
                outage.error = f"skipped: --outage-guard did not allow it in {outage.waited:.0f}s"
                return False
            self.on_event(f"the {outage.kind} outage waits for --outage-guard")
            if self._stop.wait(5):
                return False

    def _one(self, outage: Outage) -> None:
        kind = outage.kind
        try:
            self.on_event(f"stopping the {kind}")
            with self._lock:
                self._down.add(kind)
            self.control.stop(kind)
            outage.stopped_at = time.monotonic() - self.started_at
            self._stop.wait(outage.down_for)
        except Exception as exc:  # noqa: BLE001 - reported; the service is started below
            outage.error = f"stop: {exc}"
        finally:
            try:
                self._bring_back(kind)
                outage.back_at = time.monotonic() - self.started_at
                self.on_event(f"the {kind} is back")
            except Exception as exc:  # noqa: BLE001 - reported with the run
                outage.error = (outage.error + "; " if outage.error else "") + f"start: {exc}"

    def _bring_back(self, kind: str) -> None:
        """Start the service unless it answers, and wait until it does."""
        failed: Exception | None = None
        if not self.control.answers(kind):
            try:
                self.control.start(kind)
            except Exception as exc:  # noqa: BLE001 - it may answer all the same
                failed = exc
        try:
            self.control.wait_answers(kind)
        except AssertionError as exc:
            raise RuntimeError(f"{failed or exc}; it does not answer") from exc
        with self._lock:
            self._down.discard(kind)

    def stop(self) -> None:
        """Cancel what is still planned; a service down now is started and awaited."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=300)
        for kind in KINDS:
            with self._lock:
                down = kind in self._down
            if down:
                self._bring_back(kind)

    def errors(self) -> list[str]:
        return [f"{o.kind} outage at {o.at:.0f}s: {o.error}" for o in self.plan if o.error]
