"""A weekly schedule of allowed hours, e.g. ``"mon-fri 18:00-08:00, weekends"``.

Entries are separated by commas. Each names a day (``mon``..``sun``), a range of days
(``mon-fri``), or ``daily``, ``weekdays``, ``weekends``, optionally followed by a time range;
a time range that ends before it starts runs past midnight into the next day.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta

DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
GROUPS = {"daily": "mon-sun", "weekdays": "mon-fri", "weekends": "sat-sun"}
DAY_MINUTES = 24 * 60
WEEK = 7 * DAY_MINUTES
_ENTRY = re.compile(
    r"^(?P<days>[a-z]+(?:-[a-z]+)?)(?:\s+(?P<start>\d{1,2}:\d{2})\s*-\s*(?P<end>\d{1,2}:\d{2}))?$"
)


def _minute(text: str) -> int:
    hours, minutes = (int(x) for x in text.split(":"))
    if not (0 <= hours <= 24 and 0 <= minutes < 60) or (hours == 24 and minutes):
        raise ValueError(f"not a time of day: {text}")
    return hours * 60 + minutes


def _days(text: str) -> list[int]:
    first, _, last = GROUPS.get(text, text).partition("-")
    if first not in DAYS or (last and last not in DAYS):
        raise ValueError(f"unknown day {text!r}: use mon..sun, a range like mon-fri, daily, "
                         "weekdays or weekends")
    a, b = DAYS.index(first), DAYS.index(last or first)
    return [(a + i) % 7 for i in range((b - a) % 7 + 1)]


@dataclass(frozen=True)
class WeeklySchedule:
    """Allowed minutes of the week, as sorted, non-overlapping [start, end) intervals."""

    text: str
    intervals: tuple[tuple[int, int], ...]

    @classmethod
    def parse(cls, text: str) -> WeeklySchedule:
        text = " ".join(text.lower().split())
        if text in ("", "always"):
            return cls("always", ((0, WEEK),))
        spans: list[tuple[int, int]] = []
        for entry in (e.strip() for e in text.split(",")):
            match = _ENTRY.match(entry)
            if not match:
                raise ValueError(f"cannot read schedule entry {entry!r} (e.g. 'mon-fri 18:00-08:00')")
            start = _minute(match["start"]) if match["start"] else 0
            end = _minute(match["end"]) if match["end"] else DAY_MINUTES
            length = (end - start) % DAY_MINUTES or DAY_MINUTES
            for day in _days(match["days"]):
                begin = day * DAY_MINUTES + start
                spans += _split_at_week_end(begin, begin + length)
        return cls(text, _merge(spans))

    @property
    def always(self) -> bool:
        return self.intervals == ((0, WEEK),)

    def allows(self, when: datetime) -> bool:
        minute = _minute_of_week(when)
        return any(a <= minute < b for a, b in self.intervals)

    def next_change(self, when: datetime) -> datetime | None:
        """When ``allows`` flips next (None if it never does)."""
        if self.always:
            return None
        # A boundary that both ends one interval and starts another (only the week's wrap,
        # since intervals are merged) is not a change.
        edges = {a for a, _ in self.intervals} ^ {b % WEEK for _, b in self.intervals}
        minute = _minute_of_week(when)
        ahead = min((e - minute) % WEEK or WEEK for e in edges)
        return when.replace(second=0, microsecond=0) + timedelta(minutes=ahead)


def _split_at_week_end(begin: int, end: int) -> list[tuple[int, int]]:
    if end <= WEEK:
        return [(begin, end)]
    return [(begin, WEEK), (0, end - WEEK)]


def _merge(spans: list[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    merged: list[list[int]] = []
    for a, b in sorted(spans):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return tuple((a, b) for a, b in merged)


def _minute_of_week(when: datetime) -> int:
    return when.weekday() * DAY_MINUTES + when.hour * 60 + when.minute
