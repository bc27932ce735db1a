"""How long ``gpuledger db migrate --layout compact`` takes per million intervals, and the memory it
takes at its peak (store/series_compact.py).

    python benchmarks/compact_migrate.py [--runs 20] [--gpus 4] [--intervals 12500] [--store postgres|chdb]
                                         [--rounds 1]

Each round: a fresh PostgreSQL ledger (a schema of its own on GPULEDGER_TEST_PG_URL, default the
local ``test`` database) gets ``--runs`` finished runs of ``--gpus`` GPUs and ``--intervals`` 5 s
intervals each (and one host interval per step), starting a minute apart far enough back that all
have ended by yesterday (runs x intervals over 53 days are refused: the server closes a month 62
days on), pushed through the server's ingest in 8 MiB bodies and sealed; then the migration into a
fresh series store (the compact PostgreSQL store in a schema of its own, or chDB in a temporary
folder) runs in a process of its own, as the CLI runs it,
timed alone, its peak RSS (VmHWM) read after it and before it (imports, the store opened).
Printed per round: rows moved (GPU + host), seconds, seconds per million rows, peak RSS; then min /
median / max over the rounds and the load average. The gpuledger it measures is the one on
PYTHONPATH (an older tree's ``src`` measures that tree's migration on the same ledger).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any

import psycopg
from sqlalchemy.engine import make_url

PG = os.environ.get("GPULEDGER_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
STEP = 5.0
PUSH_ROWS = 2500  # seqs per push: 2,500 x (GPUs + host) rows, under the server's 8 MiB a body
PUSH_INTERVALS = 20_000  # and the server's most intervals a push


def _gpu(uuid_: str, seq: int, t0: float) -> dict[str, Any]:
    return {
        "device_uuid": uuid_, "seq": seq, "t0": t0, "t1": t0 + STEP, "samples": 5,
        "busy_s": 2.5 + 0.01 * (seq % 7), "util_method": "samples", "util_max_pct": 90.0,
        "energy_j": 1250.0 + seq % 3, "energy_method": "counter", "power_max_w": 300.0,
        "mem_used_max_b": 10**10 + seq, "mem_used_last_b": 10**10, "temp_max_c": 60.0 + seq % 10,
        "sm_clock_avg_mhz": 1400.0, "throttle_s": {"power": 0.25},
    }  # fmt: skip


def _host(seq: int, t0: float) -> dict[str, Any]:
    return {"seq": seq, "t0": t0, "t1": t0 + STEP, "samples": 5, "cpu_s": 2.5 + seq % 4, "rss_max_b": 10**9 + seq,
            "read_b": 1000 * seq, "write_b": 10 * seq, "threads_max": 8, "procs_max": 3}  # fmt: skip


def _days_back(runs: int, intervals: int) -> int:
    """Days before today the first run starts: its runs, each a minute after the last, all end
    by the day before yesterday (at least five days back, as before)."""
    return max(5, math.ceil((runs * 60.0 + intervals * STEP) / 86400) + 2)


def _populate(db: str, runs: int, gpus: int, intervals: int) -> int:
    from fastapi.testclient import TestClient

    from gpuledger.server.app import create_app
    from gpuledger.server.settings import Settings
    from gpuledger.store import Ledger, accounts

    with Ledger(db, migrate=True) as led:
        accounts.add_project(led, "bench", actor="bench")
        token = accounts.issue_token(led, "agent", role="agent", projects=["bench"], actor="bench",
                                     create_user=True)[1]  # fmt: skip
    headers = {"Authorization": f"Bearer {token}"}
    # whole days back: every run has ended by yesterday (a run ending in the future is refused), and
    # no month closes under the server's 62 days (main() refuses longer spans)
    start = (time.time() // 86400 - _days_back(runs, intervals)) * 86400
    rows = 0
    with TestClient(create_app(db, settings=Settings(close_after_days=62, lost_after_s=0))) as client:
        for r in range(runs):
            begin = start + r * 60.0
            uuids = [f"GPU-bench-{r}-{d}" for d in range(gpus)]
            run = {"id": str(uuid.uuid4()), "command": ["python", "train.py"], "user": "bench", "host": f"node-{r}",
                   "cwd": "/work", "started_at": begin, "labels": {"project": "bench", "team": "bench"}}  # fmt: skip
            devices = [{"index": d, "uuid": u, "name": "NVIDIA A100-SXM4-80GB", "memory_total_b": 80 * 2**30}
                       for d, u in enumerate(uuids)]  # fmt: skip
            step = min(PUSH_ROWS, PUSH_INTERVALS // (gpus + 1))
            for at in range(0, intervals, step):
                seqs = range(at, min(at + step, intervals))
                last = seqs[-1] == intervals - 1
                doc = dict(run, status="succeeded", ended_at=begin + intervals * STEP, exit_code=0) if last else run
                body = {
                    "run": doc, "devices": devices, "final": last,
                    "gpu_intervals": [_gpu(u, q, begin + q * STEP) for u in uuids for q in seqs],
                    "host_intervals": [_host(q, begin + q * STEP) for q in seqs],
                }  # fmt: skip
                got = client.post("/api/v1/ingest", json=body, headers=headers)
                if got.status_code != 200:
                    raise SystemExit(f"ingest answered {got.status_code}: {got.text[:300]}")
                rows += len(body["gpu_intervals"]) + len(body["host_intervals"])
    return rows


def _peak_rss_mib() -> float:
    """This process's peak RSS: VmHWM (Linux; ``ru_maxrss`` keeps the parent's peak across fork and
    exec, which would hide the migration's under the population's), else ``ru_maxrss``."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _migrate(db_url: str, series: str) -> dict[str, float]:
    """The migration, in this (child) process: rows moved, seconds, and peak RSS (MiB) before and after."""
    from gpuledger.store import Ledger, series_compact, series_tier
    from gpuledger.store.retention import _tampered

    tier = series_tier.Tier.open(series)
    try:
        with Ledger(db_url) as led:
            before = _peak_rss_mib()
            t = time.perf_counter()
            done = series_compact.compact(led, tier, actor="bench", tampered=_tampered)
            took = time.perf_counter() - t
    finally:
        tier.store.close()
    if done.kept or done.failed:
        raise SystemExit(f"kept {done.kept}; failed {done.failed}")
    peak = _peak_rss_mib()
    return {"moved": sum(done.moved.values()), "took": took, "rss_before": before, "rss_peak": peak}


