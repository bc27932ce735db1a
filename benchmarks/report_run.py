"""How long ``gpuledger report run`` takes on a huge run, and how big the HTML gets (issue 5).

Generates a 72-hour, 8-GPU run at 1-second intervals (about 2 million GPU intervals and 260,000
host intervals, with epochs, metrics, a 1-second utilisation spike and a throttled stretch)
straight into a fresh SQLite ledger by bulk insert, then times the real CLI, end to end, in a
fresh process (``python -m gpuledger report run RUN -o FILE``), and ``gpuledger show`` as the
peer figure (it reads every interval into Python). Printed, not asserted:

    python benchmarks/report_run.py [--hours 72] [--gpus 8] [--db /tmp/gl-bench.db] [--keep]

The ledger is reused when it already holds the same run (generation takes a minute).
"""

from __future__ import annotations

import argparse
import math
import os
import random
import resource
import sqlite3
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from gpuledger.core.model import Event, GpuIdentity, Metric, RunRecord
from gpuledger.store import Ledger

RUN_ID = "0190b0b0-bench-7000-8000-report000072"
GIB = 2**30
EPOCH_S = 45 * 60
SPIKE_AT_S = 3600 * 5 + 17  # one second at 100 % in an idle stretch: must survive downsampling


GPU_COLUMNS = (
    "run_id",
    "device_uuid",
    "seq",
    "t0",
    "t1",
    "samples",
    "busy_s",
    "util_method",
    "util_max_pct",
    "energy_j",
    "energy_method",
    "power_max_w",
    "mem_used_max_b",
    "mem_used_last_b",
    "mem_reserved_b",
    "proc_mem_max_b",
    "proc_sm_util_avg_pct",
    "temp_max_c",
    "sm_clock_avg_mhz",
    "mem_clock_max_mhz",
    "throttle_s",
)
HOST_COLUMNS = (
    "run_id",
    "seq",
    "t0",
    "t1",
    "samples",
    "cpu_s",
    "rss_max_b",
    "read_b",
    "write_b",
    "threads_max",
    "procs_max",
    "sys_cpu_util_avg_pct",
    "iowait_s",
    "sys_mem_used_max_b",
    "disk_read_b",
    "disk_write_b",
    "net_rx_b",
    "net_tx_b",
)


def _insert(table: str, columns: tuple[str, ...]) -> str:
    return f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})"


def _gpu_rows(run_id: str, uuid: str, gpu: int, start: float, seconds: int, rng: random.Random):
    mem_total = 80 * GIB
    for s in range(seconds):
        t0 = start + s
        in_epoch = s % EPOCH_S
        validating = in_epoch > EPOCH_S - 180  # the last 3 minutes of each epoch: validation
        idle = 5 * 3600 <= s < 5 * 3600 + 600  # a 10-minute stall (the spike sits in it)
        util = 0.0 if idle else (0.35 if validating else 0.88) + rng.uniform(-0.05, 0.05)
        if s == SPIKE_AT_S:
            util = 1.0
        util = min(1.0, max(0.0, util))
        power = 70 + 330 * util
        throttle = '{"power": 1.0}' if power > 385 else "{}"
        mem = int(mem_total * (0.62 + 0.0000004 * s)) if not idle else int(mem_total * 0.05)
        yield (
            run_id,
            uuid,
            s,
            t0,
            t0 + 1.0,
            1,
            util,
            "samples",
            util * 100,
            power,
            "counter",
            power,
            mem,
            mem,
            None,
            mem - GIB,
            util * 95,
            45 + 30 * util + gpu * 0.5,
            1410.0 - (60 if power > 385 else 0),
            1593.0,
            throttle,
        )


def _host_rows(run_id: str, start: float, seconds: int, rng: random.Random):
    for s in range(seconds):
        t0 = start + s
        cpu = 5.5 + rng.uniform(-0.5, 0.5)
        yield (
            run_id,
            s,
            t0,
            t0 + 1.0,
            1,
            cpu,
            24 * GIB + (s % 600) * 1024,
            40 * 2**20,
            2**20,
            64,
            9,
            70.0,
            0.05,
            180 * GIB,
            40 * 2**20,
            2**20,
            3 * 2**20,
            2**20,
        )


