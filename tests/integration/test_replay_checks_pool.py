"""The replay checks of held messages under concurrent readers, everything in one database
(``SAGA_PARTICIPANT_DATABASE_URL`` empty): the effect check must not need a second
connection from the pool the first one came from."""

from __future__ import annotations

import dataclasses
import threading
import time

from saga_tasks.ops.views import held_list, held_show
from saga_tasks.runtime.holding import DEAD_LETTER
from tests.helpers import build_order_app, reject_one, to_reserve


def test_concurrent_replay_checks_do_not_wait_on_each_other(settings):
    app = build_order_app(dataclasses.replace(settings, db_pool_size=1))  # 2 connections
    try:
        url = settings.broker_url
        to_reserve(app, url, "pool-1")
        reject_one(url, "inventory.commands")
        app.intake.take(DEAD_LETTER)
        (held,) = held_list(app, DEAD_LETTER)["messages"]
        assert held_show(app, held["id"])["replay_checks"]

        # Two readers at once (the API serves requests from a thread pool), each inside
        # its checks when the other is.
        inside = threading.Barrier(2, timeout=10)
        effect = app.replayer._effect

        def in_step(*args, **kwargs):
            inside.wait()
            return effect(*args, **kwargs)

        app.replayer._effect = in_step
        outcomes: list[object] = []

        def read() -> None:
            started = time.monotonic()
            try:
                held_show(app, held["id"])
                outcomes.append(round(time.monotonic() - started, 1))
            except Exception as exc:  # what went wrong is the finding
                outcomes.append(exc)

        readers = [threading.Thread(target=read) for _ in range(2)]
        for r in readers:
            r.start()
        for r in readers:
            r.join(timeout=60)
        assert len(outcomes) == 2
        assert all(isinstance(o, float) and o < 5 for o in outcomes), outcomes
    finally:
        app.close()
