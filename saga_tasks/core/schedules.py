"""Sagas on a schedule: which ticks are due, and the one saga each tick starts.

A schedule names a saga type, a period (``every`` so many seconds, aligned to the Unix
epoch, or a ``cron`` expression read in UTC) and a payload. Each due time is a *tick*.
The saga a tick starts has a business key made of the schedule's key and the tick, and a
start is idempotent by business key, so a tick fired twice (two beats during a takeover,
a beat restarted, a firing redelivered) starts one saga. A firing carries its tick: one
delivered late still starts the saga of the tick it was meant for, or none.

*Grace* bounds how late a tick may still start its saga, from beat or from a worker
(default: until the next tick is due). Ticks older than that are missed: counted and
logged, never started, so a beat back after an outage starts at most the newest tick,
not a storm of old ones.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from saga_tasks.core.cron import Cron
from saga_tasks.errors import InvalidInterval, InvalidScheduledPayload, ScheduleError

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MIN_EVERY = timedelta(seconds=1)
"""Beat wakes about once a second (``BEAT_MIN_SLEEP``): a shorter period would skip ticks."""
MAX_KEY = 160
"""Longest key of a schedule: the tick (up to 27 characters) and ``@`` must still fit in a
business key (200)."""
CATCH_UP_LIMIT = 10
"""Ticks one beat pass sends for one schedule at most, newest first; older ones are missed."""
COUNT_LIMIT = 10_000
"""Missed cron ticks are counted up to this many (a long outage of a minutely schedule)."""
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,99}$")
_US = timedelta(microseconds=1)

PayloadSource = Mapping[str, Any] | Callable[[datetime], Mapping[str, Any]]
"""A fixed payload, or a function of the tick that returns one."""


@dataclass(frozen=True)
class Schedule:
    """A saga type started on a schedule; build it with ``schedule()``."""

    name: str
    """Unique in the app; names the schedule in logs, metrics and the runs table."""
    saga_type: str
    every: timedelta | None
    """Period of an interval schedule; its ticks are the multiples of it since the epoch."""
    cron: Cron | None
    """Cron expression (UTC) of a cron schedule; its ticks are the expression's due times."""
    payload: PayloadSource
    """A fixed JSON object (checked against the saga's schema when the app is built), or a
    function of the tick; it must return the same payload for the same tick, or a tick
    fired twice is recorded as started with the first firing's payload."""
    key: str
    """Business keys are ``<key>@<tick>``; defaults to ``schedule:<name>``. Keep it when
    renaming a schedule, so a tick fired before and after the rename starts one saga."""
    grace: timedelta | None
    """How late after its tick a firing may still start the saga (None: until the next
    tick is due)."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise ScheduleError(
                str(self.name),
                "a name is 1-100 letters, digits, '_', '.', ':' or '-', starting with a "
                "letter or digit",
            )
        if not isinstance(self.saga_type, str) or not self.saga_type:
            raise ScheduleError(self.name, "names no saga type")
        if (self.every is None) == (self.cron is None):
            raise ScheduleError(self.name, "give exactly one of every= and cron=")
        for value in (self.every, self.grace):
            if value is not None and not isinstance(value, timedelta):
                raise InvalidInterval(self.name, "every and grace are timedeltas: use schedule()")
        if self.cron is not None and not isinstance(self.cron, Cron):
            raise ScheduleError(self.name, "cron is a parsed Cron: use schedule()")
        if self.every is not None and (self.every < MIN_EVERY or self.every % _US):
            raise InvalidInterval(
                self.name,
                f"every={self.every.total_seconds():g} s: an interval is at least "
                f"{MIN_EVERY.total_seconds():g} s (beat wakes about once a second), in "
                "whole microseconds",
            )
        if self.grace is not None and self.grace <= timedelta(0):
            raise InvalidInterval(self.name, "grace must be positive (or None: one period)")
        if not self.key or len(self.key) > MAX_KEY or not self.key.isprintable():
            raise ScheduleError(self.name, f"key must be 1-{MAX_KEY} printable characters")
        if not callable(self.payload) and not isinstance(self.payload, Mapping):
            raise InvalidScheduledPayload(
                self.name, "payload must be a JSON object or a function of the tick"
            )

    # -- ticks ------------------------------------------------------------------------

    def tick_at(self, now: datetime) -> datetime:
        """The latest tick at or before ``now``."""
        if self.cron is not None:
            return self.cron.previous(now)
        assert self.every is not None
        since = (now.astimezone(UTC) - EPOCH) // _US
        period = self.every // _US
        return EPOCH + (since - since % period) * _US

    def next_tick(self, after: datetime) -> datetime:
        """The earliest tick strictly after ``after``."""
        if self.cron is not None:
            return self.cron.next(after)
        assert self.every is not None
        return self.tick_at(after) + self.every

    def previous_tick(self, before: datetime) -> datetime:
        """The latest tick strictly before ``before``."""
        return self.tick_at(before - _US)

    def on_grid(self, when: datetime) -> bool:
        """True if ``when`` is one of this schedule's ticks."""
        return self.tick_at(when) == when

    def deadline(self, tick: datetime) -> datetime:
        """When a firing of ``tick`` is too late to start its saga."""
        return tick + self.grace if self.grace is not None else self.next_tick(tick)

    def late(self, tick: datetime, now: datetime) -> bool:
        return now >= self.deadline(tick)

    def count_between(self, after: datetime, upto: datetime) -> int:
        """Ticks in ``(after, upto]`` (cron ticks counted up to ``COUNT_LIMIT``)."""
        if upto <= after:
            return 0
        if self.every is not None:
            return (self.tick_at(upto) - self.tick_at(after)) // self.every
        n, t = 0, self.tick_at(upto)
        while t > after and n < COUNT_LIMIT:
            n, t = n + 1, self.previous_tick(t)
        return n

    # -- what a tick starts -------------------------------------------------------------

    def business_key(self, tick: datetime) -> str:
        return f"{self.key}@{format_tick(tick)}"

    def payload_for(self, tick: datetime) -> dict[str, Any]:
        """The payload of ``tick``'s saga (a function is called with the tick)."""
        if isinstance(self.payload, Mapping):
            return dict(self.payload)
        return dict(self.payload(tick))

    def describe(self) -> str:
        if self.cron is not None:
            return f"cron {self.cron}"
        assert self.every is not None
        return f"every {self.every.total_seconds():g} s"


