"""Sagas on a schedule, the pure part: which tick a time belongs to, the key a tick
starts, what a beat pass sends, and schedules refused when they are built."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from saga_tasks import SagaApp, Settings, saga, schedule, step
from saga_tasks.core.cron import Cron
from saga_tasks.core.schedules import CATCH_UP_LIMIT, EPOCH, format_tick, parse_tick, plan
from saga_tasks.errors import (
    DuplicateSchedule,
    InvalidCron,
    InvalidInterval,
    InvalidScheduledPayload,
    ScheduleError,
    UnknownScheduledSaga,
)
from saga_tasks.worker.scheduler import fire_due

NOW = datetime(2026, 12, 1, 10, 7, 30, 250_000, tzinfo=UTC)
times = st.datetimes(
    min_value=datetime(1971, 1, 1), max_value=datetime(2200, 1, 1), timezones=st.just(UTC)
)
periods = st.one_of(
    st.integers(1, 86_400 * 8).map(lambda s: timedelta(seconds=s)),
    st.integers(1_000_000, 10_000_000_000).map(lambda us: timedelta(microseconds=us)),
)


# -- interval ticks -----------------------------------------------------------------------


@given(now=times, every=periods)
def test_an_interval_tick_is_on_the_epoch_grid_and_holds_now(now, every):
    s = schedule("s", "t", every=every)
    tick = s.tick_at(now)
    assert tick <= now < tick + every
    assert (tick - EPOCH) % every == timedelta(0), "on the grid"
    assert s.on_grid(tick) and s.tick_at(tick) == tick
    assert s.next_tick(tick) == tick + every == s.next_tick(now)
    assert s.previous_tick(tick) == tick - every
    assert s.deadline(tick) == tick + every and not s.late(tick, now)


@given(now=times, every=periods, data=st.data())
def test_every_time_of_one_period_gives_one_key(now, every, data):
    s = schedule("s", "t", every=every)
    tick = s.tick_at(now)
    other = data.draw(st.integers(0, every // timedelta(microseconds=1) - 1))
    same = tick + timedelta(microseconds=other)
    assert s.business_key(s.tick_at(same)) == s.business_key(tick)
    assert s.business_key(s.tick_at(tick + every)) != s.business_key(tick)
    assert parse_tick(format_tick(tick)) == tick
    assert s.business_key(tick) == f"schedule:s@{format_tick(tick)}"


def test_interval_ticks_by_example():
    s = schedule("five", "t", every=300)
    assert s.tick_at(NOW) == datetime(2026, 12, 1, 10, 5, tzinfo=UTC)
    assert s.next_tick(NOW) == datetime(2026, 12, 1, 10, 10, tzinfo=UTC)
    assert s.business_key(s.tick_at(NOW)) == "schedule:five@2026-12-01T10:05:00Z"
    half = schedule("half", "t", every=1.5, key="fast")
    assert half.business_key(half.tick_at(NOW)) == "fast@2026-12-01T10:07:30Z"
    assert format_tick(half.tick_at(NOW) + timedelta(seconds=1.5)).endswith(":31.500000Z")


# -- cron ticks ---------------------------------------------------------------------------

minute_fields = st.sampled_from(["*", "*/5", "0", "7,19,45", "10-20/3", "30/15", "59"])
hour_fields = st.sampled_from(["*", "*/6", "2", "9-17", "0,12", "23"])
dom_fields = st.sampled_from(["*", "1", "15", "28-31", "*/10", "29", "31"])
month_fields = st.sampled_from(["*", "2", "jan,jul", "*/3", "2-4", "dec"])
dow_fields = st.sampled_from(["*", "0", "7", "mon-fri", "sat,sun", "*/2", "3"])
crons = st.builds(
    lambda *f: " ".join(f), minute_fields, hour_fields, dom_fields, month_fields, dow_fields
)


def _parses(expression: str) -> Cron | None:
    try:
        return Cron.parse(expression)
    except InvalidCron:
        return None  # never due (31 February): refused, checked below


@settings(max_examples=300)
@given(expression=crons, now=times)
def test_a_cron_tick_is_due_and_the_latest_at_or_before_now(expression, now):
    cron = _parses(expression)
    if cron is None:
        return
    s = schedule("c", "t", cron=expression)
    tick = s.tick_at(now)
    following = s.next_tick(tick)
    assert tick <= now < following, "no due time between the tick and now"
    assert cron.matches(tick) and cron.matches(following)
    assert s.on_grid(tick) and s.tick_at(tick) == tick
    assert s.previous_tick(following) == tick
    assert s.business_key(s.tick_at(now)) == s.business_key(tick)


@settings(max_examples=150)
@given(expression=crons, start=times)
def test_cron_next_is_the_first_matching_minute(expression, start):
    """Against the definition: walk minute by minute for two days."""
    cron = _parses(expression)
    if cron is None:
        return
    found = cron.next(start)
    t = start.replace(second=0, microsecond=0) + timedelta(minutes=1)
    for _ in range(2 * 1440):
        if cron.matches(t):
            assert found == t
            return
        t += timedelta(minutes=1)
    assert found >= t


def test_cron_by_example():
    s = schedule("c", "t", cron="*/5 * * * *")
    assert s.tick_at(NOW) == datetime(2026, 12, 1, 10, 5, tzinfo=UTC)
    assert s.next_tick(NOW) == datetime(2026, 12, 1, 10, 10, tzinfo=UTC)
    assert s.describe() == "cron */5 * * * *"
    leap = Cron.parse("0 0 29 2 *")
    assert leap.next(NOW) == datetime(2028, 2, 29, tzinfo=UTC)
    assert leap.previous(NOW) == datetime(2024, 2, 29, tzinfo=UTC)
    # Both day fields restricted: either matches (Vixie cron). 2026-11-13 is a Friday.
    either = Cron.parse("0 0 13 * fri")
    assert either.next(datetime(2026, 11, 1, tzinfo=UTC)) == datetime(2026, 11, 6, tzinfo=UTC)
    assert either.next(datetime(2026, 12, 12, tzinfo=UTC)) == datetime(2026, 12, 13, tzinfo=UTC)
    assert Cron.parse("0 9 * * 7").weekdays == Cron.parse("0 9 * * sun").weekdays == {0}
    assert Cron.parse("@daily").next(NOW) == datetime(2026, 12, 2, tzinfo=UTC)
    assert Cron.parse("@weekly").next(NOW) == datetime(2026, 12, 6, tzinfo=UTC)  # a Sunday


@pytest.mark.parametrize(
    ("expression", "why"),
    [
        ("* * * *", "5 fields"),
        ("60 * * * *", "outside 0-59"),
        ("* 24 * * *", "outside 0-23"),
        ("* * 0 * *", "outside 1-31"),
        ("* * * 13 *", "outside 1-12"),
        ("* * * * 8", "outside 0-7"),
        ("*/0 * * * *", "at least 1"),
        ("5-1 * * * *", "backwards"),
        ("x * * * *", "not a number"),
        ("1,,2 * * * *", "not a number"),
        ("0 0 31 2 *", "never due"),
        ("0 0 30,31 2 *", "never due"),
        ("@sometimes", "5 fields"),
    ],
)
def test_a_bad_cron_is_refused_naming_the_field(expression, why):
    with pytest.raises(InvalidCron, match=why) as caught:
        schedule("bad", "t", cron=expression)
    assert caught.value.schedule == "bad"


# -- building a schedule ------------------------------------------------------------------


@pytest.mark.parametrize("every", [0, -1, 0.5, float("nan"), float("inf"), True, "5"])
def test_an_interval_is_a_positive_number_of_seconds_of_at_least_one(every):
    with pytest.raises(InvalidInterval):
        schedule("s", "t", every=every)


def test_a_schedule_is_refused_when_built():
    with pytest.raises(ScheduleError, match="exactly one"):
        schedule("s", "t")
    with pytest.raises(ScheduleError, match="exactly one"):
        schedule("s", "t", every=5, cron="* * * * *")
    with pytest.raises(ScheduleError, match="a name is"):
        schedule("has space", "t", every=5)
    with pytest.raises(InvalidInterval, match="grace"):
        schedule("s", "t", every=5, grace=0)
    with pytest.raises(InvalidScheduledPayload, match="not JSON"):
        schedule("s", "t", every=5, payload={"at": datetime(2026, 1, 1)})
    with pytest.raises(InvalidScheduledPayload):
        schedule("s", "t", every=5, payload=[1, 2])  # type: ignore[arg-type]
    with pytest.raises(ScheduleError, match="key"):
        schedule("s", "t", every=5, key="x" * 200)


class Report(BaseModel):
    region: str


REPORT = saga("report", step("build", "reports.build", queue="reports.commands"), payload=Report)


def _app(*schedules):
    return SagaApp(sagas=[REPORT], schedules=list(schedules), settings=Settings.from_env({}))


def test_the_app_refuses_a_schedule_that_does_not_fit_its_saga():
    with pytest.raises(UnknownScheduledSaga, match="unknown saga type 'nope'"):
        _app(schedule("s", "nope", every=5))
    with pytest.raises(InvalidScheduledPayload, match="region"):
        _app(schedule("s", "report", every=5, payload={"zone": "eu"}))
    with pytest.raises(DuplicateSchedule, match="two schedules"):
        _app(schedule("s", "report", every=5, payload={"region": "eu"}),
             schedule("s", "report", every=9, payload={"region": "us"}))  # fmt: skip
    with pytest.raises(DuplicateSchedule, match="key"):
        _app(schedule("a", "report", every=5, key="k", payload={"region": "eu"}),
             schedule("b", "report", every=9, key="k", payload={"region": "us"}))  # fmt: skip
    # A function's payload is checked at each tick, not now.
    app = _app(schedule("s", "report", cron="@daily", payload=lambda tick: {"day": str(tick)}))
    assert [s.name for s in app.timetable.schedules] == ["s"]


# -- what a beat pass sends ---------------------------------------------------------------


def test_a_schedule_seen_first_fires_from_its_next_tick():
    s = schedule("s", "t", cron="0 2 * * *")
    first = plan(s, None, NOW)
    assert first.fire == () and first.seen == datetime(2026, 12, 1, 2, tzinfo=UTC)
    assert plan(s, first.seen, NOW).fire == ()
    tomorrow = plan(s, first.seen, NOW + timedelta(days=1))
    assert tomorrow.fire == (datetime(2026, 12, 2, 2, tzinfo=UTC),) and tomorrow.missed == 0


def test_beat_back_after_an_outage_sends_the_newest_tick_not_a_storm():
    s = schedule("s", "t", every=60)
    last = s.tick_at(NOW)
    later = NOW + timedelta(hours=3)
    p = plan(s, last, later)
    assert p.fire == (s.tick_at(later),), "the newest tick only (default grace: one period)"
    assert p.missed == 3 * 60 - 1 and p.seen == s.tick_at(later)
    # With a grace of five minutes, the ticks within it are sent too, oldest first.
    graced = schedule("g", "t", every=60, grace=300)
    p = plan(graced, last, later)
    assert p.fire == tuple(graced.tick_at(later) - timedelta(minutes=n) for n in range(4, -1, -1))
    assert p.missed == 3 * 60 - 5
    # A grace of a day never sends more than CATCH_UP_LIMIT ticks in one pass.
    p = plan(schedule("d", "t", every=60, grace=86_400), last, later)
    assert len(p.fire) == CATCH_UP_LIMIT and p.missed == 3 * 60 - CATCH_UP_LIMIT


def test_the_newest_tick_is_sent_even_late_for_the_worker_to_record():
    s = schedule("s", "t", every=60, grace=5)
    last = s.tick_at(NOW) - timedelta(minutes=1)
    p = plan(s, last, s.tick_at(NOW) + timedelta(seconds=30))
    assert p.fire == (s.tick_at(NOW),) and p.missed == 0
    assert s.late(s.tick_at(NOW), NOW + timedelta(seconds=30))


class Book:
    def __init__(self):
        self.notes = {}

    def last(self, name):
        return self.notes.get(name)

    def note(self, name, tick):
        self.notes[name] = tick


class Timetable:
    def __init__(self, *schedules):
        self.schedules = schedules


def test_a_failed_send_leaves_its_tick_for_the_next_pass():
    s = schedule("s", "t", every=10, grace=60)
    book, sent = Book(), []
    book.note("s", s.tick_at(NOW) - timedelta(seconds=30))
    broken = {"on": True}

    def send(schedule, tick, missed):
        if broken["on"] and tick == s.tick_at(NOW) - timedelta(seconds=10):
            raise ConnectionError("broker away")
        sent.append((tick, missed))

    wait = fire_due(Timetable(s), book, send, NOW)
    assert sent == [(s.tick_at(NOW) - timedelta(seconds=20), 0)]
    assert book.last("s") == s.tick_at(NOW) - timedelta(seconds=20)
    assert 0 < wait <= 10
    broken["on"] = False
    fire_due(Timetable(s), book, send, NOW)
    assert [t for t, _ in sent[1:]] == [s.tick_at(NOW) - timedelta(seconds=10), s.tick_at(NOW)]
    assert book.last("s") == s.tick_at(NOW)
    fire_due(Timetable(s), book, send, NOW)
    assert len(sent) == 3, "a tick handled is never sent again by the same book"
