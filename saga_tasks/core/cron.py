"""Cron expressions read in UTC, and the due times they name.

Pure arithmetic, so beat and every worker agree on each due time without a library, and
tests check it with hypothesis. The grammar is Vixie cron's five fields, ``minute hour
day-of-month month day-of-week``, each ``*``, a number, a range ``a-b``, a step (``*/n``,
``a-b/n``, ``a/n``) or a comma-separated list of those; month and weekday names
(``jan``, ``mon``); 0 and 7 both mean Sunday; and ``@hourly``, ``@daily``, ``@weekly``,
``@monthly``, ``@yearly``. As in Vixie cron, when both day fields are restricted (neither
starts with ``*``) a day is due if either matches. Due times fall on whole minutes.
"""

from __future__ import annotations

import calendar
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from saga_tasks.errors import InvalidCron

MACROS = {
    "@hourly": "0 * * * *",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@weekly": "0 0 * * 0",
    "@monthly": "0 0 1 * *",
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
}
_MONTHS = {name.lower(): i for i, name in enumerate(calendar.month_abbr) if name}
_WEEKDAYS = {"sun": 0, "mon": 1, "tue": 2, "wed": 3, "thu": 4, "fri": 5, "sat": 6}
_FIELDS: tuple[tuple[str, int, int, dict[str, int]], ...] = (
    ("minute", 0, 59, {}),
    ("hour", 0, 23, {}),
    ("day of month", 1, 31, {}),
    ("month", 1, 12, _MONTHS),
    ("day of week", 0, 7, _WEEKDAYS),
)
SEARCH_DAYS = 366 * 9
"""Days searched for a due time: the sparsest expression that can be due at all (29
February alone) is due at least once in 8 years (1896 to 1904, 2096 to 2104)."""


@dataclass(frozen=True)
class Cron:
    """A parsed cron expression; ``previous`` and ``next`` find its due times."""

    expression: str
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]
    """0 is Sunday (7 is read as 0)."""
    any_day: bool
    any_weekday: bool

    @classmethod
    def parse(cls, expression: str, *, schedule: str = "?") -> Cron:
        """Parse ``expression``; ``InvalidCron`` (naming ``schedule``) says what is wrong."""
        text = " ".join(str(expression).split()).lower()
        text = MACROS.get(text, text)
        parts = text.split(" ")
        if len(parts) != len(_FIELDS):
            raise InvalidCron(
                schedule,
                f"cron {expression!r} must have 5 fields (minute hour day-of-month month "
                "day-of-week) or be one of " + ", ".join(MACROS),
            )
        values = [
            _field(part, name, (low, high), names, where=(schedule, expression))
            for part, (name, low, high, names) in zip(parts, _FIELDS, strict=True)
        ]
        minutes, hours, days, months, weekdays = values
        cron = cls(
            expression=" ".join(str(expression).split()),
            minutes=tuple(sorted(minutes)),
            hours=tuple(sorted(hours)),
            days=frozenset(days),
            months=frozenset(months),
            weekdays=frozenset(d % 7 for d in weekdays),
            any_day=parts[2].startswith("*"),
            any_weekday=parts[4].startswith("*"),
        )
        if cron.any_weekday and not cron.any_day:
            longest = {m: 29 if m == 2 else calendar.monthrange(2001, m)[1] for m in months}
            if not any(d <= longest[m] for m in months for d in days):
                raise InvalidCron(
                    schedule, f"cron {expression!r} is never due: no month has those days"
                )
        return cron

    def day_matches(self, day: date) -> bool:
        if day.month not in self.months:
            return False
        by_date = day.day in self.days
        by_weekday = day.isoweekday() % 7 in self.weekdays
        if self.any_day:
            return by_weekday
        if self.any_weekday:
            return by_date
        return by_date or by_weekday

    def matches(self, when: datetime) -> bool:
        """True if ``when`` (aware) is one of the due times."""
        t = when.astimezone(UTC)
        return (
            t.second == 0
            and t.microsecond == 0
            and t.minute in self.minutes
            and t.hour in self.hours
            and self.day_matches(t.date())
        )

    def previous(self, when: datetime) -> datetime:
        """The latest due time at or before ``when`` (aware)."""
        t = when.astimezone(UTC).replace(second=0, microsecond=0)
        day, limit = t.date(), (t.hour, t.minute)
        for _ in range(SEARCH_DAYS):
            if self.day_matches(day):
                for hour in reversed(self.hours):
                    if hour > limit[0]:
                        continue
                    top = limit[1] if hour == limit[0] else 59
                    for minute in reversed(self.minutes):
                        if minute <= top:
                            return _at(day, hour, minute)
            day, limit = day - timedelta(days=1), (23, 59)
        raise InvalidCron(self.expression, "no due time found before this one")  # parse refuses

    def next(self, when: datetime) -> datetime:
        """The earliest due time strictly after ``when`` (aware)."""
        t = when.astimezone(UTC).replace(second=0, microsecond=0) + timedelta(minutes=1)
        day, floor = t.date(), (t.hour, t.minute)
        for _ in range(SEARCH_DAYS):
            if self.day_matches(day):
                for hour in self.hours:
                    if hour < floor[0]:
                        continue
                    bottom = floor[1] if hour == floor[0] else 0
                    for minute in self.minutes:
                        if minute >= bottom:
                            return _at(day, hour, minute)
            day, floor = day + timedelta(days=1), (0, 0)
        raise InvalidCron(self.expression, "no due time found after this one")  # parse refuses

    def __str__(self) -> str:
        return self.expression


def _at(day: date, hour: int, minute: int) -> datetime:
    return datetime(day.year, day.month, day.day, hour, minute, tzinfo=UTC)


def _field(
    text: str,
    name: str,
    bounds: tuple[int, int],
    names: dict[str, int],
    *,
    where: tuple[str, str],
) -> set[int]:
    """The values one field names; ``where`` is (schedule, expression) for errors."""
    (low, high), (schedule, expression) = bounds, where

    def bad(why: str) -> InvalidCron:
        return InvalidCron(schedule, f"cron {expression!r}: {name} {text!r}: {why}")

    def number(word: str) -> int:
        if word in names:
            return names[word]
        if not word.isdigit():
            raise bad(f"{word!r} is not a number" + (" or a name" if names else ""))
        value = int(word)
        if not low <= value <= high:
            raise bad(f"{value} is outside {low}-{high}")
        return value

    found: set[int] = set()
    for item in text.split(","):
        span, slash, step_text = item.partition("/")
        step = 1
        if slash:
            if not step_text.isdigit() or int(step_text) < 1:
                raise bad("a step must be a whole number of at least 1")
            step = int(step_text)
        if span == "*":
            start, stop = low, high
        elif "-" in span:
            first, _, last = span.partition("-")
            start, stop = number(first), number(last)
            if start > stop:
                raise bad(f"the range {span!r} runs backwards")
        else:
            start = number(span)
            stop = high if slash else start
        found.update(range(start, stop + 1, step))
    return found
