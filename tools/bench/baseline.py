"""The baselines the benchmark measures the order saga against: chains of Celery tasks.

    celery -A tools.bench.baseline worker -Q bench.a      (and bench.b, bench.c)
    celery -A tools.bench.baseline worker -Q bench.orch   (and bench.orders, bench.inventory,
                                                           bench.payments; BENCH_SHAPE=8)

Baseline A (``BENCH_DURABLE`` unset): three no-op tasks, each on its own queue,
``acks_late``, no database, no publisher confirms: Celery alone. Baseline B
(``BENCH_DURABLE=1``): each task runs one PostgreSQL transaction (insert one row,
update one row under a version check) and the chain publishes with confirms: the
cost of durability without saga logic. The last task pushes the chain's latency to
a Redis list the benchmark reads.

``BENCH_SHAPE=8`` is the order saga's shape without its guarantees: eight tasks in a
chain, a participant's and then the orchestrator's, over the same four queues the saga
uses (orders, orch, inventory, orch, payments, orch, orders, orch), publishes confirmed.
Durable (``durable_chain8``), each task runs one PostgreSQL transaction of the size of the
write it stands for: a participant's (its ledger row, its business row, its reply in its
outbox: three statements) or the orchestrator's (its inbox row, the saga row locked and
updated, a step row, a history row, an outbox row: six). Not durable (``saga_floor``),
the tasks touch no database: what Celery and RabbitMQ alone cost for the saga's eight
messages.

``BENCH_ACK_FIX=1`` gives the baselines the same consumer fix the saga workers run
(acks written at once, ``saga_tasks.worker.consumer``): without it, stock Celery with
``acks_late`` stalls whenever the prefetch window fills (celery/celery#7718), and the
benchmark reports that too, as ``*_stock``.
"""

from __future__ import annotations

import os
import time
from typing import Any

from celery import Celery
from kombu import Exchange, Queue

DURABLE = os.environ.get("BENCH_DURABLE") == "1"
EIGHT = os.environ.get("BENCH_SHAPE") == "8"
HOPS = ("orders", "orch", "inventory", "orch", "payments", "orch", "orders", "orch")
"""The queue of each task of the eight-task chain, as the order saga's messages go."""
EIGHT_QUEUES = ("bench.orch", "bench.orders", "bench.inventory", "bench.payments")
ACK_FIX = os.environ.get("BENCH_ACK_FIX") == "1"
DONE_KEY = os.environ.get("BENCH_DONE_KEY", "saga_tasks:bench:done")

app = Celery("bench_baseline", set_as_current=False)
app.conf.update(
    broker_url=os.environ.get("SAGA_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672//"),
    task_queues=[
        Queue(q, Exchange(q, "direct"), routing_key=q)
        for q in ("bench.a", "bench.b", "bench.c", *EIGHT_QUEUES)
    ],
    task_routes={
        "bench.a": {"queue": "bench.a"},
        "bench.b": {"queue": "bench.b"},
        "bench.c": {"queue": "bench.c"},
    },
    task_create_missing_queues=False,
    task_acks_late=True,
    task_ignore_result=True,
    task_serializer="json",
    accept_content=["json"],
    worker_prefetch_multiplier=int(os.environ.get("SAGA_PREFETCH_MULTIPLIER", "4")),
    worker_hijack_root_logger=False,
    # The saga publishes with confirms: so do the durable chains and the eight-task floor.
    broker_transport_options={"confirm_publish": True} if DURABLE or EIGHT else {},
)
if ACK_FIX:
    app.conf.worker_consumer = "saga_tasks.worker.consumer:ImmediateAckConsumer"

_engine: Any = None
_redis: Any = None


def _db() -> Any:
    global _engine  # noqa: PLW0603 - one engine per worker process
    if _engine is None:
        from saga_tasks.persistence.db import get_engine

        _engine = get_engine(os.environ["SAGA_DATABASE_URL"])
    return _engine


def _durable_step(chain_id: str, step: str) -> None:
    from sqlalchemy import text

    with _db().begin() as conn:
        conn.execute(
            text("INSERT INTO bench.chain_row (chain_id, step) VALUES (:c, :s)"),
            {"c": chain_id, "s": step},
        )
        changed = conn.execute(
            text(
                "INSERT INTO bench.chain_state (chain_id, version) VALUES (:c, 1) "
                "ON CONFLICT (chain_id) DO UPDATE SET version = bench.chain_state.version + 1 "
                "WHERE bench.chain_state.version = :v - 1 RETURNING version"
            ),
            {"c": chain_id, "v": {"a": 1, "b": 2, "c": 3}[step]},
        ).first()
        if changed is None:
            raise RuntimeError("version check failed")


