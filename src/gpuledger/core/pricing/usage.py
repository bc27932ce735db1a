"""What a run used of each GPU, per UTC day: the rollup the cost model prices.

A run holds its GPUs from its start to its end. For a run that did not finish normally (killed,
lost, failed, or still running) the end is its last recorded interval: it is priced for what was
measured, and flagged. Busy time and energy are the interval integrals, split at
UTC midnight in proportion to time where an interval crosses it, so month boundaries are exact.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gpuledger.core.model import DISCOVERED

__all__ = [
    "DAY_S",
    "PARTIAL_STATUSES",
    "DayUsage",
    "Segment",
    "day_of",
    "days_from_segments",
    "held_span",
    "partial_flag",
    "period_of",
    "split_days",
]

DAY_S = 86400
# Runs priced only up to their last recorded interval (and flagged in reports).
PARTIAL_STATUSES = frozenset({"killed", "lost", "failed", "running"})


def partial_flag(status: str, ended_at: float | None) -> str | None:
    """The flag of a run priced only up to its last interval (None: priced to its end): its status,
    and ``running`` for a discovered run its agent has not ended yet."""
    if status in PARTIAL_STATUSES:
        return status
    return "running" if status == DISCOVERED and ended_at is None else None


@dataclass(slots=True)
class DayUsage:
    """One run's use of one GPU during (part of) one UTC day. Seconds are the run's own, after the
    split of a shared GPU (``share_rule`` says how); MIG fractions are applied later, by the pricer
    (the table that knows a model's slice count can be overridden by a rate card)."""

    run_id: str
    device_uuid: str
    day: int  # days since 1970-01-01 UTC
    t0: float  # first instant held in this day
    t1: float  # last instant held in this day
    alloc_s: float  # seconds held
    busy_s: float | None  # None: this GPU's busy time is not measured
    energy_j: float | None
    intervals: int = 0
    share_rule: str | None = None  # "sm", "memory", "equal" when the GPU was shared
    gpu_name: str | None = None  # the device's (copied into rollups so reports need no join)
    mig_profile: str | None = None


@dataclass(slots=True)
class Segment:
    """A piece of a run's use of one GPU, as attributed (share.py) or as recorded (one interval)."""

    t0: float
    t1: float
    alloc_s: float
    busy_s: float | None
    energy_j: float | None
    rule: str | None = None
    intervals: int = 0  # recording intervals that end in this segment (for counts only)


def day_of(t: float) -> int:
    return math.floor(t / DAY_S)


def held_span(status: str, started_at: float, ended_at: float | None, last_t1: float | None) -> tuple[float, float]:
    """[start, end) the run held its GPUs, as priced. ``last_t1``: the end of its last GPU interval."""
    if status in PARTIAL_STATUSES or ended_at is None:
        end = last_t1 if last_t1 is not None else (ended_at if status not in PARTIAL_STATUSES else None)
        end = started_at if end is None else end
    else:
        end = ended_at
    return started_at, max(started_at, end)


def split_days(t0: float, t1: float, cuts: Sequence[float] = ()) -> list[tuple[int, float, float]]:
    """[t0, t1) cut at UTC midnights and at ``cuts`` (sorted): (day, start, end) per piece."""
    out = []
    day = day_of(t0)
    start = t0
    inner = [c for c in cuts if t0 < c < t1]
    while True:
        edge = float((day + 1) * DAY_S)
        while inner and inner[0] < edge:
            out.append((day, start, inner[0]))
            start = inner.pop(0)
        if t1 <= edge:
            out.append((day, start, t1))
            return out
        out.append((day, start, edge))
        day, start = day + 1, edge


def period_of(a: float, b: float, cuts: Sequence[float] = ()) -> tuple[int, int]:
    """The (day, period) a piece [a, b) from ``split_days`` lies in: pieces never straddle a
    midnight or a cut, so its start names them. Not the midpoint: a piece one float step wide just
    before a midnight or a cut has its midpoint rounded onto it, in the next day or period."""
    return day_of(a), bisect.bisect_right(cuts, a)


def _scaled(value: float | None, share: float) -> float | None:
    return None if value is None else value * share


def days_from_segments(
    run_id: str,
    device_uuid: str,
    segments: Iterable[Segment],
    *,
    measured: bool | None = None,
    cuts: Sequence[float] = (),
) -> list[DayUsage]:
    """Sum segments into day rows; a segment crossing midnight is split in proportion to time.
    ``measured``: whether the GPU reports busy time at all (then a day without busy figures counts
    0 busy seconds rather than "not measured"); None = decide from the segments. ``cuts``: more
    times to split at (a price change inside a day), giving several rows for that day."""
    segments = list(segments)
    if measured is None:
        measured = any(s.busy_s is not None for s in segments)
    energy_known = any(s.energy_j is not None for s in segments)
    days: dict[tuple[int, int], DayUsage] = {}
    rules: dict[tuple[int, int], set[str]] = {}
    for seg in segments:
        length = seg.t1 - seg.t0
        pieces = split_days(seg.t0, seg.t1, cuts) if length > 0 else [(day_of(seg.t0), seg.t0, seg.t1)]
        for day, a, b in pieces:
            share = (b - a) / length if length > 0 else 1.0
            key = period_of(a, b, cuts)
            row = days.get(key)
            if row is None:
                row = days[key] = DayUsage(
                    run_id, device_uuid, day, a, b, 0.0, 0.0 if measured else None, 0.0 if energy_known else None
                )
            row.t0, row.t1 = min(row.t0, a), max(row.t1, b)
            row.alloc_s += seg.alloc_s * share
            if seg.busy_s is not None and row.busy_s is not None:
                row.busy_s += seg.busy_s * share
            if seg.energy_j is not None and row.energy_j is not None:
                row.energy_j += seg.energy_j * share
            if b == seg.t1:
                row.intervals += seg.intervals
            if seg.rule:
                rules.setdefault(key, set()).add(seg.rule)
    for key, found in rules.items():
        days[key].share_rule = weakest_rule(found)
    for row in days.values():
        if row.busy_s is not None:
            row.busy_s = min(row.busy_s, row.alloc_s)  # tick edges can put busy a hair above held time
    return [days[k] for k in sorted(days)]


RULE_ORDER = ("sm", "memory", "equal")


def weakest_rule(rules: Iterable[str]) -> str:
    """The least precise of the share rules used (a day split by SM share and by memory reads "memory")."""
    found = set(rules)
    return max(found, key=lambda r: RULE_ORDER.index(r) if r in RULE_ORDER else len(RULE_ORDER))


def alloc_segments(start: float, end: float, intervals: Iterable[Segment]) -> list[Segment]:
    """A run-device's held span [start, end) as segments: the recorded intervals clipped to the
    span carry busy and energy; the gaps between them carry held time only."""
    out: list[Segment] = []
    cursor = start
    for iv in sorted(intervals, key=lambda s: s.t0):
        a, b = max(iv.t0, cursor), min(iv.t1, end)
        if a > cursor:
            out.append(Segment(cursor, a, a - cursor, None, None))
        if b > a:
            share = (b - a) / (iv.t1 - iv.t0)
            out.append(
                Segment(a, b, b - a, _scaled(iv.busy_s, share), _scaled(iv.energy_j, share), iv.rule, iv.intervals)
            )
            cursor = b
        elif iv.t1 <= iv.t0 and start <= iv.t0 < end:  # a zero-length interval still counts its integrals
            out.append(Segment(iv.t0, iv.t0, 0.0, iv.busy_s, iv.energy_j, iv.rule, iv.intervals))
    if end > cursor:
        out.append(Segment(cursor, end, end - cursor, None, None))
    return out
