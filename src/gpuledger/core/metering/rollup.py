"""Rolling intervals up to coarser ones (1 minute, 1 hour) with exact sums (pure, no I/O).

Consecutive intervals of one series are merged (core/metering/intervals.py rules: integrals summed, gauges
max / last / time-weighted) while they fall in the same ``level_s`` bucket of wall-clock time
(by t0). A group also ends at a gap in the data (a rolled-up interval never spans time nobody
measured) and at a cut: the epoch boundaries of the run, so the per-epoch figures stay exact.
A merged interval keeps the seq of its first part, so seqs stay unique and stable.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from typing import TypeVar

from gpuledger.core.metering.intervals import merge_gpu_intervals, merge_host_intervals
from gpuledger.core.model import GpuInterval, HostInterval
from gpuledger.core.training.epochs import SNAP_S

LEVELS_S = (60, 3600)
GAP_S = 1.0  # a hole longer than this between two intervals is kept as a hole

IV = TypeVar("IV", GpuInterval, HostInterval)


def _cut_between(a: IV, b: IV, cuts: Sequence[float]) -> bool:
    """A cut lies at the boundary between consecutive intervals a and b."""
    i = bisect.bisect_left(cuts, a.t1 - SNAP_S)
    return i < len(cuts) and cuts[i] <= b.t0 + SNAP_S


def groups(intervals: Sequence[IV], level_s: float, cuts: Sequence[float] = ()) -> list[list[IV]]:
    """``intervals`` of one series (any order) split into the groups that merge into one each."""
    ordered = sorted(intervals, key=lambda i: (i.t0, i.seq))
    cuts = sorted(cuts)
    out: list[list[IV]] = []
    for iv in ordered:
        if out:
            prev = out[-1][-1]
            same_bucket = math.floor(iv.t0 / level_s) == math.floor(out[-1][0].t0 / level_s)
            if same_bucket and iv.t0 - prev.t1 <= GAP_S and not _cut_between(prev, iv, cuts):
                out[-1].append(iv)
                continue
        out.append([iv])
    return out


def _roll(intervals: Sequence[IV], level_s: float, cuts: Sequence[float], merge: Callable[..., IV]) -> list[IV]:
    return [g[0] if len(g) == 1 else merge(g, seq=min(i.seq for i in g)) for g in groups(intervals, level_s, cuts)]


def rollup_gpu(intervals: Sequence[GpuInterval], level_s: float, cuts: Sequence[float] = ()) -> list[GpuInterval]:
    """One device's intervals rolled up to ``level_s``."""
    return _roll(intervals, level_s, cuts, merge_gpu_intervals)


def rollup_host(intervals: Sequence[HostInterval], level_s: float, cuts: Sequence[float] = ()) -> list[HostInterval]:
    return _roll(intervals, level_s, cuts, merge_host_intervals)
