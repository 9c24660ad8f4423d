"""The timeout sweeper benchmarked on a large table: an empty pass by table size, then
passes with 1,000 and 10,000 sagas due, each with the plan PostgreSQL chose."""

from __future__ import annotations

import json
import statistics
import time
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from tools.bench.report import say
from tools.bench.workloads import ORDER


def sweep_bench(args: Any, database_url: str, broker_url: str) -> dict[str, Any]:
    """The sweeper on 1,000,000 sagas with 0, 1,000 and 10,000 due: time per pass and plan."""
    from datetime import UTC, datetime

    from participants.app import saga_app
    from saga_tasks.persistence.sagas import claim_due

    engine = create_engine(database_url, poolclass=NullPool)
    rows = args.sweep_rows

    def empty_pass_ms() -> float:
        """The query the sweeper runs every interval, when nothing is due: p50 of 20."""
        timings = []
        for _ in range(20):
            t = time.perf_counter()
            with saga_app.engine.begin() as conn:
                claim_due(conn, datetime.now(UTC), 500)
            timings.append((time.perf_counter() - t) * 1000)
        return round(statistics.median(timings), 3)

    # One saga in ten active (its wake-up a day away), as in a busy deployment.
    empty_by_size: dict[str, float] = {}
    filled = 0
    for size in sorted({min(100_000, rows), rows}):
        say(args, f"sweep: filling to {size} sagas")
        with engine.begin() as conn:
            conn.execute(
                text(
                    """INSERT INTO saga.saga_instance (saga_id, saga_type, definition_version,
                       business_key, status, version, payload, payload_hash, correlation_id,
                       created_at, updated_at, deadline, next_wake_at)
                       SELECT gen_random_uuid(), 'order', 1, 'sw-' || g,
                              CASE WHEN g % 10 = 0 THEN 'RUNNING' ELSE 'COMPLETED' END, 1,
                              '{}'::jsonb, 'h', 'c', now(), now(), now() + interval '1 day',
                              CASE WHEN g % 10 = 0 THEN now() + interval '1 day' END
                       FROM generate_series(:first, :last) g"""
                ),
                {"first": filled + 1, "last": size},
            )
        filled = size
        with engine.connect() as conn:
            conn.execute(text("ANALYZE saga.saga_instance"))
            conn.commit()
        empty_by_size[str(size)] = empty_pass_ms()
        say(args, f"sweep: an empty pass over {size} sagas: {empty_by_size[str(size)]} ms")
    report: dict[str, Any] = {"rows": rows, "empty_pass_ms_by_rows": empty_by_size, "passes": {}}
    for due in (0, 1_000, 10_000):
        if due:
            with engine.begin() as conn:
                # Due sagas with a step in flight, as a lost reply would leave them.
                conn.execute(
                    text(
                        """WITH picked AS (
                             SELECT saga_id FROM saga.saga_instance i
                             WHERE status = 'RUNNING' AND next_wake_at > now()
                               AND NOT EXISTS (SELECT FROM saga.saga_step st
                                               WHERE st.saga_id = i.saga_id)
                             LIMIT :n)
                           UPDATE saga.saga_instance s SET next_wake_at = now() - interval '1 second',
                                  payload = :p
                           FROM picked WHERE s.saga_id = picked.saga_id"""
                    ),
                    {"n": due, "p": json.dumps(ORDER)},
                )
                conn.execute(
                    text(
                        """INSERT INTO saga.saga_step (saga_id, step, position, status, attempt,
                             compensation_attempt, generation, command_id, requested_at, deadline)
                           SELECT s.saga_id, st.name, st.pos,
                                  CASE WHEN st.pos = 0 THEN 'REQUESTED' ELSE 'PENDING' END,
                                  CASE WHEN st.pos = 0 THEN 1 ELSE 0 END, 0, 1,
                                  CASE WHEN st.pos = 0 THEN gen_random_uuid() END,
                                  CASE WHEN st.pos = 0 THEN now() - interval '1 minute' END,
                                  CASE WHEN st.pos = 0 THEN now() - interval '1 second' END
                           FROM saga.saga_instance s,
                                (VALUES ('create_order', 0), ('reserve_stock', 1),
                                        ('authorize_payment', 2), ('confirm_order', 3)) st(name, pos)
                           WHERE s.next_wake_at <= now()
                           ON CONFLICT DO NOTHING"""
                    )
                )
        with engine.connect() as conn:
            plan = [
                r[0]
                for r in conn.execute(
                    text(
                        "EXPLAIN (ANALYZE, BUFFERS) SELECT saga_id FROM saga.saga_instance "
                        "WHERE status IN ('RUNNING', 'COMPENSATING') AND next_wake_at <= now() "
                        "ORDER BY next_wake_at LIMIT 500 FOR UPDATE SKIP LOCKED"
                    )
                )
            ]
            conn.rollback()
        started = time.perf_counter()
        result = saga_app.sweeper.sweep(batch=500, max_batches=1000)
        seconds = time.perf_counter() - started
        empty = empty_pass_ms()
        report["passes"][str(due)] = {
            "due": due,
            "handled": result.claimed,
            "changed": result.changed,
            "seconds": round(seconds, 3),
            "then_empty_pass_ms_p50": empty,
            "plan": plan,
        }
        say(
            args,
            f"sweep: {due} due handled in {seconds:.3f} s; then an empty pass {empty} ms",
        )
    return report
