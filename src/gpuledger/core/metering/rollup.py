"""Rolling intervals up to coarser ones (1 minute, 1 hour) with exact sums (pure, no I/O).

Consecutive intervals of one series are merged (core/metering/intervals.py rules: integrals summed, gauges
max / last / time-weighted) while they fall in the same ``level_s`` bucket of wall-clock time
(by t0). A group also ends at a gap in the data (a rolled-up interval never spans time nobody
measured) and at a cut.

Cuts are the instants where figures are later cut by time (epoch boundaries, UTC midnights, price
changes, the start and end of another run on the same GPU: store/retention.py gathers them). A
report splits an interval that contains a cut in proportion to time, so a merged interval never
contains one strictly inside it: a cut between two intervals ends the group there, and a raw
interval with a cut inside stays a group of its own, so splitting it later gives exactly what
the raw ledger gave. Intervals overlapping a ``keep`` span (a GPU shared with another run, which
the share split works out interval by interval) are not merged at all.

A merged interval keeps the seq of its first part, so seqs stay unique and stable.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from typing import TypeVar

from gpuledger.core.metering.intervals import merge_gpu_intervals, merge_host_intervals
from gpuledger.core.model import GpuInterval, HostInterval

LEVELS_S = (60, 3600)
GAP_S = 1.0  # a hole longer than this between two intervals is kept as a hole

IV = TypeVar("IV", GpuInterval, HostInterval)
Span = tuple[float, float]


def _cut_within(cuts: Sequence[float], a: float, b: float) -> bool:
    """Some cut c lies strictly inside (a, b)."""
    i = bisect.bisect_right(cuts, a)
    return i < len(cuts) and cuts[i] < b


def _union(spans: Sequence[Span]) -> list[Span]:
    out: list[Span] = []
    for a, b in sorted(s for s in spans if s[1] > s[0]):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _overlaps(spans: Sequence[Span], starts: Sequence[float], t0: float, t1: float) -> bool:
    """[t0, t1] meets one of the disjoint, sorted ``spans`` (a zero-length interval: lies in one)."""
    i = bisect.bisect_right(starts, t0) - 1  # the last span starting at or before t0
    if i >= 0 and t0 < spans[i][1]:
        return True
    return i + 1 < len(spans) and spans[i + 1][0] < t1


def groups(
    intervals: Sequence[IV], level_s: float, cuts: Sequence[float] = (), keep: Sequence[Span] = ()
) -> list[list[IV]]:
    """``intervals`` of one series (any order) split into the groups that merge into one each:
    none contains a cut strictly inside but a raw interval alone, and every interval meeting a
    ``keep`` span [start, end) is a group of its own."""
    ordered = sorted(intervals, key=lambda i: (i.t0, i.seq))
    kept = _union(keep)
    starts = [a for a, _ in kept]
    cuts = sorted({*cuts, *(t for span in kept for t in span)})
    out: list[list[IV]] = []
    growing = False  # out[-1] may take the next interval
    end = -math.inf  # where out[-1] ends
    for iv in ordered:
        # A group grows only while the span it would cover holds no cut strictly inside: a cut
        # between two intervals ends it there, and an interval with a cut inside joins no group
        # and none joins it.
        alone = _overlaps(kept, starts, iv.t0, iv.t1)
        if growing and not alone:
            first, prev = out[-1][0], out[-1][-1]
            same_bucket = math.floor(iv.t0 / level_s) == math.floor(first.t0 / level_s)
            reach = max(end, iv.t1)
            if same_bucket and iv.t0 - prev.t1 <= GAP_S and not _cut_within(cuts, first.t0, reach):
                out[-1].append(iv)
                end = reach
                continue
        out.append([iv])
        growing, end = not alone, iv.t1
    return out


def _roll(
    intervals: Sequence[IV], level_s: float, cuts: Sequence[float], keep: Sequence[Span], merge: Callable[..., IV]
) -> list[IV]:
    grouped = groups(intervals, level_s, cuts, keep)
    return [g[0] if len(g) == 1 else merge(g, seq=min(i.seq for i in g)) for g in grouped]


def rollup_gpu(
    intervals: Sequence[GpuInterval], level_s: float, cuts: Sequence[float] = (), keep: Sequence[Span] = ()
) -> list[GpuInterval]:
    """One device's intervals rolled up to ``level_s``, never across a cut, never inside ``keep``."""
    return _roll(intervals, level_s, cuts, keep, merge_gpu_intervals)


def rollup_host(
    intervals: Sequence[HostInterval], level_s: float, cuts: Sequence[float] = (), keep: Sequence[Span] = ()
) -> list[HostInterval]:
    return _roll(intervals, level_s, cuts, keep, merge_host_intervals)
