"""The dashboard, the API and ``/metrics`` timed over a small table of sagas and a large
one: how the cost of each page grows with the table."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import time
import uuid
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from saga_tasks.ops.processes import WorkerProcess
from tools.bench.report import percentiles, say
from tools.bench.workloads import ORDER

WEB_PAGES = (
    ("overview", "/"),
    ("overview, manual review", "/?status=MANUAL_REVIEW"),
    ("saga page", "/ui/sagas/{saga_id}"),
    ("held messages", "/ui/held"),
    ("API list by status", "/sagas?status=RUNNING&limit=50"),
    ("API stuck", "/sagas?stuck=true&limit=50"),
    ("API one saga", "/sagas/{saga_id}"),
    ("metrics", "/metrics"),
)


def fill_sagas(engine: Any, first: int, last: int) -> None:
    """Sagas ``first..last`` spread over the last day, each with four steps and six history
    lines; statuses as a deployment has them (mostly completed, a few still running,
    compensated or waiting for a person)."""
    status = """CASE WHEN g % 100 < 85 THEN 'COMPLETED' WHEN g % 100 < 95 THEN 'COMPENSATED'
                     WHEN g % 100 < 97 THEN 'MANUAL_REVIEW' WHEN g % 100 < 99 THEN 'RUNNING'
                     ELSE 'FAILED' END"""
    with engine.begin() as conn:
        conn.execute(
            text(
                f"""INSERT INTO saga.saga_instance (saga_id, saga_type, definition_version,
                   business_key, status, status_reason, version, payload, payload_hash,
                   correlation_id, created_at, updated_at, finished_at, deadline, next_wake_at)
                   SELECT md5('w' || g)::uuid, 'order', 1, 'web-' || g, {status},
                          CASE WHEN {status} = 'MANUAL_REVIEW' THEN 'conflicting replies' END,
                          6, :payload, 'h', 'c', t, t + interval '2 seconds',
                          CASE WHEN {status} NOT IN ('RUNNING', 'MANUAL_REVIEW')
                               THEN t + interval '2 seconds' END,
                          t + interval '10 minutes',
                          CASE WHEN {status} = 'RUNNING' THEN now() + interval '1 hour' END
                   FROM generate_series(:first, :last) g,
                        LATERAL (SELECT now() - (g % 86400) * interval '1 second' AS t) at"""  # noqa: S608 - our own SQL
            ),
            {"first": first, "last": last, "payload": json.dumps(ORDER)},
        )
        conn.execute(
            text(
                """INSERT INTO saga.saga_step (saga_id, step, position, status, attempt,
                     compensation_attempt, generation, command_id, requested_at, deadline,
                     finished_at)
                   SELECT md5('w' || g)::uuid, st.name, st.pos, 'SUCCEEDED', 1, 0, 1,
                          md5('c' || g || st.name)::uuid,
                          now() - (g % 86400) * interval '1 second' + st.pos * interval '300 ms',
                          now() + interval '1 hour',
                          now() - (g % 86400) * interval '1 second' + (st.pos + 1) * interval '300 ms'
                   FROM generate_series(:first, :last) g,
                        (VALUES ('create_order', 0), ('reserve_stock', 1),
                                ('authorize_payment', 2), ('confirm_order', 3)) st(name, pos)"""
            ),
            {"first": first, "last": last},
        )
        conn.execute(
            text(
                """INSERT INTO saga.saga_history (saga_id, at, event, step, status_before,
                     status_after, actor, reason, detail)
                   SELECT md5('w' || g)::uuid, now() - (g % 86400) * interval '1 second'
                          + h * interval '300 ms', 'step_succeeded', 'create_order', 'RUNNING',
                          'RUNNING', 'system', NULL, '{}'::jsonb
                   FROM generate_series(:first, :last) g, generate_series(1, 6) h"""
            ),
            {"first": first, "last": last},
        )
        conn.execute(text("ANALYZE saga.saga_instance"))
        conn.execute(text("ANALYZE saga.saga_step"))
        conn.execute(text("ANALYZE saga.saga_history"))


def web_bench(args: Any, database_url: str, broker_url: str) -> dict[str, Any]:
    """The dashboard, the API and /metrics over a small table and a large one, in one run:
    request time p50/p95 per page and the ratio large/small (cost growth with the table)."""
    from urllib.request import Request, urlopen

    port = args.web_port
    token = secrets.token_urlsafe(18)  # reads need a token with the read scope
    engine = create_engine(database_url, poolclass=NullPool)
    sizes = (1_000, args.web_rows)
    server = WorkerProcess(
        "participants.app",
        name="web",
        role="web",
        env={
            **os.environ,
            "SAGA_DATABASE_URL": database_url,
            "SAGA_BROKER_URL": broker_url,
            "SAGA_TASKS_APP": "participants.app:saga_app",
            "SAGA_API_TOKENS": f"bench:{token}:read",
        },
        log_dir=Path(args.log_dir),
        extra_args=("--port", str(port)),
    )
    server.start(timeout=60)
    report: dict[str, Any] = {"rows": list(sizes), "pages": {}}
    try:
        filled = 0
        for size in sizes:
            say(args, f"web: filling to {size} sagas")
            fill_sagas(engine, filled + 1, size)
            filled = size
            # The id fill_sagas gave saga number size/2: md5('w' || g)::uuid.
            middle = hashlib.md5(f"w{size // 2}".encode(), usedforsecurity=False).hexdigest()
            saga_id = str(uuid.UUID(middle))
            for label, path in WEB_PAGES:
                url = f"http://127.0.0.1:{port}{path.format(saga_id=saga_id)}"
                request = Request(url, headers={"Authorization": f"Bearer {token}"})
                timings = []
                for _ in range(args.web_requests):
                    t = time.perf_counter()
                    with urlopen(request, timeout=30) as response:  # noqa: S310 - http, built above
                        response.read()
                    timings.append((time.perf_counter() - t) * 1000)
                report["pages"].setdefault(label, {})[str(size)] = percentiles(timings)
            say(
                args,
                f"web: {size} sagas: overview p50 {report['pages']['overview'][str(size)]['p50']} ms",
            )
    finally:
        server.stop()
    for timings in report["pages"].values():
        small, large = timings[str(sizes[0])]["p50"], timings[str(sizes[1])]["p50"]
        timings["ratio"] = round(large / small, 2) if small else None
    return report
