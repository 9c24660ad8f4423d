"""What a purge costs: sagas purged per second, how long each batch holds its locks, and
the latency of a writer on active sagas (the hot path's saga update and history insert)
beside it, idle and during the purge.

    python -m tools.purge_measure [SAGAS]

In a database of its own (made and dropped here): SAGAS sagas, one in ten active, the
rest finished 40 days ago, each with 4 steps, 10 history lines, 4 inbox and 4 outbox rows.
"""

from __future__ import annotations

import statistics
import sys
import threading
import time
from datetime import UTC, datetime, timedelta

from sqlalchemy import Engine, create_engine, text
from sqlalchemy.pool import NullPool

from saga_tasks.ops.isolation import Isolation
from saga_tasks.persistence import purge
from saga_tasks.persistence.migrate import upgrade

BATCH = 500
FILL = (
    """INSERT INTO saga.saga_instance (saga_id, saga_type, definition_version, business_key,
         status, version, payload, payload_hash, correlation_id, created_at, updated_at,
         finished_at)
       SELECT gen_random_uuid(), 'order', 1, 'k-' || g,
         CASE WHEN g % 10 = 0 THEN 'RUNNING' ELSE 'COMPLETED' END, 8, '{}'::jsonb, 'h', 'c',
         :old, :old, CASE WHEN g % 10 = 0 THEN NULL ELSE :old + g * interval '1 ms' END
       FROM generate_series(1, :n) g""",
    """INSERT INTO saga.saga_step (saga_id, step, position, status, attempt,
         compensation_attempt, generation, given_up)
       SELECT s.saga_id, 'step' || p, p, 'SUCCEEDED', 1, 0, 1, false
       FROM saga.saga_instance s, generate_series(1, 4) p""",
    """INSERT INTO saga.saga_history (saga_id, at, event, actor)
       SELECT s.saga_id, :old, 'ev' || p, 'system'
       FROM saga.saga_instance s, generate_series(1, 10) p""",
    """INSERT INTO saga.inbox (consumer, message_id, saga_id)
       SELECT 'orchestrator', gen_random_uuid()::text, s.saga_id
       FROM saga.saga_instance s, generate_series(1, 4) p""",
    """INSERT INTO saga.outbox (message_id, saga_id, task_name, queue, headers, body,
         published_at)
       SELECT gen_random_uuid(), s.saga_id, 't', 'q', '{}', '{}', :old
       FROM saga.saga_instance s, generate_series(1, 4) p""",
)
WRITE = (
    "UPDATE saga.saga_instance SET version = version + 1, updated_at = now() WHERE saga_id = :id",
    "INSERT INTO saga.saga_history (saga_id, at, event, actor) VALUES (:id, now(), 'w', 'x')",
)


class Writer(threading.Thread):
    """Writes to active sagas as the orchestrator does, timing each transaction."""

    def __init__(self, url: str, sagas: list[str]) -> None:
        super().__init__(daemon=True)
        self.url, self.sagas = url, sagas
        self.latencies: list[float] = []
        self.halt = threading.Event()

    def run(self) -> None:
        engine = create_engine(self.url, poolclass=NullPool)
        with engine.connect() as conn:
            i = 0
            while not self.halt.is_set():
                began = time.perf_counter()
                with conn.begin():
                    for sql in WRITE:
                        conn.execute(text(sql), {"id": self.sagas[i % len(self.sagas)]})
                self.latencies.append(time.perf_counter() - began)
                i += 1
        engine.dispose()


def _ms(values: list[float], share: float) -> float:
    return sorted(values)[int(share * (len(values) - 1))] * 1000


def _fill(engine: Engine, sagas: int) -> list[str]:
    old = datetime.now(UTC) - timedelta(days=40)
    with engine.begin() as conn:
        for sql in FILL:
            conn.execute(text(sql), {"old": old, "n": sagas})
    with engine.connect() as conn:
        conn.execute(text("ANALYZE"))
        found = conn.execute(
            text("SELECT saga_id::text FROM saga.saga_instance WHERE status = 'RUNNING' LIMIT 200")
        )
        return [str(r) for r in found.scalars()]


def main(sagas: int) -> None:
    with Isolation(prefix="saga_pmeasure_") as iso:
        upgrade(iso.database_url)
        engine = create_engine(iso.database_url, poolclass=NullPool)
        active = _fill(engine, sagas)
        idle = Writer(iso.database_url, active)
        idle.start()
        time.sleep(5)
        idle.halt.set()
        idle.join()
        busy = Writer(iso.database_url, active)
        busy.start()
        batches, purged, began = [], 0, time.perf_counter()
        while True:
            one = time.perf_counter()
            with engine.begin() as conn:
                now = datetime.now(UTC)
                done = purge.purge_batch(
                    conn, before=now - timedelta(days=30), now=now, limit=BATCH
                )
            batches.append(time.perf_counter() - one)
            purged += done
            if done < BATCH:
                break
        elapsed = time.perf_counter() - began
        busy.halt.set()
        busy.join()
        engine.dispose()
    quiet, during = idle.latencies, busy.latencies
    say = sys.stdout.write
    say(f"purged {purged} sagas in {elapsed:.1f} s = {purged / elapsed:.0f} sagas/s\n")
    say(
        f"a batch of {BATCH}: median {statistics.median(batches) * 1000:.0f} ms, "
        f"max {max(batches) * 1000:.0f} ms\n"
    )
    say(
        f"writer on active sagas: idle p50 {_ms(quiet, 0.5):.2f} ms, p99 {_ms(quiet, 0.99):.2f} "
        f"ms; during the purge p50 {_ms(during, 0.5):.2f} ms, p99 {_ms(during, 0.99):.2f} ms, "
        f"max {max(during) * 1000:.1f} ms\n"
    )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 50_000)
