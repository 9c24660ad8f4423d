"""A tiny deployment with sagas on a schedule, for tests that run it in real processes.

    celery -A tests.scheduled_app beat          # SAGA_TASKS_APP=tests.scheduled_app:saga_app

The ``tick`` saga has one step whose queue nobody consumes: a started saga stays
RUNNING, which is all these tests look at (how many sagas, for which ticks).
"""

from __future__ import annotations

from saga_tasks import SagaApp, Settings, saga, schedule, step
from saga_tasks.core.schedules import format_tick

TICK_SAGA = saga("tick", step("noop", "ticks.noop", queue="ticks.commands"), timeout=3600)
EVERY = 1.0
GRACE = 30.0


def tick_payload(tick):
    return {"tick": format_tick(tick)}


SCHEDULES = [
    # Each second; a tick may start its saga up to 30 s late: every tick gets one saga,
    # across a takeover too.
    schedule("every-second", "tick", every=EVERY, grace=GRACE, payload=tick_payload),
    # The default grace (until the next tick): a takeover misses the ticks in between.
    schedule("every-second-default", "tick", every=EVERY, payload=tick_payload),
    schedule("nightly", "tick", cron="0 2 * * *", payload={"tick": "nightly"}),
]


def build(settings: Settings | None = None, **kw) -> SagaApp:
    return SagaApp(
        sagas=[TICK_SAGA], schedules=SCHEDULES, settings=settings, name="scheduled", **kw
    )


saga_app = build()
app = saga_app.celery