def _round(args: argparse.Namespace) -> dict[str, float]:
    tag = uuid.uuid4().hex[:10]
    ledger_schema, store_schema = f"compact_bench_{tag}", f"compact_series_{tag}"
    folder = tempfile.mkdtemp(prefix="compact-bench-")
    admin = make_url(PG).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{ledger_schema}"')
    db = (
        make_url(PG)
        .set(drivername="postgresql+psycopg")
        .update_query_dict({"options": f"-csearch_path={ledger_schema}"})
    )
    db_url = db.render_as_string(hide_password=False)
    series = f"{admin}?schema={store_schema}" if args.store == "postgres" else f"chdb://{folder}/series"
    try:
        rows = _populate(db_url, args.runs, args.gpus, args.intervals)
        # a process of its own: its peak RSS is the migration's, not the population's
        child = subprocess.run([sys.executable, __file__, "--child", db_url, series], capture_output=True, text=True)
        if child.returncode != 0:
            raise SystemExit(f"the migration failed: {child.stderr[-2000:]}")
        got: dict[str, float] = json.loads(child.stdout.strip().splitlines()[-1])
        if got["moved"] != rows:
            raise SystemExit(f"moved {got['moved']} of {rows} rows")
        return got
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute("SET lock_timeout = '30s'")
            conn.execute(f'DROP SCHEMA IF EXISTS "{ledger_schema}" CASCADE')
            conn.execute(f'DROP SCHEMA IF EXISTS "{store_schema}" CASCADE')
        shutil.rmtree(folder, ignore_errors=True)


def _spread(values: list[float]) -> str:
    return f"{min(values):.1f} / {statistics.median(values):.1f} / {max(values):.1f}"


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        print(json.dumps(_migrate(sys.argv[2], sys.argv[3])))
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--gpus", type=int, default=4)
    p.add_argument("--intervals", type=int, default=12500, help="5 s intervals per GPU and run")
    p.add_argument("--store", choices=["postgres", "chdb"], default="postgres")
    p.add_argument("--rounds", type=int, default=1)
    args = p.parse_args()
    if args.runs < 1 or args.gpus < 1 or args.intervals < 1:
        p.error("--runs, --gpus and --intervals must be at least 1")
    if _days_back(args.runs, args.intervals) > 55:  # the server closes months 62 days on: keep clear of it
        p.error(f"--runs {args.runs} x --intervals {args.intervals} spans more than 53 days; take fewer")
    per_million, peaks = [], []
    for i in range(args.rounds):
        got = _round(args)
        per_million.append(got["took"] / got["moved"] * 1e6)
        peaks.append(got["rss_peak"])
        load = os.getloadavg()
        print(f"round {i + 1}: {got['moved']:.0f} rows moved in {got['took']:.1f} s: {per_million[-1]:.1f} s per "
              f"million rows; peak RSS {got['rss_peak']:.0f} MiB ({got['rss_before']:.0f} MiB before it) "
              f"(load {load[0]:.1f} {load[1]:.1f} {load[2]:.1f})", flush=True)  # fmt: skip
    print(f"{args.store}: {_spread(per_million)} s per million rows; peak RSS {_spread(peaks)} MiB "
          f"(min / median / max of {args.rounds})")  # fmt: skip


if __name__ == "__main__":
    main()
