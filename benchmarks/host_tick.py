"""CPU cost of one host-collector tick, measured in its real loop.

A tree of 8 busy-ish processes (one parent and 7 workers, each busy ~5 % of a core) runs below
this process, set up the way ``gpuledger run`` sees it (root = us, include_root=False). Each
variant then samples it in the real loop: sleep ``--interval``, read once, with the main thread
otherwise idle. CPU per read is the thread's own CPU time around the call
(``time.thread_time`` and ``getrusage(RUSAGE_THREAD)``, which agree). Printed, not asserted:

    python benchmarks/host_tick.py [--ticks 30] [--interval 1.0]

Variants, in one run on the same machine:
- gpuledger (procfs): ProcessTreeCollector with the /proc fast path (what Linux users get), built
  as ``gpuledger run`` builds it: host-wide and I/O counters once per 5 s interval;
- gpuledger (psutil): the same collector on its portable psutil reader;
- peer, psutil naive: the usual psutil sampler, ``children(recursive=True)`` every tick plus
  ``oneshot()`` per process and the host counters (cpu_times, virtual_memory, disk and net).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time
from collections.abc import Callable

import psutil

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from _common import start_tree, stop_tree  # the same 8-process tree the recorder benchmark meters

from gpuledger.collect.host import ProcessTreeCollector
from gpuledger.recorder.recorder import ticks_per_interval


def naive_psutil_sampler(root: int) -> Callable[[], object]:
    """What a straightforward psutil sampler does each tick (the peer figure)."""
    top = psutil.Process(root)

    def tick() -> object:
        out = []
        for proc in top.children(recursive=True):
            try:
                with proc.oneshot():
                    out.append((proc.cpu_times(), proc.memory_info(), proc.num_threads(), proc.io_counters()))
            except psutil.Error:
                pass
        return (out, psutil.cpu_times(), psutil.virtual_memory(), psutil.disk_io_counters(), psutil.net_io_counters())

    tick()  # psutil primes some module caches on first use
    return tick


def as_gpuledger_run(backend: str) -> Callable[[], object]:
    """The collector as ``gpuledger run`` builds it (recorder/edge.py): host-wide and I/O counters
    read once per 5 s interval, at the read that closes it; every read between is the tree's stat."""
    per_interval = ticks_per_interval(5.0)
    collector = ProcessTreeCollector(os.getpid(), include_root=False, backend=backend, system_every=per_interval)
    collector.read()
    reads = iter(range(10**9))

    def tick() -> object:
        return collector.read(closes_interval=next(reads) % per_interval == per_interval - 1)

    return tick


def measure(read: Callable[[], object], ticks: int, interval: float) -> tuple[list[float], list[float]]:
    thread_ms, rusage_ms = [], []
    for _ in range(ticks):
        time.sleep(interval)
        t0, r0 = time.thread_time(), resource.getrusage(resource.RUSAGE_THREAD)
        read()
        t1, r1 = time.thread_time(), resource.getrusage(resource.RUSAGE_THREAD)
        thread_ms.append((t1 - t0) * 1e3)
        rusage_ms.append(((r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)) * 1e3)
    return thread_ms, rusage_ms


def p95(xs: list[float]) -> float:
    return sorted(xs)[max(0, round(0.95 * len(xs)) - 1)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ticks", type=int, default=30)
    ap.add_argument("--interval", type=float, default=1.0)
    args = ap.parse_args()

    parent = start_tree()
    try:
        variants: dict[str, Callable[[], object]] = {}
        for backend in ("auto", "psutil"):
            variants[f"gpuledger ({backend if backend != 'auto' else 'procfs'})"] = as_gpuledger_run(backend)
        variants["peer: psutil naive"] = naive_psutil_sampler(os.getpid())
        procs = len(psutil.Process(parent.pid).children(recursive=True)) + 1
        print(f"tree: {procs} processes; {args.ticks} ticks at {args.interval} s; CPU per tick (ms)")
        means = {}
        for name, read in variants.items():
            thread_ms, rusage_ms = measure(read, args.ticks, args.interval)
            means[name] = statistics.mean(thread_ms)  # the cadence's reads (counters, scans) included
            print(
                f"  {name:22} mean {means[name]:.3f}  median {statistics.median(thread_ms):.3f}"
                f"  p95 {p95(thread_ms):.3f}  max {max(thread_ms):.3f}"
                f"   (RUSAGE_THREAD mean {statistics.mean(rusage_ms):.3f})"
            )
        first = next(iter(means))
        if means[first] > 0:
            print(f"peer / {first}, means: {means['peer: psutil naive'] / means[first]:.1f}x")
    finally:
        stop_tree(parent)


if __name__ == "__main__":
    main()
