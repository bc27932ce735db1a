"""UTC months: the calendar cost reports are cut by. Pure; day numbers are cached because a
report asks for the month of the same few days hundreds of thousands of times."""

from __future__ import annotations

import datetime as dt
import math

__all__ = ["month_bounds", "month_of", "month_starts"]

_MONTHS: dict[int, tuple[str, float, float]] = {}  # day number -> (month, start, next month start)


def _month_of_day(day: int) -> tuple[str, float, float]:
    found = _MONTHS.get(day)
    if found is None:
        d = dt.datetime.fromtimestamp(day * 86400, tz=dt.timezone.utc)
        start = dt.datetime(d.year, d.month, 1, tzinfo=dt.timezone.utc)
        nxt = dt.datetime(d.year + d.month // 12, d.month % 12 + 1, 1, tzinfo=dt.timezone.utc)
        found = _MONTHS[day] = (f"{d.year:04d}-{d.month:02d}", start.timestamp(), nxt.timestamp())
    return found


def month_of(t: float) -> str:
    return _month_of_day(math.floor(t / 86400))[0]


def month_bounds(month: str) -> tuple[float, float]:
    """ "2026-03" -> [start, end) epoch seconds, UTC."""
    year, mon = (int(x) for x in month.split("-"))
    start = dt.datetime(year, mon, 1, tzinfo=dt.timezone.utc)
    end = dt.datetime(year + mon // 12, mon % 12 + 1, 1, tzinfo=dt.timezone.utc)
    return start.timestamp(), end.timestamp()


def month_starts(t0: float, t1: float) -> list[float]:
    """Month starts strictly inside (t0, t1)."""
    out = []
    _, _, nxt = _month_of_day(math.floor(t0 / 86400))
    while nxt < t1:
        out.append(nxt)
        _, _, nxt = _month_of_day(math.floor(nxt / 86400))
    return out
