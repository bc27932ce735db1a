"""CPU of one recorder flush into the SQLite ledger, warm and with cold caches.

    python benchmarks/ledger_flush.py [--flushes 60] [--cold 32] [--baseline DIR ...]

The batches are the real recorder's: ``Recorder`` over 8 scripted GPUs (``FakeNvml``, as in
recorder_tick.py) and this process's host tree, ticked on a synthetic clock (1 s ticks, 5 s
intervals, a flush every 10 s: 16 GPU and 2 host intervals per batch). Each batch then goes to
``Ledger.append`` of a run that is still open, as the recorder sends it, timed with the thread's
CPU clock:

* warm: the flushes one after another;
* cold: the CPU caches flushed before each one (a pass over a ``--cold`` MiB buffer, not timed),
  as in the live recorder, which flushes every 10 s among other processes.

The best of ``--repeat`` passes is kept. ``--baseline DIR`` measures another source tree
(DIR/src) in the same call, e.g. the ledger before the direct flush::

    git worktree add /tmp/before 74b1096
    python benchmarks/ledger_flush.py --baseline /tmp/before
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))


def batches(n_flushes: int) -> tuple[list[Any], list[Any]]:
    """(devices, batches): what the recorder hands its sink, flush after flush."""
    from gpuledger.collect.fake_nvml import FakeNvml
    from gpuledger.collect.host import ProcessTreeCollector
    from gpuledger.collect.nvml import NvmlCollector
    from gpuledger.collect.replay import ReplayCollector
    from gpuledger.recorder.recorder import Recorder

    sys.path.insert(0, HERE)
    from recorder_tick import fake_gpus

    clock_t = [1.7e9]

    def clock() -> float:
        return clock_t[0]

    fake = FakeNvml(fake_gpus(8, seconds=10 * n_flushes + 60), clock=clock, start=clock_t[0])
    gpu = ReplayCollector(fake, NvmlCollector(nvml=fake, clock=clock, source="replay"))
    host = ProcessTreeCollector(os.getpid(), include_root=True, system_every=5)
    out: list[Any] = []
    rec = Recorder(lambda g, h, e, m: out.append((g, h)), host=host, gpu=gpu, interval_s=5.0, clock=clock)
    rec.tick()
    for _ in range(10 * n_flushes):
        clock_t[0] += 1.0
        rec.step()
    return gpu.devices(), [b for b in out if b[0] or b[1]]


def measure(n_flushes: int, repeat: int, cold_mib: int) -> dict[str, float]:
    from gpuledger.core.ids import uuid7
    from gpuledger.core.model import RunRecord
    from gpuledger.store import Ledger

    devices, work = batches(n_flushes)
    flush_buf = bytearray(os.urandom(1 << 20)) * cold_mib if cold_mib else None
    best = {"warm_ms": float("inf"), "cold_ms": float("inf")}
    with tempfile.TemporaryDirectory() as tmp:
        ledger = Ledger(f"sqlite:///{tmp}/ledger.db")
        for attempt in range(repeat):
            for mode in ("warm", "cold") if flush_buf is not None else ("warm",):
                run = RunRecord(id=uuid7(1_700_000_000_000 + 2 * attempt + (mode == "cold")), command=["bench"],
                                user="bench", host="bench", cwd=tmp, started_at=1.7e9, interval_s=5.0,
                                replayed=True)  # fmt: skip
                ledger.create_run(run)
                ledger.add_devices(run.id, devices)
                ledger.append(run.id, *work[0])  # the first flush of a run (a look-up) is not counted
                spent = 0
                for g, h in work[1:]:
                    if mode == "cold":
                        hashlib.md5(flush_buf).digest()  # reads the whole buffer: the caches now hold it
                    t0 = time.thread_time_ns()
                    ledger.append(run.id, g, h)
                    spent += time.thread_time_ns() - t0
                best[f"{mode}_ms"] = min(best[f"{mode}_ms"], spent / (len(work) - 1) / 1e6)
        ledger.close()
    best["gpu_rows"] = sum(len(g) for g, _ in work) / len(work)
    best["host_rows"] = sum(len(h) for _, h in work) / len(work)
    return best


def child_of(tree: str, args: argparse.Namespace) -> dict[str, float]:
    from _common import tree_child_json

    return tree_child_json(__file__, tree, ["--flushes", str(args.flushes), "--repeat", str(args.repeat),
                                            "--cold", str(args.cold)])  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--flushes", type=int, default=60, help="flushes timed per pass (default 60)")
    ap.add_argument("--repeat", type=int, default=5, help="passes; the best is kept (default 5)")
    ap.add_argument("--cold", type=int, default=32, metavar="MIB", help="cache-flush buffer, MiB (0: warm only)")
    ap.add_argument("--baseline", action="append", default=[], metavar="DIR", help="another source tree to measure")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure(args.flushes, args.repeat, args.cold)))
        return
    sys.path.insert(0, HERE)
    from _common import machine_line, source_state

    print(f"# {machine_line()}\n# {source_state()}")
    trees = [("this tree", os.path.dirname(HERE))] + [(f"baseline {d}", d) for d in args.baseline]
    print(f"\nCPU per flush, ms (thread CPU; best of {args.repeat} x {args.flushes} flushes)")
    print(f"  {'':<34}{'warm':>8}{'cold':>8}  rows per flush")
    for name, tree in trees:
        r = child_of(tree, args)
        rows = f"{r['gpu_rows']:.0f} GPU + {r['host_rows']:.0f} host"
        print(f"  {name:<34}{r['warm_ms']:8.2f}{r['cold_ms']:8.2f}  {rows}")


if __name__ == "__main__":
    main()
