"""Help for testing sagas against real services, shipped so users test theirs as we test ours.

- ``Isolation``: a RabbitMQ vhost and a PostgreSQL database of one's own, removed after.
- ``WorkerProcess``: a real ``celery worker`` (or ``beat``) process, started, awaited until
  ready, killed with any signal; its whole process group goes with it.
- ``wait_for`` and ``wait_for_status``: await a condition instead of sleeping and hoping.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from saga_tasks.clock import FakeClock
from saga_tasks.states import SagaStatus

T = TypeVar("T")

__all__ = [
    "FakeClock",
    "Isolation",
    "RabbitAdmin",
    "WorkerProcess",
    "create_database",
    "drop_database",
    "wait_for",
    "wait_for_status",
]


class TimedOut(AssertionError):
    """A condition awaited by ``wait_for`` did not come true in time."""


def wait_for(
    condition: Callable[[], T | None],
    *,
    timeout: float = 30.0,
    interval: float = 0.05,
    describe: str | Callable[[], str] = "condition",
) -> T:
    """Poll ``condition`` until it returns something truthy, and return that."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            what = describe() if callable(describe) else describe
            raise TimedOut(f"{what} not reached within {timeout:.1f}s")
        time.sleep(interval)


def wait_for_status(
    app: Any,
    saga_id: str,
    statuses: Iterable[SagaStatus | str],
    *,
    timeout: float = 30.0,
) -> Any:
    """Wait until the saga is in one of ``statuses``; return its state."""
    wanted = {SagaStatus(s) for s in statuses}
    last: list[Any] = [None]

    def reached() -> Any:
        state = app.orchestrator.get(saga_id)
        last[0] = state
        return state if state.status in wanted else None

    def describe() -> str:
        state = last[0]
        now = state.status.value if state is not None else "unknown"
        return f"saga {saga_id} in {sorted(s.value for s in wanted)} (it is {now})"

    return wait_for(reached, timeout=timeout, interval=0.05, describe=describe)


# -- PostgreSQL -----------------------------------------------------------------------------


def _admin_engine(url: str) -> Any:
    return create_engine(
        make_url(url).set(database="postgres"), poolclass=NullPool, isolation_level="AUTOCOMMIT"
    )


def create_database(url: str, template: str | None = None) -> None:
    """Create the database ``url`` names, optionally as a copy of ``template``."""
    name = make_url(url).database
    engine = _admin_engine(url)
    try:
        with engine.connect() as conn:
            suffix = f' TEMPLATE "{template}"' if template else ""
            conn.execute(text(f'CREATE DATABASE "{name}"{suffix}'))
    finally:
        engine.dispose()


def drop_database(url: str) -> None:
    """Drop the database ``url`` names, closing whatever is still connected to it."""
    name = make_url(url).database
    engine = _admin_engine(url)
    try:
        with engine.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        engine.dispose()


def list_databases(url: str, prefix: str) -> list[str]:
    engine = _admin_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                text("SELECT datname FROM pg_database WHERE datname LIKE :p"), {"p": f"{prefix}%"}
            )
            return [r[0] for r in rows]
    finally:
        engine.dispose()


# -- RabbitMQ -------------------------------------------------------------------------------


