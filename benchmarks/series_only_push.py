"""The ledger's cost of one series-only push (store/ingest.py with ``only``), with and without
``series_streams`` (store/series_streams.py: host CPU, throttle time and last-row gauges).

    python benchmarks/series_only_push.py [--pushes 200] [--rounds 3] [--gpus 8] [--rows 12]

In-process, on a fresh PostgreSQL schema: each push is one agent minute of a series-only run
(``--gpus`` GPUs x ``--rows`` 5 s intervals and the host's rows, every field measured, throttle
time on every row), the run's next seqs. The series store's write is left out (a no-op): what is
measured is the ledger's transaction (run lock, segments, day sums, streams). The two modes
alternate, each round a run of its own; "without" replaces ``series_streams.add`` with a no-op,
as the code was before it. Printed per mode: min / median / max over rounds of the median and p99
ms per push, the time spent inside ``series_streams.add`` itself (less noisy than the difference of
two loaded rounds), and the load average before and after.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

import sqlalchemy as sa

from gpuledger.core.model import RunRecord
from gpuledger.core.wire import GPU_COLUMNS, HOST_COLUMNS
from gpuledger.server.models import DeviceIn
from gpuledger.store import Ledger, series_streams
from gpuledger.store import ingest as store_ingest

PG = os.environ.get("GPULEDGER_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
STEP = 5.0


def _load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def _gpu(uuid_: str, seq: int, t0: float) -> tuple[Any, ...]:
    row = {
        "device_uuid": uuid_, "seq": seq, "t0": t0, "t1": t0 + STEP, "samples": 5, "busy_s": 3.1,
        "util_method": "samples", "util_max_pct": 90.0, "energy_j": 1250.0, "energy_method": "counter",
        "power_max_w": 300.0 + seq % 7,
        "mem_used_max_b": 10**10 + seq, "mem_used_last_b": 10**10, "temp_max_c": 60.0 + seq % 10,
        "sm_clock_avg_mhz": 1400.0, "throttle_s": {"power": 0.25, "thermal": 0.01},
    }  # fmt: skip
    return tuple(row.get(c) for c in GPU_COLUMNS)


def _host(seq: int, t0: float) -> tuple[Any, ...]:
    row = {"seq": seq, "t0": t0, "t1": t0 + STEP, "samples": 5, "cpu_s": 2.5, "rss_max_b": 10**9, "read_b": 0,
           "write_b": 0, "threads_max": 8, "procs_max": 3}  # fmt: skip
    return tuple(row.get(c) for c in HOST_COLUMNS)


def _round(led: Ledger, pushes: int, gpus: int, rows: int) -> list[float]:
    """ms per push of one new series-only run."""
    run_id = str(uuid.uuid4())
    start = time.time() - pushes * rows * STEP - 600
    run = RunRecord(id=run_id, command=["train"], user="bench", host="bench-node", cwd="/", started_at=start)
    devices = [
        DeviceIn(index=i, uuid=f"GPU-{run_id[:8]}-{i}", name="H100", memory_total_b=80 << 30).model_dump()
        for i in range(gpus)
    ]
    writer = store_ingest.Writer("bench", "tok", None, admin=True)
    out = []
    for p in range(pushes):
        seqs = range(p * rows, (p + 1) * rows)
        gpu = [_gpu(d["uuid"], s, start + s * STEP) for d in devices for s in seqs]
        host = [_host(s, start + s * STEP) for s in seqs]
        t = time.perf_counter()
        store_ingest.ingest(
            led.database, run=run, devices=devices, gpu=gpu, host=host, gpu_columns=GPU_COLUMNS,
            host_columns=HOST_COLUMNS, events=[], metrics=[], final=False, writer=writer,
            authorize=lambda *_: None, live=lambda *_: None, only="bench",
        )  # fmt: skip
        out.append((time.perf_counter() - t) * 1000)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pushes", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--rows", type=int, default=12)
    args = ap.parse_args()
    schema = f"bench_streams_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(PG.replace("postgresql://", "postgresql+psycopg://", 1), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f"CREATE SCHEMA {schema}"))
    url = f"{PG}?options=-csearch_path%3D{schema}"
    real_add = series_streams.add
    spent: list[float] = []  # seconds inside series_streams.add, per call ("with" rounds)

    def timed_add(*a: Any, **k: Any) -> int:
        t = time.perf_counter()
        try:
            return real_add(*a, **k)
        finally:
            spent.append(time.perf_counter() - t)

    results: dict[str, list[tuple[float, float]]] = {"with": [], "without": []}
    try:
        with Ledger(url) as led:
            print(f"load before: {_load()}")
            for r in range(args.rounds):
                for mode in ("with", "without") if r % 2 == 0 else ("without", "with"):
                    store_ingest.series_streams.add = timed_add if mode == "with" else (lambda *_a, **_k: 0)  # type: ignore[assignment]
                    ms = sorted(_round(led, args.pushes, args.gpus, args.rows))
                    results[mode].append((statistics.median(ms), ms[int(len(ms) * 0.99) - 1]))
                    med, p99 = results[mode][-1]
                    print(f"round {r + 1} {mode:>7}: median {med:.2f} ms, p99 {p99:.2f} ms")
            print(f"load after: {_load()}")
    finally:
        store_ingest.series_streams.add = real_add  # type: ignore[assignment]
        with admin.connect() as conn:
            conn.execute(sa.text(f"DROP SCHEMA {schema} CASCADE"))
    for mode, got in results.items():
        med, p99 = sorted(g[0] for g in got), sorted(g[1] for g in got)
        print(
            f"{mode:>7} series_streams: median per push {med[0]:.2f} / {statistics.median(med):.2f} / "
            f"{med[-1]:.2f} ms, p99 {p99[0]:.2f} / {statistics.median(p99):.2f} / {p99[-1]:.2f} ms "
            f"(min / median / max of {len(got)} rounds)"
        )
    ms = sorted(x * 1000 for x in spent)
    print(f"inside series_streams.add: median {statistics.median(ms):.2f} ms, p99 {ms[int(len(ms) * 0.99) - 1]:.2f} ms")


if __name__ == "__main__":
    main()
