"""The order saga as a DBOS workflow: the engine a Python team would pick instead, measured
by ``saga-tasks bench --only dbos`` on the same machine and database, in the same run.

    python -m tools.bench.dbos_app      an executor: DBOS launched, dequeuing the queue

Four steps do the order saga's business writes in the bench database (create the order,
reserve stock, authorize the payment, confirm the order), each a DBOS step whose outcome
DBOS checkpoints in its system tables (schema ``dbos``, same database). Sagas are
started through a DBOS queue by ``DBOSClient.enqueue``; the benchmark runs one executor
process per core (``BENCH_DBOS_EXECUTORS`` to try others). The queue is polled every
0.1 s (``BENCH_DBOS_POLL``; DBOS's default is 1 s: a setting in DBOS's favour). The last
step pushes ``id:started:finished`` to the same Redis list the Celery chains use, so
every configuration is timed alike. Installed with the ``bench``
extra (``pip install -e '.[bench]'``).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

from dbos import DBOS, DBOSConfig
from sqlalchemy import create_engine, text

QUEUE = "bench_orders"
WORKFLOW = "bench_order_workflow"
DONE_KEY = os.environ.get("BENCH_DONE_KEY", "saga_tasks:bench:done")
POLL = float(os.environ.get("BENCH_DBOS_POLL", "0.1"))
"""Seconds between polls of the queue (``BENCH_DBOS_POLL``); DBOS's default is 1."""

_engine: Any = None
_redis: Any = None


def system_url(database_url: str) -> str:
    """DBOS speaks psycopg 3: the same database, its own driver."""
    return database_url.replace("postgresql+psycopg2://", "postgresql://", 1)


def _db() -> Any:
    global _engine  # noqa: PLW0603 - one engine per executor process
    if _engine is None:
        # A step waits for one of eight connections: DBOS runs every dequeued workflow in
        # a thread of its own, and more connections would only exhaust the server's.
        _engine = create_engine(
            os.environ["SAGA_DATABASE_URL"], pool_size=8, max_overflow=0, pool_timeout=60
        )
    return _engine


@DBOS.step()
def create_order(order_id: str) -> None:
    with _db().begin() as conn:
        conn.execute(
            text("INSERT INTO bench.dbos_order (order_id, status) VALUES (:o, 'PENDING')"),
            {"o": order_id},
        )


@DBOS.step()
def reserve_stock(order_id: str) -> None:
    with _db().begin() as conn:
        conn.execute(
            text("UPDATE bench.dbos_stock SET reserved = reserved + 1 WHERE sku = 'sku-1'")
        )
        conn.execute(
            text("INSERT INTO bench.dbos_reservation (order_id, sku, qty) VALUES (:o, 'sku-1', 1)"),
            {"o": order_id},
        )


@DBOS.step()
def authorize_payment(order_id: str) -> None:
    with _db().begin() as conn:
        conn.execute(
            text(
                "UPDATE bench.dbos_customer SET authorized_cents = authorized_cents + 100 "
                "WHERE customer_id = 'c-1'"
            )
        )
        conn.execute(
            text("INSERT INTO bench.dbos_authorization (order_id, amount_cents) VALUES (:o, 100)"),
            {"o": order_id},
        )


@DBOS.step()
def confirm_order(order_id: str, started: float) -> None:
    global _redis  # noqa: PLW0603 - one client per executor process
    with _db().begin() as conn:
        conn.execute(
            text("UPDATE bench.dbos_order SET status = 'CONFIRMED' WHERE order_id = :o"),
            {"o": order_id},
        )
    if _redis is None:
        import redis

        # Blocking: DBOS runs each workflow in a thread of its own, and redis-py 8 caps
        # a pool at 100 connections (raising beyond); a step waits for one instead.
        pool = redis.BlockingConnectionPool.from_url(
            os.environ.get("SAGA_RESULT_BACKEND", "redis://127.0.0.1:6379/0"),
            max_connections=32,
            timeout=60,
        )
        _redis = redis.Redis(connection_pool=pool)
    _redis.rpush(DONE_KEY, f"{order_id}:{started}:{time.time()}")


@DBOS.workflow(name=WORKFLOW)
def order_workflow(order_id: str, started: float) -> None:
    create_order(order_id)
    reserve_stock(order_id)
    authorize_payment(order_id)
    confirm_order(order_id, started)


def config(executor_id: str) -> DBOSConfig:
    return {
        "name": "saga-tasks-bench",
        "system_database_url": system_url(os.environ["SAGA_DATABASE_URL"]),
        "executor_id": executor_id,
        "log_level": "WARNING",
    }


def main() -> None:
    DBOS(config=config(os.environ.get("BENCH_DBOS_EXECUTOR", f"bench-{os.getpid()}")))
    DBOS.launch()
    DBOS.register_queue(QUEUE, polling_interval_sec=POLL)
    print("dbos executor ready", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    DBOS.destroy()


if __name__ == "__main__":
    main()
