"""A simulated month for the FOCUS export tests: tests/cost_sim.py's cluster plus two runs recorded
through the ledger's own API (a p4d.24xlarge run across the card's mid-day price change, and a run
labelled with a model_version), and readers of the files the export writes."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

from cost_sim import CHANGE_MIDDAY, simulate, write
from cost_support import ts
from gpuledger.core.model import GpuIdentity, GpuInterval, RunRecord
from gpuledger.store import Ledger

STEP = 900.0
CHANGE_RUN = "p4d-across-change"  # 10:00-15:00 on 2026-03-20, the price changes at 12:07:30
LABELLED_RUN = "yolo-v8m-3"


def add_run(
    led: Ledger,
    run_id: str,
    start: str,
    hours: float,
    *,
    gpu_name: str,
    labels: dict[str, str],
    util: float = 0.6,
    watts: float = 300.0,
    gpus: int = 1,
) -> None:
    t0 = ts(start)
    t1 = t0 + hours * 3600
    record = RunRecord(
        id=run_id, command=["train"], user="ana", host="node", cwd="/", started_at=t0, name=f"{run_id} training",
        status="succeeded", ended_at=t1, labels=labels,
    )  # fmt: skip
    led.create_run(record)
    led.add_devices(run_id, [GpuIdentity(g, f"GPU-{run_id}-{g}", gpu_name) for g in range(gpus)])
    intervals = []
    for g in range(gpus):
        t, seq = t0, 0
        while t < t1:
            b = min(t1, t + STEP)
            intervals.append(
                GpuInterval(f"GPU-{run_id}-{g}", seq, t, b, busy_s=(b - t) * util, energy_j=(b - t) * watts)
            )
            t, seq = b, seq + 1
    led.append(run_id, gpu=intervals)


def month_ledger(path: Path, n_runs: int = 300, seed: int = 7) -> Ledger:
    led = Ledger(path)
    write(led, simulate(n_runs, seed))
    assert ts("2026-03-20T10:00") < CHANGE_MIDDAY < ts("2026-03-20T15:00")
    add_run(
        led, CHANGE_RUN, "2026-03-20T10:00", 5, gpu_name="NVIDIA A100-SXM4-40GB", gpus=2,
        labels={"team": "vision", "project": "det", "instance_type": "p4d.24xlarge"},
    )  # fmt: skip
    add_run(
        led, LABELLED_RUN, "2026-03-08T22:00", 4, gpu_name="NVIDIA H100 80GB HBM3",
        labels={"team": "vision", "project": "det", "model_version": "yolov8m-3", "dataset": "coco"},
    )  # fmt: skip
    return led


def read_csv(text: str) -> tuple[list[str], list[dict[str, str]]]:
    reader = csv.DictReader(io.StringIO(text))
    rows = list(reader)
    return list(reader.fieldnames or []), rows


def read_parquet(path: Path) -> tuple[list[str], list[dict[str, Any]], Any]:
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    return table.column_names, table.to_pylist(), table.schema
