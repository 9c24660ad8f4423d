"""The benchmark: the order saga against two Celery baselines, in one run, on one layout.

    saga-tasks bench [--sagas 2000] [--unloaded 200] [--long [50000]] [--sweep] [--json]

It makes its own vhost and database (unless ``--here``), and for each configuration
starts the same worker layout (one worker process per queue, same pool, same
prefetch), then measures:

- **chain** (baseline A): a Celery chain of three no-op tasks on three queues,
  ``acks_late``, no database, no publisher confirms;
- **durable_chain** (baseline B): the same chain, each task one PostgreSQL transaction
  (insert a row, update a row under a version check), publishes confirmed;
- **saga_floor**: the saga's eight messages as a chain of eight tasks over its four
  queues (orchestrator, orders, inventory, payments), publishes confirmed, no database:
  what Celery and RabbitMQ alone cost for them;
- **durable_chain8**: the same eight tasks, each one PostgreSQL transaction the size of
  the write it stands for (a participant's three statements, the orchestrator's six): the
  saga's work without its guarantees;
- **saga**: the order saga, every guarantee on (outbox, inbox, ledgers, confirms, acks
  after commit), every step succeeding;
- **saga_unbatched**: the order saga with group commit off (``SAGA_GROUP_COMMIT=0``): each
  reply and command its own Celery task and transaction, the lever's before beside its after;
- **saga_mixed**: the same with 20% of sagas declined by payments and compensated.

For each: throughput for a burst of N (first start to last final state), completion
latency p50/p95/p99 in that burst and unloaded (one at a time), peak RSS of each
worker process, and PostgreSQL write transactions and RabbitMQ publishes per item,
counted from transaction ids and the management API. ``--long N`` runs N more sagas and
reports worker RSS growth between 10k and N. ``--sweep`` measures the timeout
sweeper on a table of 1,000,000 sagas with 0, 1,000 and 10,000 due, with the plan.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from saga_tasks.config import Settings
from saga_tasks.ops.processes import exit_on_sigterm
from tools.bench.report import Result, build_report, print_report
from tools.bench.runner import Bench
from tools.bench.sweep import sweep_bench
from tools.bench.web import web_bench

CONFIGURATIONS = (
    "chain_stock",
    "chain",
    "durable_chain",
    "saga_floor",
    "durable_chain8",
    "saga",
    "saga_unbatched",
    "saga_mixed",
    "dbos",
)
"""``dbos`` needs the ``bench`` extra; left out of the default run when DBOS is missing."""


def _available() -> tuple[str, ...]:
    import importlib.util

    if importlib.util.find_spec("dbos") is None:
        return tuple(c for c in CONFIGURATIONS if c != "dbos")
    return CONFIGURATIONS


def reset_sagas(database_url: str) -> None:
    """Empty the saga tables, so a phase measures the table size it made."""
    engine = create_engine(database_url, poolclass=NullPool)
    with engine.begin() as conn:
        conn.execute(
            text(
                "TRUNCATE saga.saga_instance, saga.saga_step, saga.saga_history, saga.outbox, "
                "saga.inbox, saga.saga_note_tally"
            )
        )
    engine.dispose()


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="saga-tasks bench", description=__doc__.splitlines()[0])
    parser.add_argument("--sagas", type=int, default=2000, help="burst size (default 2000)")
    parser.add_argument("--unloaded", type=int, default=200, help="items timed one at a time")
    parser.add_argument("--warmup", type=int, default=50, help="items before each burst")
    parser.add_argument(
        "--analyze-after-warmup",
        action="store_true",
        help="VACUUM ANALYZE once warm: planner statistics of quiet queues",
    )
    parser.add_argument(
        "--long",
        type=int,
        nargs="?",
        const=50_000,
        default=0,
        help="also run N more sagas (default 50000) and report worker RSS growth from 10k to N",
    )
    parser.add_argument(
        "--sweep", action="store_true", help="also benchmark the sweeper on 1M sagas"
    )
    parser.add_argument("--sweep-rows", type=int, default=1_000_000)
    parser.add_argument(
        "--web", action="store_true", help="also time the dashboard and API at 1k and 100k sagas"
    )
    parser.add_argument("--web-rows", type=int, default=100_000)
    parser.add_argument("--web-requests", type=int, default=20, help="requests per page")
    parser.add_argument("--web-port", type=int, default=8799)
    parser.add_argument(
        "--only", default=",".join(_available()), help="comma-separated configurations"
    )
    parser.add_argument("--pool", default="solo", choices=["solo", "prefork", "threads"])
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument(
        "--events",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="workers send task events (-E), as the README's deployment runs them for "
        "Flower; the same for every configuration",
    )
    parser.add_argument(
        "--orchestrators", type=int, default=1, help="worker processes on saga.replies"
    )
    parser.add_argument("--prefetch", type=int, default=4)
    parser.add_argument("--starters", type=int, default=4, help="threads starting the burst")
    parser.add_argument("--log-level", default="WARNING", help="worker log level, the same for all")
    parser.add_argument("--json", action="store_true", help="print one JSON object, no table")
    parser.add_argument("--save", metavar="PATH", help="also write the JSON report to PATH")
    parser.add_argument(
        "--here", action="store_true", help="use SAGA_DATABASE_URL and SAGA_BROKER_URL"
    )
    parser.add_argument("--log-dir", default=".bench/logs")
    args = parser.parse_args(argv)
    from saga_tasks.ops.isolation import Isolation

    base = Settings.from_env()
    admin = (
        make_url(base.database_url).set(database="postgres").render_as_string(hide_password=False)
    )
    isolation = None if args.here else Isolation(admin_database_url=admin, prefix="saga_bench_")
    with exit_on_sigterm():
        if isolation is not None:
            isolation.__enter__()
        try:
            database_url = isolation.database_url if isolation else base.database_url
            broker_url = isolation.broker_url if isolation else base.broker_url
            vhost = isolation.ident if isolation else "/"
            return _main(args, database_url, broker_url, vhost)
        finally:
            if isolation is not None:
                isolation.__exit__(None, None, None)


def _main(args: Any, database_url: str, broker_url: str, vhost: str) -> int:
    os.environ.update(
        {
            "SAGA_DATABASE_URL": database_url,
            # One database: what is measured is the saga's cost, not the server's
            # connections to four databases.
            "SAGA_PARTICIPANT_DATABASE_URL": "",
            "SAGA_BROKER_URL": broker_url,
            "SAGA_LOG_LEVEL": "WARNING",
        }
    )
    from participants.app import saga_app
    from saga_tasks.ops.services import upgrade_all

    upgrade_all(saga_app, saga_app.settings)
    from participants.seed import seed
    from saga_tasks.messaging.topology import declare_topology

    declare_topology(broker_url, saga_app.topology)
    seed(
        saga_app.participant_engine,
        {f"sku-{i}": 10**9 for i in range(1, 11)},
        {"c-1": 2**31 - 1, "c-low": 1_000},
    )
    with saga_app.engine.begin() as conn:
        conn.execute(text("CREATE SCHEMA IF NOT EXISTS bench"))
        conn.execute(
            text(
                "CREATE TABLE IF NOT EXISTS bench.chain_row (id bigserial PRIMARY KEY, chain_id text, step text, at timestamptz DEFAULT now())"
            )
        )
        conn.execute(
            text(
                "CREATE TABLE IF NOT EXISTS bench.chain_state (chain_id text PRIMARY KEY, version int NOT NULL)"
            )
        )
        # durable_chain8: a participant's ledger, business row and outbox; the
        # orchestrator's inbox (and chain_state, chain_row, outbox above and here).
        for table in ("ledger", "outbox", "inbox"):
            conn.execute(
                text(
                    f"CREATE TABLE IF NOT EXISTS bench.{table} (id bigserial PRIMARY KEY, "
                    "chain_id text NOT NULL, hop int NOT NULL, at timestamptz DEFAULT now(), "
                    "UNIQUE (chain_id, hop))"
                )
            )
        conn.execute(
            text(
                "CREATE TABLE IF NOT EXISTS bench.business (chain_id text PRIMARY KEY, "
                "hops int NOT NULL)"
            )
        )
        # dbos: the order saga's business rows, written by the DBOS workflow's steps.
        for ddl in (
            "dbos_order (order_id text PRIMARY KEY, status text NOT NULL)",
            "dbos_stock (sku text PRIMARY KEY, reserved bigint NOT NULL)",
            "dbos_reservation (order_id text PRIMARY KEY, sku text NOT NULL, qty int NOT NULL)",
            "dbos_customer (customer_id text PRIMARY KEY, authorized_cents bigint NOT NULL)",
            "dbos_authorization (order_id text PRIMARY KEY, amount_cents int NOT NULL)",
        ):
            conn.execute(text(f"CREATE TABLE IF NOT EXISTS bench.{ddl}"))
        conn.execute(
            text("INSERT INTO bench.dbos_stock VALUES ('sku-1', 0) ON CONFLICT DO NOTHING")
        )
        conn.execute(
            text("INSERT INTO bench.dbos_customer VALUES ('c-1', 0) ON CONFLICT DO NOTHING")
        )
    bench = Bench(args, database_url, broker_url, vhost)
    results: dict[str, Result] = {}
    wanted = args.only.split(",")
    try:
        for name in CONFIGURATIONS:
            if name not in wanted:
                continue
            if "chain" in name or name == "saga_floor":
                results[name] = bench.chain(
                    durable=name.startswith("durable"),
                    stock=name.endswith("_stock"),
                    eight=name in ("saga_floor", "durable_chain8"),
                )
            elif name == "dbos":
                results[name] = bench.dbos()
            else:
                results[name] = bench.saga(
                    mixed=name == "saga_mixed", batched=name != "saga_unbatched"
                )
        sweep = web = None
        if args.sweep:
            reset_sagas(database_url)
            sweep = sweep_bench(args, database_url, broker_url)
        if args.web:
            reset_sagas(database_url)
            web = web_bench(args, database_url, broker_url)
    finally:
        saga_app.close()  # publishes of the sweep confirmed and marked before the drop
        bench.redis.delete(bench.done_key)
        from saga_tasks.messaging.celery_config import forget_beat_state

        forget_beat_state(saga_app.settings)
    report = build_report(args, results, sweep)
    report["web"] = web
    if args.save:
        Path(args.save).write_text(json.dumps(report, indent=2, default=str))
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        print_report(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
