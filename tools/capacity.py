"""This hour's capacity of a deployment: how many sagas per second it ends when given
more than it can take. The demo offers a share of it; the chaos run a multiple."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sqlalchemy import text

from saga_tasks.ops.processes import wait_for

_ENDED = text(
    "SELECT count(*) FILTER (WHERE status IN ('COMPLETED', 'COMPENSATED')) AS n, "
    "extract(epoch FROM max(finished_at) - min(created_at)) AS span "
    "FROM saga.saga_instance WHERE business_key LIKE :p"
)


def measure(
    app: Any,
    prefix: str,
    n: int,
    payload: Callable[[random.Random], dict[str, Any]],
    *,
    timeout: float = 300.0,
    starters: int = 4,
) -> float:
    """Start ``n`` sagas at once (business keys ``prefix`` + a number) and return the
    sagas per second the deployment ended them at, from the first start to the last end
    (one saga's own latency included: a slight underestimate, never an overestimate)."""
    rng = random.Random(7)  # noqa: S311 - reproducible, not a secret
    payloads = [payload(rng) for _ in range(n)]
    # Several threads: one alone starts no faster than one start's latency allows, and
    # the measure would be of the starter, not of the deployment.
    with ThreadPoolExecutor(starters, thread_name_prefix="warm-up") as pool:
        list(pool.map(lambda i: app.start_saga("order", f"{prefix}{i:05d}", payloads[i]), range(n)))

    def read() -> Any:
        with app.engine.connect() as conn:
            return conn.execute(_ENDED, {"p": f"{prefix}%"}).one()

    # Measured on what ended in time; too few to measure is an error below.
    with contextlib.suppress(AssertionError):
        wait_for(lambda: read().n >= n, timeout=timeout, interval=0.5)
    done = read()
    if done.n < 2 or not done.span:
        raise SystemExit(f"warm-up: only {done.n} of {n} sagas ended; no capacity to measure")
    return int(done.n) / float(done.span)
