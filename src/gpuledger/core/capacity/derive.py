"""Capacity states derived from recorded runs, for GPUs no node agent watches (wrapped-only
deployments). Pure.

What runs can tell: a GPU exists from the first run recorded on it to the end of the last; it is
*held* while a run holds it (the union of the runs' held time: a shared GPU's time is split between
its runs, so the shares add up to it once), and *busy* for the busy time those runs measured —
all of it attributed, to the runs. What they cannot: GPUs no run ever used, time before the first
and after the last run, and work done on the GPU outside any recorded run (counted as not busy).
Busy time a GPU did not report (MIG slices, held time of a run whose intervals were removed) is
counted busy while a run held it, as the chargeback bills it on the busy basis.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpuledger.core.capacity.model import DAY_MS

__all__ = ["HeldDay", "derive_days"]


@dataclass
class HeldDay:
    """What the runs on one GPU did on one day: milliseconds held, busy, held but not measured."""

    held_ms: float = 0.0
    busy_ms: float = 0.0
    unmeasured_ms: float = 0.0
    energy_j: float | None = None
    host: str = ""
    first_ms: int | None = None
    last_ms: int | None = None


def derive_days(
    uuid: str, host: str, presence: tuple[int, int], held: Mapping[int, HeldDay], window: tuple[int, int]
) -> Iterable[tuple[object, ...]]:
    """Day rows (store/capacity_queries.DAY_COLUMNS order) of one GPU known from runs: from its
    ``presence`` [first, last) ms, clipped to the ``window``, and the runs' ``held`` time per day;
    a day without runs is put on ``host`` (where its latest run ran). Each row's four states add
    up to the GPU's time in the fleet that day exactly."""
    p0, p1 = max(presence[0], window[0]), min(presence[1], window[1])
    days = {d for d in held if window[0] // DAY_MS <= d <= (window[1] - 1) // DAY_MS}
    if p1 > p0:
        days.update(range(p0 // DAY_MS, (p1 - 1) // DAY_MS + 1))
    for day in sorted(days):
        h = held.get(day) or HeldDay()
        d0, d1 = day * DAY_MS, (day + 1) * DAY_MS
        a = min(max(p0, d0), h.first_ms if h.first_ms is not None else d1)
        b = max(min(p1, d1), h.last_ms if h.last_ms is not None else d0)
        if b <= a:
            continue
        span = b - a
        held_ms = min(span, round(h.held_ms))
        busy = min(held_ms, round(h.busy_ms + h.unmeasured_ms))
        unmeasured = min(busy, round(h.unmeasured_ms))
        yield (uuid, day, h.host or host, a, b, span - held_ms, held_ms - busy, busy, 0, unmeasured, h.energy_j)
