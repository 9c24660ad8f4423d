"""Supervising ``celery worker`` and ``celery beat`` processes (demo, chaos, tests).

Each process runs in a process group of its own, so a signal reaches the worker
and its pool children alike, as an OOM kill or a node failure would.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from saga_tasks.messaging.admin import consumed

T = TypeVar("T")


def service_env(env: Mapping[str, str], service: str, users: Path | None = None) -> dict[str, str]:
    """The environment of one service's process (``orchestrator`` or a participant's name):
    with ``users`` (the env files of ``saga-tasks broker users``), its own broker user; a
    participant's, its own database only, the orchestrator's not even named (when
    participants have databases of their own)."""
    from saga_tasks.config import Settings
    from saga_tasks.ops.broker_users import read_env

    found = {**env, **(read_env(users, service) if users is not None else {})}
    settings = Settings.from_env(found)
    if service == "orchestrator" or not settings.participants_apart:
        return found
    url = settings.participant_database(service)
    return {**found, "SAGA_DATABASE_URL": "", "SAGA_PARTICIPANT_DATABASE_URL": f"{service}={url}"}


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


@contextlib.contextmanager
def exit_on_sigterm() -> Any:
    """Turn SIGTERM into ``SystemExit`` while inside, so ``finally`` blocks stop the
    workers and drop the vhost and database a run made, as Ctrl-C does."""

    def stop(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


_READY = {
    "worker": " ready.",
    "beat": "beat: Starting",
    "flower": "Visit me at",
    "web": "Uvicorn running",
}


class WorkerProcess:
    """One ``celery worker``, ``beat`` or ``flower`` process in a process group of its own."""

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
        role: str = "worker",
        extra_args: Sequence[str] = (),
        log_level: str = "INFO",
        broker_url: str | None = None,
    ) -> None:
        if role not in _READY:
            raise ValueError(f"role must be one of {sorted(_READY)}")
        self.app = app
        self.queues = tuple(queues)
        self.name = name
        self.pool = pool
        self.concurrency = concurrency
        self.env = {**os.environ, **(env or {})}
        self.log_path = log_dir / f"{name}.log"
        self.role = role
        self.log_level = log_level
        # Below INFO the worker does not say it is ready: ask the broker for its consumers.
        self.broker_url = broker_url
        self.extra_args = tuple(extra_args)
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self._marker_offset = 0
        log_dir.mkdir(parents=True, exist_ok=True)

    def command(self) -> list[str]:
        celery = [sys.executable, "-m", "celery", "-A", self.app]
        if self.role == "beat":
            schedule = self.log_path.with_suffix(".schedule")
            return [*celery, "beat", "--loglevel", "INFO", "-s", str(schedule), *self.extra_args]
        if self.role == "flower":
            return [*celery, "flower", "--logging=info", *self.extra_args]
        if self.role == "web":
            return [sys.executable, "-m", "saga_tasks.ops.cli", "web", *self.extra_args]
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
            self.log_level,
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
        self._marker_offset = marker_offset
        if wait:
            self.wait_ready(timeout=timeout)
        return self

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait for the line that says this start is ready (or, for a quiet worker, for
        its consumers on the broker); raise if the process exits."""
        ready = _READY[self.role].encode()
        quiet = self.role == "worker" and self.log_level.upper() not in ("DEBUG", "INFO")

        def is_ready() -> bool:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with {self.process.returncode}:\n{self.tail()}"
                )
            if quiet:
                return self._consuming()
            with self.log_path.open("rb") as f:
                f.seek(self._marker_offset)
                return ready in f.read()

        wait_for(is_ready, timeout=timeout, interval=0.1, describe=f"{self.name} ready")

    def _consuming(self) -> bool:
        if not self.broker_url:
            raise RuntimeError("a quiet worker needs broker_url to tell when it is ready")
        return consumed(self.broker_url, self.queues)

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


class Supervisor:
    """Keeps a set of processes running: starts them, restarts any that dies, stops all.

    ``on_restart(process)`` is called for each restart (progress lines, counters);
    ``on_change(processes)`` whenever a pid changes (a pid file for ``--stop``).
    """

    def __init__(
        self,
        processes: Sequence[WorkerProcess],
        *,
        on_restart: Callable[[WorkerProcess], None] | None = None,
        on_change: Callable[[Sequence[WorkerProcess]], None] | None = None,
    ) -> None:
        self.processes = list(processes)
        self.restarts = 0
        self._on_restart = on_restart
        self._on_change = on_change
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._watch: threading.Thread | None = None

    def start(self, timeout: float = 90.0) -> None:
        for process in self.processes:
            process.start(wait=False)
        self._changed()
        for process in self.processes:
            process.wait_ready(timeout=timeout)
        self._watch = threading.Thread(target=self._supervise, daemon=True, name="supervisor")
        self._watch.start()

    def _supervise(self) -> None:
        while not self._stop.wait(0.3):
            with self._lock:
                for process in self.processes:
                    if self._stop.is_set() or process.alive():
                        continue
                    self.restarts += 1
                    if self._on_restart is not None:
                        self._on_restart(process)
                    process.start(wait=False)
                    self._changed()

    def kill(self, process: WorkerProcess, sig: int = signal.SIGKILL) -> None:
        """Kill one supervised process; it is restarted like any that dies."""
        with self._lock:
            process.kill(sig)

    def stop(self) -> None:
        self._stop.set()
        if self._watch is not None:
            self._watch.join(timeout=5)
        for process in reversed(self.processes):
            process.stop(timeout=15)

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change(self.processes)
