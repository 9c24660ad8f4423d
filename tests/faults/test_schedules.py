"""Sagas on a schedule under two real beats (redbeat): the active one is SIGKILLed, the
standby takes over once the lease runs out, and every tick still starts exactly one saga."""

from __future__ import annotations

import signal
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
import redis

from saga_tasks.core.schedules import format_tick, parse_tick
from saga_tasks.messaging.celery_config import beat_key_prefix
from saga_tasks.testing import WorkerProcess, wait_for
from tests.helpers import rows
from tests.scheduled_app import build

LEASE = 3  # SAGA_BEAT_LOCK_TIMEOUT in Workers.env: the shortest beat's 1 s sleep allows
SECOND = timedelta(seconds=1)


def scheduled(app, name):
    """(tick, payload tick) of each saga the schedule started, by its business key."""
    found = rows(
        app.engine,
        "SELECT business_key, payload FROM saga.saga_instance WHERE business_key LIKE :k",
        k=f"schedule:{name}@%",
    )
    return [(parse_tick(r["business_key"].partition("@")[2]), r["payload"]["tick"]) for r in found]


@pytest.fixture
def app(settings):
    found = build(settings)
    yield found
    found.close()


def test_two_beats_start_one_saga_per_tick_across_a_takeover(workers, settings, app):
    env = {**workers.env(), "SAGA_TASKS_APP": "tests.scheduled_app:saga_app"}

    def process(name, role, queues=()):
        found = WorkerProcess(
            "tests.scheduled_app",
            queues=queues,
            name=name,
            env=env,
            log_dir=workers.log_dir,
            role=role,
        )
        workers.started.append(found)
        return found

    worker = process("maintenance", "worker", ["saga.replies", "saga.maintenance"])
    worker.start()  # declares the topology beat sends to
    beats = [process("beat-a", "beat"), process("beat-b", "beat")]
    for beat in beats:
        beat.start(wait=False)
    for beat in beats:
        beat.wait_ready()

    def holders():
        return [b for b in beats if b.alive() and "beat: Acquired lock" in b.log_text()]

    (leader,) = wait_for(holders, timeout=20, describe="one beat holding the lease")
    (standby,) = [b for b in beats if b is not leader]
    wait_for(lambda: len(scheduled(app, "every-second")) >= 3, timeout=20, describe="three ticks")
    assert holders() == [leader], "the standby waits for the lease"

    leader.kill(signal.SIGKILL)
    killed_at = datetime.now(UTC)
    wait_for(lambda: holders() == [standby], timeout=LEASE + 10, describe="the standby's takeover")

    def after_kill(name):
        return [t for t, _ in scheduled(app, name) if t > killed_at + LEASE * SECOND]

    wait_for(lambda: len(after_kill("every-second")) >= 3, timeout=20, describe="ticks go on")
    wait_for(lambda: after_kill("every-second-default"), timeout=10, describe="default ticks")

    # A beat killed between sending a firing and noting its tick makes its successor send
    # the tick again: move the note back three ticks, as such a kill leaves it.
    book = redis.Redis.from_url(settings.result_backend)
    note = f"{beat_key_prefix(settings)}schedule:every-second"

    def fired_twice():
        found = rows(app.engine, "SELECT tick FROM saga.schedule_run WHERE firings > 1")
        if not found:
            now = app.schedules[0].tick_at(datetime.now(UTC))
            book.set(note, format_tick(now - 3 * SECOND))
        return found

    try:
        twice = wait_for(fired_twice, timeout=15, interval=0.5, describe="ticks sent again")
    finally:
        book.close()
    standby.stop()
    worker.stop()
    assert not any(p.alive() for p in workers.started), "no beat or worker left behind"

    for name in ("every-second", "every-second-default"):
        started = scheduled(app, name)
        ticks = [t for t, _ in started]
        assert len(set(ticks)) == len(started), f"{name}: a tick with two sagas"
        assert all(format_tick(t) == payload for t, payload in started), "labelled as fired"
        assert all(t.microsecond == 0 for t in ticks), "on the grid of whole seconds"
        runs = rows(app.engine, "SELECT * FROM saga.schedule_run WHERE schedule = :n", n=name)
        by_tick = {r["tick"]: r for r in runs if r["saga_id"] is not None}
        assert set(by_tick) == set(ticks), "each saga's run recorded with it"
        assert Counter(str(r["saga_id"]) for r in by_tick.values()).most_common(1)[0][1] == 1
    # Within its 30 s grace, every tick from the first to the last has its saga: the
    # standby sent the ticks the lease's run-out would have cost.
    ticks = sorted(t for t, _ in scheduled(app, "every-second"))
    assert ticks == [ticks[0] + n * SECOND for n in range(len(ticks))]
    assert {r["tick"] for r in twice} <= set(ticks), "sent again, started nothing more"
    # With the default grace (until the next tick), the takeover missed ticks, counted on
    # the standby's first firing; none was started late.
    default = rows(
        app.engine,
        "SELECT tick, missed_before FROM saga.schedule_run "
        "WHERE schedule = 'every-second-default' AND tick > :k ORDER BY tick",
        k=killed_at,
    )
    assert default[0]["missed_before"] >= 1, default
