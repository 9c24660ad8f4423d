"""An operator acting at random while a chaos run goes on, as a person at the CLI would.

Every few seconds it picks one of the run's sagas (in MANUAL_REVIEW first, then a held
message, a running or a compensating saga), looks at it with the function ``saga-tasks show``
uses, chooses one of the actions that fit what it sees (retry a step or its
compensation, skip a step, compensate, replay a held message) and takes it through the
function the CLI takes it with (``saga_tasks.ops.operator.act``,
``SagaApp.replayer.replay``), stating the version it looked at. A saga that moved
meanwhile refuses the action (``VersionMismatch``), as it would refuse a person; so
does a state the action does not fit (``ActionRefused``). A replay the checks refuse
is sometimes forced, with a reason, to put the fences behind the checks to the test.

Each attempt is recorded with its outcome; the accepted ones are checked against the
sagas' history at the end of the run (``checks.operator_accounting``).
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from saga_tasks.errors import (
    ActionRefused,
    InputError,
    SagaNotFound,
    ServiceUnavailable,
    VersionMismatch,
)
from tools.chaos.checks import Done

ACTOR = "chaos-operator"
POOLS = {"MANUAL_REVIEW": 4, "held": 3, "RUNNING": 2, "COMPENSATING": 1}
RETRYABLE = ("COMPENSATING", "COMPENSATION_FAILED", "REQUESTED", "TIMED_OUT")


@dataclass(frozen=True)
class Attempt:
    at: float
    verb: str
    target: str
    step: str | None
    outcome: str
    """done, refused, stale, unavailable or error."""
    detail: str = ""


@dataclass
class RandomOperator:
    app: Any
    database_url: str
    rng: random.Random
    every: float
    started_at: float
    force_ratio: float = 0.3
    keys: str = "chaos-"
    """The business keys of the run's sagas start with this: it acts on no other saga."""
    actor: str = ACTOR
    attempts: list[Attempt] = field(default_factory=list)
    done: list[Done] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __post_init__(self) -> None:
        self._engine = create_engine(
            self.database_url, poolclass=NullPool, connect_args={"connect_timeout": 3}
        )

    def start(self) -> None:
        self._thread = threading.Thread(target=self._work, daemon=True, name="operator")
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
        self._engine.dispose()

    def _work(self) -> None:
        while not self._stop.wait(self.every):
            try:
                self.act_once()
            except (ServiceUnavailable, OSError) as exc:
                self._record("look", "-", None, "unavailable", str(exc))
            except Exception as exc:  # noqa: BLE001 - recorded with the run
                if _database_away(exc):
                    self._record("look", "-", None, "unavailable", str(exc)[:200])
                else:
                    self._record("look", "-", None, "error", f"{type(exc).__name__}: {exc}")

    # -- choosing -------------------------------------------------------------------------

    def act_once(self) -> None:
        pools = list(POOLS)
        weights = [POOLS[p] for p in pools]
        while pools:
            pool = self.rng.choices(pools, weights)[0]
            i = pools.index(pool)
            del pools[i], weights[i]
            target = self._candidate(pool)
            if target is None:
                continue
            if pool == "held":
                self._replay(int(target))
            else:
                self._act_on(target)
            return

    def _candidate(self, pool: str) -> str | None:
        """A random saga of this run in ``pool``'s status, or a held message of one."""
        with self._engine.connect() as conn:
            if pool == "held":
                row = conn.execute(
                    text(
                        "SELECT h.id::text FROM saga.held_message h "
                        "JOIN saga.saga_instance s ON s.saga_id = h.saga_id "
                        "WHERE h.status = 'pending' AND s.business_key LIKE :keys "
                        "ORDER BY random() LIMIT 1"
                    ),
                    {"keys": f"{self.keys}%"},
                ).first()
            else:
                row = conn.execute(
                    text(
                        "SELECT saga_id::text FROM saga.saga_instance WHERE status = :s "
                        "AND business_key LIKE :keys ORDER BY random() LIMIT 1"
                    ),
                    {"s": pool, "keys": f"{self.keys}%"},
                ).first()
        return None if row is None else str(row[0])

    def _act_on(self, saga_id: str) -> None:
        from saga_tasks.ops.views import saga_view

        view = saga_view(self.app, saga_id)  # what `saga-tasks show` prints
        status = view["status"]
        options: list[tuple[str, str | None]] = []
        for s in view["steps"]:
            fits = (
                s["status"] == "REQUESTED"
                if status == "RUNNING"
                else s["status"] in ("COMPENSATING", "COMPENSATION_FAILED")
                if status == "COMPENSATING"
                else s["status"] in RETRYABLE
            )
            if fits:
                options += [("retry_step", s["step"]), ("skip_step", s["step"])]
        if status in ("RUNNING", "MANUAL_REVIEW"):
            options.append(("compensate", None))
        held = [
            m["id"]
            for m in view.get("held_messages", [])
            if m["status"] == "pending" and m["holding"] == "dead_letter"
        ]
        if status == "MANUAL_REVIEW" and held:
            options += [("replay", None)] * 2
        if not options:
            self._record("look", saga_id, None, "refused", f"nothing fits a {status} saga")
            return
        verb, step = self.rng.choice(options)
        if verb == "replay":
            self._replay(int(self.rng.choice(held)))
            return
        self._act(saga_id, verb, step, int(view["version"]))

    # -- acting ---------------------------------------------------------------------------

    def _act(self, saga_id: str, verb: str, step: str | None, version: int) -> None:
        from saga_tasks.ops.operator import act

        reason = f"chaos run: {verb.replace('_', '-')} chosen at random"
        try:
            act(self.app, saga_id, verb, actor=self.actor, reason=reason,
                expect_version=version, step=step)  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - every outcome is recorded
            self._record(verb, saga_id, step, _outcome(exc), str(exc)[:300])
            return
        self.done.append(Done(saga_id, verb, self.actor, step))
        self._record(verb, saga_id, step, "done")

    def _replay(self, held_id: int) -> None:
        from saga_tasks.ops.views import held_show

        view = held_show(self.app, held_id)  # what `saga-tasks dlq show` prints
        saga_id = view["saga_id"]
        reason = "chaos run: replay chosen at random"
        forced_because = "chaos run: forced, the fences must hold"
        force = False
        for _ in range(2):
            verb = "replay (forced)" if force else "replay"
            try:
                self.app.replayer.replay(held_id, actor=self.actor, reason=reason, force=force,
                       force_reason=forced_because if force else None)  # fmt: skip
            except ActionRefused as exc:
                self._record(verb, f"held {held_id}", view["step"], "refused", str(exc)[:300])
                if force or self.rng.random() >= self.force_ratio:
                    return
                force = True
                continue
            except Exception as exc:  # noqa: BLE001 - every outcome is recorded
                self._record(verb, f"held {held_id}", view["step"], _outcome(exc), str(exc)[:300])
                return
            if saga_id is not None and self._saga_exists(saga_id):
                self.done.append(Done(saga_id, "replay", self.actor, view["step"]))
            self._record(verb, f"held {held_id}", view["step"], "done")
            return

    def _saga_exists(self, saga_id: str) -> bool:
        with self._engine.connect() as conn:
            return (
                conn.execute(
                    text("SELECT 1 FROM saga.saga_instance WHERE saga_id = CAST(:i AS uuid)"),
                    {"i": saga_id},
                ).first()
                is not None
            )

    def _record(
        self, verb: str, target: str, step: str | None, outcome: str, detail: str = ""
    ) -> None:
        at = time.monotonic() - self.started_at
        self.attempts.append(Attempt(at, verb, target, step, outcome, detail))

    # -- reporting ------------------------------------------------------------------------

    def report(self) -> dict[str, Any]:
        counts: Counter[str] = Counter(f"{a.verb}: {a.outcome}" for a in self.attempts)
        return {
            "attempts": len(self.attempts),
            "done": len(self.done),
            "by_outcome": dict(sorted(counts.items())),
            "errors": [
                f"{a.at:.0f}s {a.verb} {a.target} {a.step or ''}: {a.detail}"
                for a in self.attempts
                if a.outcome == "error"
            ],
        }


def _outcome(exc: BaseException) -> str:
    if isinstance(exc, VersionMismatch):
        return "stale"
    if isinstance(exc, ActionRefused | SagaNotFound | InputError):
        return "refused"
    if isinstance(exc, ServiceUnavailable) or _database_away(exc):
        return "unavailable"
    return "error"


def _database_away(exc: BaseException) -> bool:
    from sqlalchemy.exc import DBAPIError

    if not isinstance(exc, DBAPIError):
        return False
    return bool(exc.connection_invalidated) or "connect" in str(exc).lower()