def schedule(
    name: str,
    saga_type: str,
    *,
    every: float | timedelta | None = None,
    cron: str | None = None,
    payload: PayloadSource | None = None,
    key: str | None = None,
    grace: float | timedelta | None = None,
) -> Schedule:
    """Build a schedule: ``every`` seconds (or a timedelta) or a ``cron`` expression (UTC),
    a fixed ``payload`` or a function of the tick (default: an empty object)."""
    if payload is None:
        payload = {}
    if isinstance(payload, Mapping):
        try:
            payload = json.loads(json.dumps(dict(payload)))  # a frozen copy, JSON or refused
        except (TypeError, ValueError) as exc:
            raise InvalidScheduledPayload(name, f"payload is not JSON: {exc}") from None
    return Schedule(
        name=name,
        saga_type=saga_type,
        every=_seconds(name, "every", every),
        cron=Cron.parse(cron, schedule=name) if cron is not None else None,
        payload=payload,
        key=f"schedule:{name}" if key is None else key,
        grace=_seconds(name, "grace", grace),
    )


def _seconds(name: str, what: str, value: float | timedelta | None) -> timedelta | None:
    if value is None or isinstance(value, timedelta):
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidInterval(name, f"{what} must be a number of seconds or a timedelta")
    if not math.isfinite(value) or value <= 0:
        raise InvalidInterval(name, f"{what}={value} must be a positive number of seconds")
    return timedelta(seconds=value)


@dataclass(frozen=True)
class Plan:
    """What one beat pass does for one schedule."""

    fire: tuple[datetime, ...]
    """Ticks to send, oldest first."""
    seen: datetime | None
    """The newest tick handled once these are sent (beat keeps it for the next pass)."""
    missed: int
    """Ticks between the last one handled and the oldest sent that are too late to start."""


def plan(schedule: Schedule, last: datetime | None, now: datetime) -> Plan:
    """The ticks due since ``last`` (the newest tick handled before), as of ``now``.

    A schedule seen for the first time fires nothing: its first tick is the next one (a
    daily schedule deployed at 14:00 does not start 02:00's saga at once). Otherwise the
    newest tick is always sent, late or not (the worker drops and records a late one),
    with up to ``CATCH_UP_LIMIT`` - 1 older ticks still within their grace.
    """
    latest = schedule.tick_at(now)
    if last is None:
        return Plan((), latest, 0)
    if latest <= last:
        return Plan((), last, 0)
    fire = [latest]
    t = schedule.previous_tick(latest)
    while t > last and len(fire) < CATCH_UP_LIMIT and not schedule.late(t, now):
        fire.append(t)
        t = schedule.previous_tick(t)
    missed = schedule.count_between(last, t) if t > last else 0
    return Plan(tuple(reversed(fire)), latest, missed)


def format_tick(tick: datetime) -> str:
    """``2026-12-01T02:00:00Z`` (microseconds only when there are some)."""
    t = tick.astimezone(UTC)
    if t.microsecond:
        return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_tick(text: str) -> datetime:
    """The tick ``format_tick`` wrote (or any aware ISO time); ``ValueError`` otherwise."""
    parsed = datetime.fromisoformat(str(text))
    if parsed.tzinfo is None:
        raise ValueError("a tick names its time zone")
    return parsed.astimezone(UTC)
