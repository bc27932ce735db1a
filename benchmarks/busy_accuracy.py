"""Busy-time error of gpuledger vs the usual ways of polling utilisation, on the same simulated loads.

    python benchmarks/busy_accuracy.py [--seeds 8] [--minutes 10]

An accuracy benchmark (no timing): every method reads the same scripted NVML (the hardware-like
fake: per-product sample periods, sampling that slows or stops while idle, integer percentages)
over the same workload, and each is compared with the exact busy-seconds of the script.

Methods
  gpuledger     the real NvmlCollector read every second, as the recorder does: each sample of
                the driver's buffer covers at most one sample period before it (docs/METERING.md).
  since-prev    the same buffer, each sample charged over the whole gap since the previous one
                (gpuledger's rule before this change; what a naive buffer integrator does).
  smi -l 1      `nvidia-smi --query-gpu=utilization.gpu -l 1`: the instant reading
                (nvmlDeviceGetUtilizationRates) every second, standing for that second.
  smi -l 30     the same every 30 s, the way the articles on GPU cost meter a training run.

Loads
  steady        training that keeps the GPU 93-100 % busy.
  starved       an input-starved training: busy bursts of 1-6 s, idle gaps of 0.5-4 s.
  duty 3/2      the device check's workload: 3 s busy, 2 s idle.
  sparse        short kernels (0.2-1 s) every 5-20 s: an idle-looking GPU that does work.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from _common import machine_line, source_state

from gpuledger.collect.fake_nvml import FakeGpu, FakeNvml, TracePoint
from gpuledger.collect.nvml import NvmlCollector

T0 = 1_700_000_000.0
PRODUCTS = {  # the product names select the fake's profiles
    "H100 (stops sampling idle)": "NVIDIA H100 80GB HBM3",
    "A100 (slows sampling idle)": "NVIDIA A100-SXM4-80GB",
    "T4 (1 s period, grid)": "Tesla T4",
}
METHODS = ("gpuledger", "since-prev", "smi -l 1", "smi -l 30")


class Clock:
    def __init__(self) -> None:
        self.t = T0

    def __call__(self) -> float:
        return self.t


def load(kind: str, seconds: float, rnd: random.Random) -> list[TracePoint]:
    pts, t = [], 0.0
    while t < seconds:
        if kind == "steady":
            pts.append(TracePoint(t, util_pct=rnd.randint(93, 100)))
            t += rnd.uniform(2, 10)
        elif kind == "starved":
            pts.append(TracePoint(t, util_pct=rnd.choice([85, 100])))
            t += rnd.uniform(1, 6)
            pts.append(TracePoint(t, util_pct=0))
            t += rnd.uniform(0.5, 4)
        elif kind == "duty 3/2":
            pts.append(TracePoint(t, util_pct=100))
            pts.append(TracePoint(t + 3, util_pct=0))
            t += 5
        else:  # sparse
            pts.append(TracePoint(t, util_pct=0))
            t += rnd.uniform(5, 20)
            pts.append(TracePoint(t, util_pct=100))
            t += rnd.uniform(0.2, 1)
    pts.append(TracePoint(t, util_pct=0))
    return pts


def truth(points: list[TracePoint], end: float) -> float:
    total = 0.0
    for i, p in enumerate(points):
        stop = min(points[i + 1].t if i + 1 < len(points) else math.inf, end)
        if stop > p.t:
            total += (p.util_pct or 0) / 100 * (stop - p.t)
    return total


def measure(points: list[TracePoint], name: str, end: float) -> dict[str, float]:
    """Busy-seconds over (0, end] by each method, all reading the same script."""
    out: dict[str, float] = {}
    clock = Clock()
    fake = FakeNvml([FakeGpu("GPU-bench", name=name, points=points)], clock=clock, start=T0)
    col = NvmlCollector(nvml=fake, clock=clock)
    col.read(set(), clock.t)
    busy = 0.0
    while clock.t - T0 < end:
        clock.t += 1.0
        busy += sum(t.busy_s or 0.0 for t in col.read(set(), clock.t).ticks)
    out["gpuledger"] = busy

    clock = Clock()
    fake = FakeNvml([FakeGpu("GPU-bench", name=name, points=points)], clock=clock, start=T0)
    fake.nvmlInit()
    h = fake.nvmlDeviceGetHandleByIndex(0)
    cursor, prev = 0, None
    try:
        cursor = max(s.timeStamp for s in fake.nvmlDeviceGetSamples(h, 1, 0)[1])
    except Exception:
        cursor = int(T0 * 1e6)
    prev = cursor
    since = smi1 = smi30 = 0.0
    for k in range(1, int(end) + 1):
        clock.t = T0 + k
        try:
            for s in fake.nvmlDeviceGetSamples(h, 1, cursor)[1]:
                since += s.sampleValue.uiVal / 100 * (s.timeStamp - prev) / 1e6
                prev = cursor = s.timeStamp
        except Exception:
            pass  # NotFound: nothing newer
        u = fake.nvmlDeviceGetUtilizationRates(h).gpu / 100
        smi1 += u
        if k % 30 == 0:
            smi30 += u * 30
    out["since-prev"], out["smi -l 1"], out["smi -l 30"] = since, smi1, smi30
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=8, help="workloads per load and product (default 8)")
    ap.add_argument("--minutes", type=float, default=10, help="length of each workload (default 10)")
    args = ap.parse_args()
    end = int(args.minutes * 60) // 30 * 30  # whole 30 s polls
    print(machine_line())
    print(source_state())
    print(f"{args.seeds} workloads of {end} s per load and product; relative error of busy-seconds, median / max\n")
    print(f"{'product':28s} {'load':10s} " + " ".join(f"{m:>17s}" for m in METHODS))
    worst: dict[str, list[float]] = {m: [] for m in METHODS}
    for product, name in PRODUCTS.items():
        for kind in ("steady", "starved", "duty 3/2", "sparse"):
            errs: dict[str, list[float]] = {m: [] for m in METHODS}
            for seed in range(args.seeds):
                points = load(kind, end + 5, random.Random(seed))
                got = measure(points, name, end)
                exact = truth(points, end)
                for m in METHODS:
                    errs[m].append(abs(got[m] - exact) / exact)
            cells = []
            for m in METHODS:
                worst[m] += errs[m]
                cells.append(f"{100 * statistics.median(errs[m]):7.2f}% /{100 * max(errs[m]):6.1f}%")
            print(f"{product:28s} {kind:10s} " + " ".join(f"{c:>17s}" for c in cells))
    print("\nall loads and products: median / max relative error")
    for m in METHODS:
        print(f"  {m:11s} {100 * statistics.median(worst[m]):7.2f}% / {100 * max(worst[m]):6.1f}%")


if __name__ == "__main__":
    main()