def generate(path: str, hours: float, gpus: int) -> str:
    """A fresh ledger at ``path`` holding one huge finished run; returns the run id."""
    if os.path.exists(path):
        os.remove(path)
    seconds = int(hours * 3600)
    start = 1_760_000_000.0
    rng = random.Random(5)
    devices = [
        GpuIdentity(
            index=i,
            uuid=f"GPU-bench-{i:02d}",
            name="NVIDIA H100 80GB HBM3",
            memory_total_b=80 * GIB,
            power_limit_w=700.0,
        )
        for i in range(gpus)
    ]
    run = RunRecord(
        id=RUN_ID,
        command=["yolo", "train", "model=yolov8x.pt", "imgsz=1280"],
        user="bench",
        host="bench-host",
        cwd="/bench",
        started_at=start,
        status="succeeded",
        ended_at=start + seconds,
        exit_code=0,
        labels={"project": "bench", "team": "perf"},
        interval_s=1.0,
        meta={"model": {"name": "yolov8x"}, "imgsz": 1280, "batch": 64, "epochs": seconds // EPOCH_S},
    )
    events, metrics = [], []
    for e in range(1, seconds // EPOCH_S + 1):
        t = start + e * EPOCH_S
        events += [Event(t - EPOCH_S, "epoch_start", payload={"epoch": e}), Event(t, "epoch_end", payload={"epoch": e})]
        metrics += [
            Metric(t, "train/box_loss", 1.5 * math.exp(-e / 30), e),
            Metric(t, "metrics/mAP50-95(B)", 0.55 * (1 - math.exp(-e / 20)), e),
        ]
    with Ledger(path) as ledger:
        ledger.create_run(run)
        ledger.add_devices(RUN_ID, devices)
        ledger.append(RUN_ID, events=events, metrics=metrics)
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA synchronous = OFF")
    with conn:
        for i, dev in enumerate(devices):
            conn.executemany(_insert("gpu_intervals", GPU_COLUMNS), _gpu_rows(RUN_ID, dev.uuid, i, start, seconds, rng))
        conn.executemany(_insert("host_intervals", HOST_COLUMNS), _host_rows(RUN_ID, start, seconds, rng))
    conn.close()
    return RUN_ID


def _has_run(path: str, hours: float, gpus: int) -> bool:
    if not os.path.exists(path):
        return False
    try:
        conn = sqlite3.connect(path)
        n = conn.execute("SELECT count(*) FROM gpu_intervals WHERE run_id = ?", (RUN_ID,)).fetchone()[0]
        conn.close()
        return n == int(hours * 3600) * gpus
    except sqlite3.Error:
        return False


def _timed(args: list[str], db: str) -> tuple[float, float, subprocess.CompletedProcess[bytes]]:
    """(wall seconds, CPU seconds of the child, result)."""
    env = {k: v for k, v in os.environ.items() if k != "GPULEDGER_RATES"}
    env["GPULEDGER_DB"] = db
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "gpuledger", *args], env=env, capture_output=True)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hours", type=float, default=72.0)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--db", default="/tmp/gpuledger-report-bench.db")
    ap.add_argument("--out", default="/tmp/gpuledger-report-bench.html")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--peer", action="store_true", help="also time `gpuledger show` (reads every interval)")
    args = ap.parse_args()

    if not _has_run(args.db, args.hours, args.gpus):
        t = time.perf_counter()
        generate(args.db, args.hours, args.gpus)
        print(f"generated {args.hours:g} h x {args.gpus} GPUs in {time.perf_counter() - t:.0f} s -> {args.db}")
    gpu_rows = int(args.hours * 3600) * args.gpus
    print(
        f"run: {gpu_rows:,} GPU intervals, {int(args.hours * 3600):,} host intervals "
        f"(ledger {os.path.getsize(args.db) / 2**20:,.0f} MiB)"
    )
    print(f"machine load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    # Default: no rate card configured, no cost block; --cost prices the run with the cost engine's
    # example card (its own time, measured apart).
    variants = [("html", args.out, []), ("json", args.out + ".json", []), ("html", args.out, ["--cost"])]
    times: dict[int, list[tuple[float, float]]] = {i: [] for i in range(len(variants))}
    for r in range(args.repeat):  # the variants alternated, a different one first each round
        order = list(range(len(variants)))
        for i in order[r % len(order) :] + order[: r % len(order)]:
            fmt, out, extra = variants[i]
            wall, cpu, proc = _timed(["report", "run", RUN_ID, "--format", fmt, "-o", out, *extra], args.db)
            if proc.returncode != 0:
                raise SystemExit(proc.stderr.decode())
            times[i].append((wall, cpu))
    for i, (fmt, out, extra) in enumerate(variants):
        walls, cpus = (list(x) for x in zip(*times[i], strict=True))
        label = " ".join(["report run", "--format", fmt, *extra])
        print(
            f"{label}: wall min/median/max {min(walls):.2f} / {statistics.median(walls):.2f} / {max(walls):.2f} s, "
            f"CPU {min(cpus):.2f} / {statistics.median(cpus):.2f} / {max(cpus):.2f} s, "
            f"file {os.path.getsize(out) / 2**20:.2f} MiB"
        )
    print(f"machine load average after: {os.getloadavg()[0]:.2f}")
    if args.peer:
        wall, cpu, proc = _timed(["show", RUN_ID, "--json"], args.db)
        print(f"peer: gpuledger show --json (every interval into Python): wall {wall:.2f} s, CPU {cpu:.2f} s")


if __name__ == "__main__":
    main()
