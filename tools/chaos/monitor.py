"""Invariants that only show while a chaos run goes on, sampled from the database.

Once a second (by default) the monitor reads the active sagas and looks for:

- **a dead end**: an active saga with nothing in flight (by the saga model: a step's
  command, its compensation, or the fence of a command of a step done by hand) and no
  future ``next_wake_at``: nothing will ever move it;
- **a sweep that claims without progress**: the sweeper claims due sagas in order of
  ``next_wake_at`` (SKIP LOCKED). So when, between two samples, the sweeper moved a
  saga T (a history entry of its own: actor ``system``, neither causation nor message
  id, which leaves out the notes on duplicate messages; or a repaired wake-up time at
  the same version), every saga S that was due with a wake-up no later than T's was
  claimed by that pass too. If S is still due at the same version and wake-up, that
  pass claimed it and made no progress. Seen in three sample intervals (so at least
  two sweep passes), it is a violation;
- **an overdue saga**: due, unchanged, for longer than ``overdue_after`` seconds (a
  sweeper that never reaches it, whatever the reason). Time while a service is down,
  and ``outage_grace`` seconds after it is back (workers reconnect with a back-off),
  does not count.

The monitor has a connection of its own per sample, so a database restart costs it
only the samples taken while the database is away.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

STRIKES = 3
"""Sample intervals in which a sweep passed a saga by without progress, for a violation."""

_DUE = text(
    """SELECT saga_id::text, version, next_wake_at, status FROM saga.saga_instance
       WHERE status IN ('RUNNING', 'COMPENSATING') AND next_wake_at <= :now"""
)
_NOW = text(
    """SELECT saga_id::text, version, next_wake_at, status FROM saga.saga_instance
       WHERE saga_id = ANY(CAST(:ids AS uuid[]))"""
)
_SWEPT = text(
    """SELECT DISTINCT saga_id::text FROM saga.saga_history
       WHERE saga_id = ANY(CAST(:ids AS uuid[])) AND at > :since AND actor = 'system'
       AND causation_id IS NULL AND message_id IS NULL
       AND event NOT IN ('saga_started', 'demo_fault')"""
)
_IDLE = text(
    """SELECT saga_id::text FROM saga.saga_instance
       WHERE status IN ('RUNNING', 'COMPENSATING')
       AND (next_wake_at IS NULL OR next_wake_at <= :now)"""
)


def in_flight(step: Any) -> bool:
    """What the saga model says is out and awaited for a step (a command, a
    compensation, or the fence of a command of a step done by hand)."""
    from saga_tasks.core.states import IN_FLIGHT

    said = getattr(step, "in_flight", None)
    return bool(said) if said is not None else step.status in IN_FLIGHT


@dataclass(frozen=True)
class Due:
    version: int
    wake: datetime
    status: str


@dataclass
class Finding:
    kind: str
    saga_id: str
    at: float
    """Seconds into the run when it was first seen."""
    detail: str

    def line(self) -> str:
        return f"saga {self.saga_id} ({self.kind}, at {self.at:.0f}s): {self.detail}"


@dataclass
class Monitor:
    database_url: str
    started_at: float
    interval: float = 1.0
    overdue_after: float = 30.0
    outage_grace: float = 15.0
    outages: Callable[[], list[tuple[float, float]]] = list
    """(from, to) in seconds into the run of each outage so far."""
    findings: dict[tuple[str, str], Finding] = field(default_factory=dict)
    samples: int = 0
    missed: int = 0
    max_overdue: float = 0.0
    stall_strikes: dict[str, int] = field(default_factory=dict)
    _previous: tuple[datetime, dict[str, Due]] | None = None
    _first_due: dict[tuple[str, int, datetime], float] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self._engine = create_engine(
            self.database_url, poolclass=NullPool, connect_args={"connect_timeout": 3}
        )

    def start(self) -> None:
        self._thread = threading.Thread(target=self._work, daemon=True, name="monitor")
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self._engine.dispose()

    def _work(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.sample()
            except Exception:  # noqa: BLE001 - the database is away: skip this sample
                self.missed += 1
                self._previous = None

    def flagged(self) -> set[str]:
        """Sagas with a finding: the run does not wait for them to end."""
        with self._lock:
            return {saga_id for _, saga_id in self.findings}

    def violations(self) -> list[str]:
        with self._lock:
            return [f.line() for f in sorted(self.findings.values(), key=lambda f: f.at)]

    def _found(self, kind: str, saga_id: str, detail: str) -> None:
        with self._lock:
            if (kind, saga_id) not in self.findings:
                at = time.monotonic() - self.started_at
                self.findings[(kind, saga_id)] = Finding(kind, saga_id, at, detail)

    def sample(self) -> None:
        now = datetime.now(UTC)
        with self._engine.connect() as conn:
            due = {r[0]: Due(int(r[1]), r[2], r[3]) for r in conn.execute(_DUE, {"now": now})}
            self._dead_ends(conn, now)
            if self._previous is not None:
                self._stalls(conn, *self._previous, now, due)
        self._overdue(now, due)
        self._previous = (now, due)
        self.samples += 1

    def _dead_ends(self, conn: Any, now: datetime) -> None:
        """Active sagas with nothing in flight, by the saga model, and no future wake-up."""
        from saga_tasks.persistence.sagas import load

        for (saga_id,) in conn.execute(_IDLE, {"now": now}):
            state = load(conn, saga_id)
            if state is None or state.status.value not in ("RUNNING", "COMPENSATING"):
                continue
            wake = state.next_wake_at()
            if any(in_flight(st) for st in state.steps.values()) or (wake and wake > now):
                continue
            steps = " ".join(f"{n}={st.status.value}" for n, st in state.steps.items())
            self._found(
                "dead end",
                saga_id,
                f"{state.status.value} v{state.version} with no command in flight and "
                f"next_wake_at {wake} ({steps})",
            )

    def _stalls(
        self,
        conn: Any,
        since: datetime,
        before: Mapping[str, Due],
        now: datetime,
        due: Mapping[str, Due],
    ) -> None:
        if not before:
            return
        moved = [i for i, d in before.items() if _key(due.get(i)) != _key(d)]
        current: dict[str, Due] = {}
        if moved:
            current = {r[0]: Due(int(r[1]), r[2], r[3]) for r in conn.execute(_NOW, {"ids": moved})}
        repaired = {
            i
            for i in moved
            if i in current
            and current[i].version == before[i].version
            and current[i].wake != before[i].wake
        }
        bumped = [i for i in moved if i not in repaired]
        swept = set(repaired)
        if bumped:
            swept |= {r[0] for r in conn.execute(_SWEPT, {"ids": bumped, "since": since})}
        if not swept:
            return
        frontier = max(before[i].wake for i in swept)
        for saga_id, d in before.items():
            if saga_id in swept or _key(due.get(saga_id)) != _key(d) or d.wake > frontier:
                continue
            strikes = self.stall_strikes.get(saga_id, 0) + 1
            self.stall_strikes[saga_id] = strikes
            if strikes >= STRIKES:
                self._found(
                    "claimed without progress",
                    saga_id,
                    f"{d.status} v{d.version}, next_wake_at {d.wake.isoformat()}: due and "
                    f"unchanged while sweeps moved sagas due after it, in {strikes} samples",
                )
        for saga_id in moved:
            self.stall_strikes.pop(saga_id, None)

    def _overdue(self, now: datetime, due: Mapping[str, Due]) -> None:
        at = time.monotonic() - self.started_at
        seen = {}
        for saga_id, d in due.items():
            key = (saga_id, d.version, d.wake)
            first = self._first_due.get(key, at)
            seen[key] = first
            lag = (now - d.wake).total_seconds()
            self.max_overdue = max(self.max_overdue, lag)
            if self._counted(first, at) > self.overdue_after:
                self._found(
                    "overdue",
                    saga_id,
                    f"{d.status} v{d.version}: next_wake_at {d.wake.isoformat()} passed "
                    f"{lag:.0f}s ago and nothing moved it for {self.overdue_after:.0f}s "
                    "with the services up",
                )
        self._first_due = seen

    def _counted(self, since: float, until: float) -> float:
        """Seconds between two moments of the run, outages and their grace left out."""
        merged: list[list[float]] = []
        for start, back in sorted(self.outages()):
            end = back + self.outage_grace
            if merged and start <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        counted = until - since
        for start, end in merged:
            counted -= max(min(until, end) - max(since, start), 0.0)
        return counted

    def report(self) -> dict[str, Any]:
        return {
            "samples": self.samples,
            "samples_missed": self.missed,
            "max_overdue_seconds": round(self.max_overdue, 1),
        }


def _key(d: Due | None) -> tuple[int, datetime] | None:
    return None if d is None else (d.version, d.wake)
