"""gpuledger's own CPU per GPU read of the NVML collector, the scripted driver taken out.

    python benchmarks/collector_own.py [--reads 1500] [--repeat 5] [--baseline DIR ...]
    python benchmarks/collector_own.py --instructions [--baseline DIR ...]

In recorder_tick.py the scripted NVML (Python code standing in for the driver) is most of a GPU
read, and its cost is nothing like a real driver's. This script takes it out: it runs
``NvmlCollector`` over ``FakeNvml`` (8 scripted A100s, as in recorder_tick.py) once while recording
every answer the scripted driver gives, then replays the same reads with those answers handed back
canned. What remains is gpuledger's own work per read: the sample buffer reader, busy-time rule,
field values, throttle, process attribution, the error memo. The reads come as recorder_tick.py's
recorder makes them: 1 s apart, every fifth one ending a 5 s interval. It reports, per GPU and read:

* own CPU (the thread's CPU clock, best of ``--repeat``), a canned answer costing well under 1 µs;
* cold own CPU: the same, with the CPU caches flushed before each read of the 8 GPUs (a pass over a
  ``--cold`` MiB buffer, not timed), as in the live recorder, which reads once a second while other
  processes run: there a read costs what its code and data cost to bring back into the caches,
  which opcode counts do not show;
* Python opcodes executed (a deterministic count, not affected by a noisy machine);
* driver calls (each one a round trip into the driver on real hardware).

``--instructions`` counts instead of timing, under valgrind's cachegrind (needs ``valgrind``;
about 40 s per tree): instructions executed and first-level instruction and data cache misses of
its simulated caches, per GPU read, from two replays (250 and 50 reads, cyclic GC off) whose
difference leaves the set-up out. The counts are the same on every run, so a few percent can be
told on a machine whose timings move by more than that.

``--baseline DIR`` measures the collector of another source tree (DIR/src) in the same call, e.g.
the collector before issue 10, given today's scripted NVML so both read the same answers::

    git worktree add /tmp/base 85532be
    cp src/gpuledger/collect/fake_nvml*.py /tmp/base/src/gpuledger/collect/
    python benchmarks/collector_own.py --baseline /tmp/base
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import sys
import time
from collections import defaultdict, deque
from collections.abc import Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
WARMUP = 20
INTERVAL_TICKS = 5  # recorder_tick.py's recorder: 5 s intervals of 1 s ticks


def measure(reads: int, repeat: int, cold_mib: int = 0, count_only: int = 0) -> dict[str, float]:
    """Runs in the tree whose ``src`` is first on sys.path (set by ``main``). ``count_only``: replay
    that many reads (at most ``reads``) once, untimed, for a run under cachegrind, and return {}."""
    # gpuledger first, from the tree measured: recorder_tick puts this tree's src on the path.
    from gpuledger.collect.fake_nvml import FakeNvml
    from gpuledger.collect.nvml import NvmlCollector
    from gpuledger.collect.replay import ReplayCollector

    sys.path.insert(0, HERE)
    from recorder_tick import fake_gpus

    pids = {os.getpid(), os.getppid()}

    class Clock:
        t = 1.7e9

        def __call__(self) -> float:
            return self.t

    def build(wrap: Callable[[str, Any], Any]) -> tuple[Clock, ReplayCollector]:
        clock = Clock()
        fake = FakeNvml(fake_gpus(8, seconds=reads + WARMUP + 60), clock=clock, start=clock.t)
        for name in dir(fake):
            fn = getattr(fake, name, None)
            if name.startswith("nvmlDevice") and callable(fn):
                setattr(fake, name, wrap(name, fn))
        return clock, ReplayCollector(fake, NvmlCollector(nvml=fake, clock=clock, source="replay"))

    # As the recorder reads (1 s ticks, 5 s intervals): every fifth read ends an interval, where
    # the collector reads what it reads at interval ends only. Decided by the clock, so a replay
    # ends intervals at the same reads as the recording. A tree from before closes_interval reads
    # everything at every read anyway.
    closes = "closes_interval" in inspect.signature(NvmlCollector.read).parameters

    def read(clock: Clock, col: ReplayCollector) -> None:
        if closes:
            col.read(pids, clock.t, closes_interval=round(clock.t) % INTERVAL_TICKS == 0)
        else:
            col.read(pids, clock.t)

    def run(clock: Clock, col: ReplayCollector, n: int) -> None:
        for _ in range(n):
            clock.t += 1.0
            read(clock, col)

    tape: dict[str, list[tuple[bool, Any]]] = defaultdict(list)

    def recording(name: str, fn: Any) -> Any:
        def call(*args: Any) -> Any:
            try:
                value = fn(*args)
            except Exception as exc:
                tape[name].append((False, exc))
                raise
            tape[name].append((True, value))
            return value

        return call

    clock, col = build(recording)
    col.read(pids, clock.t)
    run(clock, col, WARMUP + reads)
    calls = sum(len(v) for v in tape.values()) / (WARMUP + reads + 1) / 8

    def canned_build() -> tuple[Clock, ReplayCollector]:
        queues = {name: deque(answers) for name, answers in tape.items()}

        def canned(name: str, fn: Any) -> Any:
            queue = queues.get(name)
            if queue is None:
                return fn  # never asked while recording
            pop = queue.popleft

            def call(*args: Any) -> Any:
                ok, value = pop()
                if ok:
                    return value
                raise value

            return call

        clock, col = build(canned)
        col.read(pids, clock.t)
        run(clock, col, WARMUP)  # the same warm-up as recorded: same cursors, same answers
        return clock, col

    if count_only:
        import gc

        clock, col = canned_build()
        gc.collect()
        gc.disable()  # a collection's moment would move the count from one run to the next
        run(clock, col, min(count_only, reads))
        return {}

    best = float("inf")
    for _ in range(repeat):
        clock, col = canned_build()
        t0 = time.thread_time_ns()
        run(clock, col, reads)
        best = min(best, (time.thread_time_ns() - t0) / reads / 8 / 1e3)

    cold = float("nan")
    if cold_mib:
        import hashlib

        flush = bytearray(os.urandom(1 << 20)) * cold_mib  # larger than the last-level cache
        n_cold = max(1, reads // 5)  # a flush costs far more than a read: fewer reads
        runs = []
        for _ in range(repeat):
            clock, col = canned_build()
            spent = 0
            for _ in range(n_cold):
                hashlib.md5(flush).digest()  # reads the whole buffer: the caches now hold it
                clock.t += 1.0
                t0 = time.thread_time_ns()
                read(clock, col)
                spent += time.thread_time_ns() - t0
            runs.append(spent / n_cold / 8 / 1e3)
        cold = min(runs)

    clock, col = canned_build()
    opcodes = 0
    counted = min(reads, 200)

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        nonlocal opcodes
        frame.f_trace_opcodes = True
        if event == "opcode":
            opcodes += 1
        return tracer

    sys.settrace(tracer)
    try:
        run(clock, col, counted)
    finally:
        sys.settrace(None)
    return {"own_us": best, "cold_us": cold, "opcodes": opcodes / counted / 8, "calls": calls}


def child_of(tree: str, args: argparse.Namespace) -> dict[str, float]:
    from _common import tree_child_json

    return tree_child_json(__file__, tree, ["--reads", str(args.reads), "--repeat", str(args.repeat),
                                            "--cold", str(args.cold)])  # fmt: skip


COUNT_READS = (50, 250)  # two replays under cachegrind: their difference is the reads alone


def instructions_of(tree: str) -> dict[str, float]:
    """Per GPU read, from cachegrind (valgrind): instructions executed, and first-level instruction and
    data cache misses of its simulated caches. The same on every run (no timer, no neighbour), so a
    difference of a few percent can be told on a noisy machine; the setup cancels out between the
    two replays."""
    import subprocess
    import tempfile

    totals = []
    for n in COUNT_READS:
        with tempfile.NamedTemporaryFile(suffix=".cachegrind") as out:
            cmd = ["valgrind", "--tool=cachegrind", "--cache-sim=yes", f"--cachegrind-out-file={out.name}",
                   sys.executable, os.path.abspath(__file__), "--child", "--reads", str(COUNT_READS[-1]),
                   "--count", str(n)]  # fmt: skip
            env = dict(os.environ, PYTHONPATH=os.path.join(tree, "src"), PYTHONHASHSEED="0")
            subprocess.run(cmd, env=env, check=True, capture_output=True, cwd=tree)
            events = summary = None
            with open(out.name) as fh:
                for line in fh:
                    if line.startswith("events:"):
                        events = line.split()[1:]
                    elif line.startswith("summary:"):
                        summary = [int(v) for v in line.split()[1:]]
            assert events and summary, f"no cachegrind summary in {out.name}"
            totals.append(dict(zip(events, summary, strict=True)))
    per = (COUNT_READS[1] - COUNT_READS[0]) * 8
    return {k: (totals[1][k] - totals[0][k]) / per for k in ("Ir", "I1mr", "D1mr", "D1mw")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reads", type=int, default=1500, help="reads of 8 GPUs timed per repeat (default 1500)")
    ap.add_argument("--repeat", type=int, default=5, help="timed replays; the best is kept (default 5)")
    ap.add_argument("--rounds", type=int, default=2, help="rounds over the trees, in turn (default 2)")
    ap.add_argument("--cold", type=int, default=32, metavar="MIB", help="cache-flush buffer, MiB (0: no cold figure)")
    ap.add_argument("--baseline", action="append", default=[], metavar="DIR", help="another source tree to measure")
    ap.add_argument(
        "--instructions",
        action="store_true",
        help="count instructions and cache misses per GPU read under valgrind's cachegrind instead",
    )
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--count", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure(args.reads, args.repeat, args.cold, args.count)))
        return
    if args.instructions:
        main_instructions(args)
        return

    sys.path.insert(0, HERE)
    from _common import machine_line, source_state

    print(f"# {machine_line()}\n# {source_state()}")
    trees = {"this tree": os.path.dirname(HERE), **{f"baseline {d}": os.path.abspath(d) for d in args.baseline}}
    got: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    for r in range(args.rounds):
        for name, tree in list(trees.items())[r % len(trees) :] + list(trees.items())[: r % len(trees)]:
            got[name].append(child_of(tree, args))
            last = got[name][-1]
            print(
                f"  round {r + 1}: {name:40} own {last['own_us']:6.2f} µs, cold {last['cold_us']:6.2f} µs per GPU read"
            )
    print(f"\nPer GPU and read (8 scripted A100s; own CPU: best of {args.repeat} x {args.reads} reads per round)")
    print(f"  {'':48} {'own CPU µs':>10} {'cold µs':>8} {'opcodes':>8} {'driver calls':>13}")
    for name, rows in got.items():
        best = {k: min(r[k] for r in rows) for k in rows[0]}  # the best round of each figure
        print(f"  {name:48} {best['own_us']:10.2f} {best['cold_us']:8.2f} {best['opcodes']:8.0f} {best['calls']:13.2f}")


def main_instructions(args: argparse.Namespace) -> None:
    import shutil

    if shutil.which("valgrind") is None:
        sys.exit("--instructions needs valgrind (apt-get install valgrind)")
    sys.path.insert(0, HERE)
    from _common import machine_line, source_state

    print(f"# {machine_line()}\n# {source_state()}")
    trees = {"this tree": os.path.dirname(HERE), **{f"baseline {d}": os.path.abspath(d) for d in args.baseline}}
    print(f"\nPer GPU read under cachegrind (8 scripted A100s, canned answers; {COUNT_READS[1]} less "
          f"{COUNT_READS[0]} reads; cyclic GC off)")  # fmt: skip
    print(f"  {'':48} {'instructions':>12} {'I1 misses':>10} {'D1 misses':>10}")
    for name, tree in trees.items():
        got = instructions_of(tree)
        misses = got["D1mr"] + got["D1mw"]
        print(f"  {name:48} {got['Ir']:12,.0f} {got['I1mr']:10,.0f} {misses:10,.0f}")


if __name__ == "__main__":
    main()
