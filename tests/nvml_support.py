"""Shared set-up for the NVML collector tests: a clock, scripted GPUs, a read loop."""

from __future__ import annotations

import random

from gpuledger.collect.fake_nvml import FakeGpu, FakeNvml, TracePoint
from gpuledger.collect.nvml import NvmlCollector

T0 = 1_700_000_000.0
PERIOD_US = 166_667
GiB = 2**30


class Clock:
    def __init__(self, t: float = T0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def busy_truth(points: list[TracePoint], a: float, b: float) -> float:
    """Exact busy-seconds of a stepped utilisation trace over (a, b] (trace seconds)."""
    total = 0.0
    for i, p in enumerate(points):
        end = points[i + 1].t if i + 1 < len(points) else float("inf")
        lo, hi = max(a, p.t), min(b, end)
        if hi > lo:
            total += (p.util_pct or 0) / 100 * (hi - lo)
    return total


def standard_points(n: int = 60, seed: int = 1) -> list[TracePoint]:
    rnd = random.Random(seed)
    return [
        TracePoint(
            float(t),
            util_pct=rnd.choice([0, 7, 35, 90, 100]),
            mem_used_b=(10 + t) * GiB // 10,
            power_w=rnd.uniform(80, 390),
            temp_c=40 + t % 30,
            sm_clock_mhz=1410,
            mem_clock_mhz=1593,
            throttle=("power",) if t % 9 == 0 else (),
            procs={"run": (GiB, 80.0), 4242: (3 * GiB, 15.0)},
        )
        for t in range(n)
    ]


def ideal(uuid: str, **kw) -> FakeGpu:
    """A GPU sampling on a fixed grid even while idle, with a continuous energy counter and
    instantaneous power: for tests of features whose exact figures do not depend on sampling."""
    return FakeGpu(uuid, profile="ideal", **kw)


def make(gpus: list[FakeGpu], visible: str | None = None, **kw) -> tuple[NvmlCollector, FakeNvml, Clock]:
    clock = Clock()
    fake = FakeNvml(gpus, clock=clock, start=clock.t, **kw)
    return NvmlCollector(nvml=fake, visible=visible, clock=clock), fake, clock


def run(col: NvmlCollector, clock: Clock, until: float, step: float = 1.0, pids=frozenset({77})):
    """Read every ``step`` seconds from now until ``until`` (trace seconds); all ticks, all events."""
    ticks, events = [], []
    while True:
        r = col.read(set(pids), clock.t)
        ticks += r.ticks
        events += r.events
        if clock.t - T0 >= until:
            return ticks, events
        clock.t += step
