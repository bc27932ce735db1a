"""A recorded-looking run written through the Ledger API, for the report, CLI and browser tests."""

from __future__ import annotations

import math

from diag_support import T0, device, gpu_intervals, host_intervals
from gpuledger.core.model import Event, Metric, RunRecord
from gpuledger.store import Ledger

NASTY_NAME = '<script>alert("x")</script> & “quotes” | pipes'


def write_run(
    ledger: Ledger,
    run_id: str,
    n: int = 240,
    step: float = 5.0,
    epochs: int = 4,
    gpus: int = 2,
    starved: bool = True,
    name: str = NASTY_NAME,
    started_at: float = T0,
    meta: dict | None = None,
    status: str = "failed",
) -> RunRecord:
    """``n`` intervals of ``step`` s on ``gpus`` GPUs: GPU 1 never used, GPU 0 starved by a saturated
    CPU (when ``starved``), VRAM growing, epochs with YOLO metrics, and a CUDA OOM at the end."""
    end = started_at + n * step
    run = RunRecord(
        id=run_id,
        command=["yolo", "train", "model=yolov8n.pt"],
        user="ana",
        host="gpu-box-1",
        cwd="/work",
        started_at=started_at,
        name=name,
        status=status,
        ended_at=end,
        exit_code=1 if status == "failed" else 0,
        status_reason="CUDA out of memory at epoch 4" if status == "failed" else None,
        labels={"project": "detector", "team": "vision"},
        meta=meta or {"model": {"name": "yolov8n"}, "imgsz": 640, "batch": 16, "epochs": 10, "cpu_count": 8},
    )
    ledger.create_run(run)
    devs = [device(i) for i in range(gpus)]
    ledger.add_devices(run_id, devs)
    util = (lambda i: 0.25) if starved else (lambda i: 0.92)
    ledger.append(
        run_id,
        gpu=gpu_intervals(
            devs[0].uuid,
            n,
            step,
            started_at,
            util=util,
            mem_gib=lambda i: 20 + 50 * i / n,
            proc_gib=lambda i: 19 + 50 * i / n,
            throttle=lambda i: {"power": step / 2} if i % 9 == 0 else {},
        ),
    )
    for d in devs[1:]:
        ledger.append(run_id, gpu=gpu_intervals(d.uuid, n, step, started_at, util=lambda i: 0.0, mem_gib=lambda i: 0.4))
    cores = (lambda i: 7.7) if starved else (lambda i: 2.0)
    ledger.append(run_id, host=host_intervals(n, step, started_at, cores=cores))
    epoch_s = n * step / epochs
    events, metrics = [], []
    for e in range(1, epochs + 1):
        t = started_at + e * epoch_s
        events += [
            Event(t - epoch_s, "epoch_start", f"epoch {e} started", {"epoch": e}),
            Event(t, "epoch_end", f"epoch {e} ended", {"epoch": e, "images": 1000}),
        ]
        metrics += [
            Metric(t, "train/box_loss", 1.2 * math.exp(-e / 3), e),
            Metric(t, "val/box_loss", 1.4 * math.exp(-e / 3), e),
            Metric(t, "metrics/mAP50-95(B)", 0.1 * e, e),
            Metric(t, "lr/pg0", 0.01 / e, e),
        ]
    if status == "failed":
        events.append(Event(end - 1, "cuda_oom", "CUDA out of memory at epoch 4", {"epoch": 4, "fatal": True}))
    events.append(Event(started_at + 30, "note", "<b>user</b> note & more"))
    ledger.append(run_id, events=events, metrics=metrics)
    return run
