"""Cost of one scrape of the team server's /metrics, on SQLite and PostgreSQL.

    python benchmarks/metrics_scrape.py                      # 50 running runs x 4 GPUs x 2 h of 5 s intervals
    python benchmarks/metrics_scrape.py --runs 20 --hours 12 --backends sqlite

Data: ``--runs`` runs still recording (plus as many finished long ago, which a scrape must skip),
each with ``--gpus`` GPUs and one 5-second interval per GPU and for the host over ``--hours``, with
throttle maps as NVML gives them (six reasons). Timed: the first scrape of a server process (it
reads every live run whole), then steady scrapes after 15 s more of recording (3 new intervals per
GPU and run): the ledger read (prom.ledger_source.LedgerSource, one transaction) and the rendering
of the text exposition, medians of 7. No peer figure: this is a budget check (a scrape every 15 s
must stay a small fraction of that, however long the runs have been going).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid as uuidlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from prometheus_client import CollectorRegistry, generate_latest

from gpuledger.core.model import GpuIdentity, GpuInterval, HostInterval, RunRecord
from gpuledger.prom.families import SnapshotCollector
from gpuledger.prom.ledger_source import LedgerSource
from gpuledger.store import Ledger

REASONS = ("power", "thermal", "sync_boost", "board_limit", "low_util", "reliability")


def _gpu(uuid: str, seq: int, t0: float) -> GpuInterval:
    return GpuInterval(
        uuid,
        seq,
        t0,
        t0 + 5,
        samples=5,
        busy_s=4.0,
        energy_j=1500.0,
        power_max_w=310.0,
        mem_used_last_b=40 * 2**30,
        temp_max_c=60.0,
        throttle_s=dict.fromkeys(REASONS, 0.0) | {"power": 0.5},
    )


def fill(ledger: Ledger, runs: int, gpus: int, hours: float, now: float) -> tuple[int, list[tuple[str, list[str]]]]:
    n = int(hours * 3600 / 5)
    rows, running = 0, []
    for r in range(2 * runs):
        live = r < runs
        start = now - hours * 3600 if live else now - 30 * 86400
        run = RunRecord(
            id=str(uuidlib.uuid4()),
            command=["python", "train.py"],
            user=f"user{r % 7}",
            host="node",
            cwd="/",
            started_at=start,
            status="running" if live else "succeeded",
            ended_at=None if live else start + hours * 3600,
            labels={"project": f"p{r % 5}", "team": f"t{r % 3}"},
        )
        ledger.create_run(run)
        devs = [
            GpuIdentity(index=i, uuid=f"GPU-{run.id[:8]}-{i}", name="NVIDIA H100 80GB HBM3", memory_total_b=80 * 2**30)
            for i in range(gpus)
        ]
        ledger.add_devices(run.id, devs)
        if live:
            running.append((run.id, [d.uuid for d in devs]))
        for lo in range(0, n, 2000):
            seqs = range(lo, min(n, lo + 2000))
            gpu = [_gpu(d.uuid, s, start + 5 * s) for s in seqs for d in devs]
            host = [HostInterval(s, start + 5 * s, start + 5 * s + 5, samples=5, cpu_s=2.0) for s in seqs]
            ledger.append(run.id, gpu, host, [], [])
            rows += len(gpu) + len(host)
    return n, running


def _scrape(source: LedgerSource) -> tuple[float, float, int, int]:
    t = time.perf_counter()
    figures = source.figures()
    read = time.perf_counter() - t
    t = time.perf_counter()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(lambda: figures))
    text = generate_latest(registry)
    return read, time.perf_counter() - t, sum(len(f.gpus) for f in figures), len(text)


def measure(url: str, args: argparse.Namespace) -> None:
    now = time.time()
    with Ledger(url) as ledger:
        t = time.perf_counter()
        next_seq, running = fill(ledger, args.runs, args.gpus, args.hours, now)
        total = next_seq * len(running) * (args.gpus + 1)
        print(f"  filled {2 * total:,} interval rows ({total:,} of live runs) in {time.perf_counter() - t:.1f} s")
        source = LedgerSource(ledger, clock=lambda: now)
        read, render, gpus, size = _scrape(source)
        print(
            f"  first scrape of a process: read {read * 1000:.0f} ms ({source.rows_read:,} rows) + render "
            f"{render * 1000:.1f} ms; {gpus} GPUs of {len(running)} runs, {size:,} bytes"
        )
        reads, renders, rows = [], [], []
        for _ in range(7):
            for run_id, uuids in running:  # 15 s more of recording: 3 intervals per GPU and the host
                seqs = range(next_seq, next_seq + 3)
                ledger.append(
                    run_id,
                    [_gpu(u, s, now) for s in seqs for u in uuids],
                    [HostInterval(s, now, now + 5, samples=5, cpu_s=2.0) for s in seqs],
                    [],
                    [],
                )
            next_seq += 3
            read, render, _, _ = _scrape(source)
            reads.append(read)
            renders.append(render)
            rows.append(source.rows_read)
        print(
            f"  steady scrape: read {statistics.median(reads) * 1000:.0f} ms ({statistics.median(rows):,.0f} "
            f"rows) + render {statistics.median(renders) * 1000:.1f} ms (medians of 7)"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--gpus", type=int, default=4)
    ap.add_argument("--hours", type=float, default=2.0)
    ap.add_argument("--backends", default="sqlite,postgres")
    ap.add_argument("--pg-url", default="postgresql://postgres@127.0.0.1:5432/test")
    args = ap.parse_args()
    for backend in args.backends.split(","):
        print(f"{backend}: {args.runs} running runs x {args.gpus} GPUs x {args.hours:g} h of 5 s intervals")
        if backend == "sqlite":
            with tempfile.TemporaryDirectory() as tmp:
                measure(f"sqlite:///{tmp}/bench.db", args)
        else:
            sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
            import os

            os.environ.setdefault("GPULEDGER_TEST_PG_URL", args.pg_url)
            from conftest import _pg_schema_url

            gen = _pg_schema_url()
            url = next(gen)
            try:
                measure(url, args)
            finally:
                next(gen, None)


if __name__ == "__main__":
    main()
