"""What the benchmark starts and times: Celery chains of the baseline, or order sagas.

Each kind reports how many have finished (a cheap count, polled) and, at the end, when
each started and finished, from timestamps the items record themselves.
"""

from __future__ import annotations

import statistics
import threading
import uuid
from collections.abc import Sequence
from typing import Any, Protocol

from sqlalchemy import text

ORDER = {"customer_id": "c-1", "items": [{"sku": "sku-1", "qty": 1}], "amount_cents": 100}
DECLINED = {"customer_id": "c-low", "items": [{"sku": "sku-1", "qty": 1}], "amount_cents": 5_000}


class Items(Protocol):
    """What the benchmark starts and times: chains or sagas."""

    def start(self, i: int) -> str:
        """Start item ``i``; its key."""
        ...

    def done(self) -> int:
        """How many items have finished so far; cheap, polled."""
        ...

    def timings(self) -> list[tuple[float, float]]:
        """(started, finished) epoch seconds of every finished item, by finish time."""
        ...

    def one(self, key: str) -> tuple[float, float] | None:
        """(started, finished) of one item, or None while it runs."""
        ...


class ChainItems:
    """Chains; the last task pushes ``chain_id:started:finished`` to a Redis list."""

    def __init__(self, baseline: Any, redis: Any, key: str, durable: bool) -> None:
        self.baseline, self.redis, self.key = baseline, redis, key
        self.prefix = f"c-{'d' if durable else 'n'}"

    def start(self, i: int) -> str:
        chain_id = f"{self.prefix}-{i}"
        self.baseline.start_chain(chain_id)
        return chain_id

    def done(self) -> int:
        return int(self.redis.llen(self.key))

    def _parse(self, raw: Any) -> tuple[str, float, float]:
        line = raw.decode() if isinstance(raw, bytes) else str(raw)
        chain_id, started, finished = line.rsplit(":", 2)
        return chain_id, float(started), float(finished)

    def timings(self) -> list[tuple[float, float]]:
        found = [self._parse(raw)[1:] for raw in self.redis.lrange(self.key, 0, -1)]
        return sorted(found, key=lambda p: p[1])

    def one(self, key: str) -> tuple[float, float] | None:
        last = self.redis.lindex(self.key, -1)
        if last is None:
            return None
        chain_id, started, finished = self._parse(last)
        return (started, finished) if chain_id == key else None


class DbosItems(ChainItems):
    """DBOS workflows enqueued through a DBOS queue; the last step pushes its timing to the
    Redis list, as the chains' last task does."""

    def __init__(self, client: Any, redis: Any, key: str) -> None:
        self.client, self.redis, self.key = client, redis, key
        self.prefix = f"d-{uuid.uuid4().hex[:6]}"

    def start(self, i: int) -> str:
        import time

        from tools.bench.dbos_app import QUEUE, WORKFLOW

        order_id = f"{self.prefix}-{i}"
        options = {"queue_name": QUEUE, "workflow_name": WORKFLOW, "workflow_id": order_id}
        self.client.enqueue(options, order_id, time.time())
        return order_id


def active_sagas(engine: Any) -> int:
    """Sagas still running or compensating: a count over the partial index on active sagas."""
    with engine.connect() as conn:
        return int(
            conn.execute(
                text(
                    "SELECT count(*) FROM saga.saga_instance "
                    "WHERE status IN ('RUNNING', 'COMPENSATING')"
                )
            ).scalar_one()
        )


class SagaItems:
    """Order sagas of one run (business keys ``b-<run>-<i>``); 20% declined when mixed."""

    def __init__(self, saga_app: Any, engine: Any, mixed: bool) -> None:
        self.saga_app, self.engine, self.mixed = saga_app, engine, mixed
        self.run_id = uuid.uuid4().hex[:6]
        self.started = 0
        self._lock = threading.Lock()

    def start(self, i: int) -> str:
        declined = self.mixed and i >= 0 and i % 5 == 0
        key = f"b-{self.run_id}-{i}"
        self.saga_app.start_saga("order", key, DECLINED if declined else ORDER)
        with self._lock:
            self.started += 1
        return key

    def done(self) -> int:
        # The run's own database holds no other active saga; this run's started ones
        # minus the active ones are finished (or in manual review: counted by status).
        return self.started - active_sagas(self.engine)

    def timings(self) -> list[tuple[float, float]]:
        with self.engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT extract(epoch FROM created_at), extract(epoch FROM finished_at) "
                    "FROM saga.saga_instance WHERE business_key LIKE :k "
                    "AND finished_at IS NOT NULL ORDER BY finished_at"
                ),
                {"k": f"b-{self.run_id}-%"},
            ).all()
        return [(float(a), float(b)) for a, b in rows]

    def hops(self, first: int, count: int, ledgers: Sequence[Any]) -> dict[str, dict[str, float]]:
        """Per step of the sagas ``first`` .. ``first + count - 1`` (the unloaded ones), the
        median milliseconds from the orchestrator's decision to send the command to its
        participant's transaction (``to_participant``: commit, publish, the broker, the
        participant's receipt) and from there to the reply applied (``to_reply``: the
        handler, commit, publish, the broker, the orchestrator's receipt). Participants
        share the benchmark's database, so their ``ledgers`` are read beside the saga's."""
        from sqlalchemy import func, select, union_all

        from saga_tasks.persistence.tables import saga_instance, saga_step

        claimed = union_all(*(select(t.c.command_id, t.c.created_at) for t in ledgers)).subquery(
            "claimed"
        )
        ms = 1000
        stmt = (
            select(
                saga_step.c.step,
                func.extract("epoch", claimed.c.created_at - saga_step.c.requested_at) * ms,
                func.extract("epoch", saga_step.c.finished_at - claimed.c.created_at) * ms,
            )
            .join(saga_instance, saga_instance.c.saga_id == saga_step.c.saga_id)
            .join(claimed, claimed.c.command_id == saga_step.c.command_id)
            .where(
                saga_instance.c.business_key.in_(
                    [f"b-{self.run_id}-{i}" for i in range(first, first + count)]
                )
            )
            .order_by(saga_step.c.position)
        )
        with self.engine.connect() as conn:
            rows = conn.execute(stmt).all()
        steps: dict[str, tuple[list[float], list[float]]] = {}
        for step, there, back in rows:
            out, home = steps.setdefault(step, ([], []))
            out.append(float(there))
            home.append(float(back))
        return {
            step: {
                "to_participant": round(statistics.median(out), 2),
                "to_reply": round(statistics.median(home), 2),
            }
            for step, (out, home) in steps.items()
        }

    def one(self, key: str) -> tuple[float, float] | None:
        with self.engine.connect() as conn:
            row = conn.execute(
                text(
                    "SELECT extract(epoch FROM created_at), extract(epoch FROM finished_at) "
                    "FROM saga.saga_instance WHERE saga_type = 'order' AND business_key = :k"
                ),
                {"k": key},
            ).first()
        if row is None or row[1] is None:
            return None
        return float(row[0]), float(row[1])

    def statuses(self) -> dict[str, int]:
        with self.engine.connect() as conn:
            return dict(
                conn.execute(
                    text(
                        "SELECT status, count(*) FROM saga.saga_instance "
                        "WHERE business_key LIKE :k GROUP BY 1"
                    ),
                    {"k": f"b-{self.run_id}-%"},
                ).all()
            )