@app.task(name="bench.a")
def step_a(chain_id: str, started: float) -> tuple[str, float]:
    if DURABLE:
        _durable_step(chain_id, "a")
    return chain_id, started


@app.task(name="bench.b")
def step_b(previous: tuple[str, float]) -> tuple[str, float]:
    if DURABLE:
        _durable_step(previous[0], "b")
    return previous[0], previous[1]


@app.task(name="bench.c")
def step_c(previous: tuple[str, float]) -> None:
    if DURABLE:
        _durable_step(previous[0], "c")
    _finish(previous[0], previous[1])


def _participant_write(chain_id: str, hop: int) -> None:
    from sqlalchemy import text

    with _db().begin() as conn:
        conn.execute(
            text("INSERT INTO bench.ledger (chain_id, hop) VALUES (:c, :h)"),
            {"c": chain_id, "h": hop},
        )
        conn.execute(
            text(
                "INSERT INTO bench.business (chain_id, hops) VALUES (:c, 1) "
                "ON CONFLICT (chain_id) DO UPDATE SET hops = bench.business.hops + 1"
            ),
            {"c": chain_id},
        )
        conn.execute(
            text("INSERT INTO bench.outbox (chain_id, hop) VALUES (:c, :h)"),
            {"c": chain_id, "h": hop},
        )


def _orchestrator_write(chain_id: str, hop: int) -> None:
    from sqlalchemy import text

    with _db().begin() as conn:
        conn.execute(
            text("INSERT INTO bench.inbox (chain_id, hop) VALUES (:c, :h)"),
            {"c": chain_id, "h": hop},
        )
        conn.execute(
            text(
                "INSERT INTO bench.chain_state (chain_id, version) VALUES (:c, 0) "
                "ON CONFLICT (chain_id) DO NOTHING"
            ),
            {"c": chain_id},
        )
        version = conn.execute(
            text("SELECT version FROM bench.chain_state WHERE chain_id = :c FOR UPDATE"),
            {"c": chain_id},
        ).scalar_one()
        conn.execute(
            text("UPDATE bench.chain_state SET version = :v WHERE chain_id = :c AND version = :o"),
            {"c": chain_id, "v": version + 1, "o": version},
        )
        conn.execute(
            text("INSERT INTO bench.chain_row (chain_id, step) VALUES (:c, :s)"),
            {"c": chain_id, "s": f"hop-{hop}"},
        )
        conn.execute(
            text("INSERT INTO bench.outbox (chain_id, hop) VALUES (:c, :h)"),
            {"c": chain_id, "h": hop},
        )


def _finish(chain_id: str, started: float) -> None:
    global _redis  # noqa: PLW0603 - one client per worker process
    if _redis is None:
        import redis

        _redis = redis.Redis.from_url(
            os.environ.get("SAGA_RESULT_BACKEND", "redis://127.0.0.1:6379/0")
        )
    _redis.rpush(DONE_KEY, f"{chain_id}:{started}:{time.time()}")


@app.task(name="bench.hop")
def hop(previous: tuple[str, float, int]) -> tuple[str, float, int]:
    """One task of the eight-task chain: ``previous`` is (chain id, started, hop index)."""
    chain_id, started, index = previous
    if DURABLE:
        if HOPS[index] == "orch":
            _orchestrator_write(chain_id, index)
        else:
            _participant_write(chain_id, index)
    if index == len(HOPS) - 1:
        _finish(chain_id, started)
    return chain_id, started, index + 1


def start_chain(chain_id: str) -> None:
    from celery import chain

    if EIGHT:
        first = (chain_id, time.time(), 0)
        hops = [
            hop.si(first).set(queue=f"bench.{HOPS[0]}"),
            *(hop.s().set(queue=f"bench.{q}") for q in HOPS[1:]),
        ]
        chain(*hops).apply_async()
        return
    chain(step_a.s(chain_id, time.time()), step_b.s(), step_c.s()).apply_async()