@dataclass
class RabbitAdmin:
    """Vhosts and queue counts, through the management API or, without it, ``rabbitmqctl``."""

    api: str = "http://127.0.0.1:15672/api"
    user: str = "guest"
    password: str = "guest"  # noqa: S105 - RabbitMQ's local default account

    def _request(self, method: str, path: str, body: Any = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(f"{self.api}{path}", data=data, method=method)  # noqa: S310
        token = base64.b64encode(f"{self.user}:{self.password}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
        request.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310
            payload = response.read()
        return json.loads(payload) if payload else None

    def available(self) -> bool:
        try:
            self._request("GET", "/overview")
        except (urllib.error.URLError, OSError):
            return False
        return True

    def create_vhost(self, name: str) -> None:
        if self.available():
            self._request("PUT", f"/vhosts/{quote(name, safe='')}")
            self._request(
                "PUT",
                f"/permissions/{quote(name, safe='')}/{self.user}",
                {"configure": ".*", "write": ".*", "read": ".*"},
            )
            return
        subprocess.run(["rabbitmqctl", "add_vhost", name], check=True, capture_output=True)
        subprocess.run(
            ["rabbitmqctl", "set_permissions", "-p", name, self.user, ".*", ".*", ".*"],
            check=True,
            capture_output=True,
        )

    def delete_vhost(self, name: str) -> None:
        if self.available():
            with contextlib.suppress(urllib.error.HTTPError):
                self._request("DELETE", f"/vhosts/{quote(name, safe='')}")
            return
        subprocess.run(["rabbitmqctl", "delete_vhost", name], check=False, capture_output=True)

    def vhosts(self, prefix: str) -> list[str]:
        if self.available():
            return [
                v["name"] for v in self._request("GET", "/vhosts") if v["name"].startswith(prefix)
            ]
        out = subprocess.run(
            ["rabbitmqctl", "list_vhosts", "-q"], check=True, capture_output=True, text=True
        ).stdout
        return [line.strip() for line in out.splitlines() if line.strip().startswith(prefix)]


def queue_depths(broker_url: str, queues: Sequence[str]) -> dict[str, int]:
    """Ready messages per queue, read with passive declares over AMQP."""
    from kombu import Connection

    depths: dict[str, int] = {}
    with Connection(broker_url) as conn:
        for name in queues:
            channel: Any = conn.channel()
            try:
                _, count, _ = channel.queue_declare(queue=name, passive=True)
                depths[name] = int(count)
            finally:
                channel.close()
    return depths


@dataclass
class Isolation:
    """A vhost and a database of one's own for one test run, and the URLs to reach them."""

    admin_database_url: str = "postgresql+psycopg2://postgres@127.0.0.1:5432/postgres"
    broker_host: str = "guest:guest@127.0.0.1:5672"
    prefix: str = "saga_test_"
    template: str | None = None
    name: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    rabbit: RabbitAdmin = field(default_factory=RabbitAdmin)

    @property
    def ident(self) -> str:
        return f"{self.prefix}{self.name}"

    @property
    def database_url(self) -> str:
        return str(
            make_url(self.admin_database_url).set(database=self.ident).render_as_string(False)
        )

    @property
    def broker_url(self) -> str:
        return f"amqp://{self.broker_host}/{self.ident}"

    def __enter__(self) -> Isolation:
        self.rabbit.create_vhost(self.ident)
        try:
            create_database(self.database_url, template=self.template)
        except Exception:
            self.rabbit.delete_vhost(self.ident)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            drop_database(self.database_url)
        finally:
            self.rabbit.delete_vhost(self.ident)

    def env(self, **extra: str) -> dict[str, str]:
        """Environment for a subprocess that should use this isolation."""
        return {"SAGA_DATABASE_URL": self.database_url, "SAGA_BROKER_URL": self.broker_url, **extra}


# -- worker processes ----------------------------------------------------------------------


class WorkerProcess:
    """One ``celery worker`` or ``celery beat`` process in a process group of its own."""

    def __init__(
        self,
        app: str,
        *,
        queues: Sequence[str] = (),
        name: str = "worker",
        pool: str = "solo",
        concurrency: int = 1,
        env: Mapping[str, str] | None = None,
        log_dir: Path,
        beat: bool = False,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.app = app
        self.queues = tuple(queues)
        self.name = name
        self.pool = pool
        self.concurrency = concurrency
        self.env = {**os.environ, **(env or {})}
        self.log_path = log_dir / f"{name}.log"
        self.beat = beat
        self.extra_args = tuple(extra_args)
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0
        log_dir.mkdir(parents=True, exist_ok=True)

    def command(self) -> list[str]:
        celery = [sys.executable, "-m", "celery", "-A", self.app]
        if self.beat:
            schedule = self.log_path.with_suffix(".schedule")
            return [*celery, "beat", "--loglevel", "INFO", "-s", str(schedule), *self.extra_args]
        return [
            *celery,
            "worker",
            "-Q",
            ",".join(self.queues),
            "-n",
            # A fresh node name per start: a killed node's exclusive queues may linger.
            f"{self.name}-{self.starts}@%h",
            "-P",
            self.pool,
            "-c",
            str(self.concurrency),
            "--loglevel",
            "INFO",
            "--without-mingle",
            "--without-gossip",
            *self.extra_args,
        ]

    def start(self, *, wait: bool = True, timeout: float = 60.0) -> WorkerProcess:
        if self.process is not None and self.process.poll() is None:
            raise RuntimeError(f"{self.name} is already running")
        self.starts += 1
        with self.log_path.open("ab") as log:
            log.write(f"\n=== start {self.starts} ===\n".encode())
        marker_offset = self.log_path.stat().st_size
        log_file = self.log_path.open("ab")
        self.process = subprocess.Popen(
            self.command(),
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=self.env,
            start_new_session=True,
        )
        log_file.close()
        if wait:
            ready = "beat: Starting" if self.beat else " ready."

            def is_ready() -> bool:
                if self.process is not None and self.process.poll() is not None:
                    raise RuntimeError(
                        f"{self.name} exited with {self.process.returncode}:\n{self.tail()}"
                    )
                with self.log_path.open("rb") as f:
                    f.seek(marker_offset)
                    return ready.encode() in f.read()

            wait_for(is_ready, timeout=timeout, interval=0.1, describe=f"{self.name} ready")
        return self

    @property
    def pid(self) -> int:
        if self.process is None:
            raise RuntimeError(f"{self.name} is not started")
        return self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal the whole process group (the worker and its pool children)."""
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, sig)
        if sig == signal.SIGKILL:
            self.process.wait(timeout=30)

    def stop(self, timeout: float = 20.0) -> None:
        """Warm shutdown (SIGTERM); SIGKILL whatever is left after ``timeout``."""
        if self.process is None:
            return
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=timeout)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)

    def tail(self, lines: int = 40) -> str:
        try:
            content = self.log_path.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return ""
        return "\n".join(content[-lines:])

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")
