"""Day sums of the compact PostgreSQL store: per run, GPU and UTC day (series/base.DayRollup).

The ledger's rule (store/cost_queries.py): an interval crossing a UTC midnight is split at it in
proportion to its time in each day, and counts (``intervals``) on the day it ends. As the
ClickHouse store (series/clickhouse_ddl.py) the split is done in integer units: the part of a
value v up to an instant x is round-half-up(v * (x - t0) / dur), and a day's part is the
difference of two such, so the parts of one interval add up to v exactly and both stores give
the same figures. A value is None on a day when no interval measured it there.

The rows inside one day are summed in SQL (a GROUP BY per stream, day and shape: the shape says
which values were None); the odd rows (crossing a midnight, or with a value in ``extra``) are
read one by one through their partial index and split here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from gpuledger.series.postgres_codec import DAY_MS, NULLABLE, Shape

# DayRollup's measured sums: (ledger column, compact column)
MEASURED = (
    ("busy_s", "busy_ms"),
    ("util_idle_s", "idle_ms"),
    ("util_unknown_s", "unknown_ms"),
    ("util_unmeasured_s", "unmeasured_ms"),
    ("energy_j", "energy_mj"),
)


@dataclass
class DaySum:
    intervals: int = 0
    samples: int = 0
    allocated_ms: int = 0
    sums: dict[str, int] = field(default_factory=lambda: dict.fromkeys((k for k, _ in MEASURED), 0))
    measured: dict[str, int] = field(default_factory=lambda: dict.fromkeys((k for k, _ in MEASURED), 0))


def _div_half_up(num: int, den: int) -> int:
    """(2 num + den) / 2 den truncated toward zero, as ClickHouse's intDiv: round half up for num >= 0."""
    a, b = 2 * num + den, 2 * den
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def _part(v: int, t0: int, dur: int, a: int, b: int) -> int:
    """The part of ``v`` falling in [a, b) of the interval [t0, t0 + dur)."""
    if dur == 0:
        return v
    return _div_half_up(v * (b - t0), dur) - _div_half_up(v * (a - t0), dur)


def add_group(into: DaySum, shape: Shape, n: int, samples: int, dur: int, sums: dict[str, int | None]) -> None:
    """``n`` rows inside one day, of one shape, summed by SQL (NULL sums: no such row had a value)."""
    into.intervals += n
    into.samples += samples
    into.allocated_ms += dur
    for key, _ in MEASURED:
        if not shape.nulls >> NULLABLE.index(key) & 1:
            into.measured[key] += n
            into.sums[key] += sums[key] or 0


def split_row(days: dict[int, DaySum], units: dict[str, int | None], samples: int, lo: int, hi: int) -> None:
    """One decoded row (``units``: postgres_codec.gpu_units) added to each day of [lo, hi] it overlaps."""
    t0, dur = units["t0"], units["dur_ms"]
    assert t0 is not None and dur is not None
    t1 = t0 + dur
    last = (t1 - 1) // DAY_MS if dur else t0 // DAY_MS
    for day in range(max(lo, t0 // DAY_MS), min(hi, last) + 1):
        a, b = max(t0, day * DAY_MS), min(t1, (day + 1) * DAY_MS)
        d = days.setdefault(day, DaySum())
        d.intervals += int(day == last)
        d.samples += _part(samples, t0, dur, a, b)
        d.allocated_ms += b - a
        for key, _ in MEASURED:
            v = units[key]
            if v is not None:
                d.measured[key] += 1
                d.sums[key] += _part(v, t0, dur, a, b)


def first_day_reaching(lo: int, max_dur_ms: int) -> int:
    """The earliest day whose rows can reach into day ``lo``."""
    return lo - (max_dur_ms + DAY_MS - 1) // DAY_MS


def day_range(t_from: float, t_to: float) -> tuple[int, int] | None:
    """The days overlapping [t_from, t_to) (seconds), as (lo, hi); None when empty."""
    if not t_to > t_from:
        return None
    return math.floor(t_from / 86400), math.ceil(t_to / 86400) - 1
