"""Simulated weeks of YOLO trainings for the value-trend tests, and their figures computed apart.

Two model versions train every week on one A100 80 GB each, billed on the allocated basis at
3.43 an hour. ``yolov5m`` runs batch 64 for four weeks (GPU 81 % busy, 2 h per training, mAP50-95
0.40); in the last week someone sets batch 16: the data loader saturates the 8 CPU cores (an
input-pipeline bound run), the GPU is 45 % busy, a training takes 3 h 20 min and reaches 0.38.
``yolo11n`` stays the same throughout; one of its trainings is resumed after a crash (two
attempts, the second improving the first's mAP). The runs go through the Ledger API like any
recorded run (devices, GPU and host intervals, epoch events and per-epoch metrics).

``expected`` computes each group's weekly cost, mAP points and cost per point from the
simulation's own truth with plain floats, without gpuledger's cost code.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cost_support import card, ts
from gpuledger.core.model import Event, GpuIdentity, GpuInterval, HostInterval, Metric, RunRecord
from gpuledger.store import Ledger

RATE = 3.43
CARD_TEXT = """
[[gpu]]
model = "A100-80GB-SXM"
price_per_hour = "3.43"
"""
CARD = card(CARD_TEXT, basis="allocated")
WEEKS = [ts("2026-02-23"), ts("2026-03-02"), ts("2026-03-09"), ts("2026-03-16"), ts("2026-03-23")]
REPORT_END = ts("2026-04-01")  # --month 2026-03: its last complete week is 2026-03-23 (2026-W13)
STEP = 60.0
GIB = 2**30
TRAIN_IMAGES = 5000


@dataclass
class SimRun:
    id: str
    group: str
    start: float
    epochs: int
    epoch_s: float
    busy: float
    cpu_cores: float  # CPU cores the training's processes use
    batch: int
    best_map: float
    status: str = "succeeded"
    attempt_of: str | None = None
    first_epoch: int = 1
    map_before: float = 0.0  # best mAP of the attempts before (a resumed training)
    project: str = "detector"

    @property
    def hours(self) -> float:
        return self.epochs * self.epoch_s / 3600


@dataclass
class Expected:
    cost: float = 0.0
    points: float = 0.0
    runs: list[str] = field(default_factory=list)

    @property
    def per_point(self) -> float:
        return self.cost / self.points


def simulate() -> list[SimRun]:
    runs: list[SimRun] = []
    for w, week in enumerate(WEEKS):
        last = w == len(WEEKS) - 1
        for i in range(4):
            start = week + 86400 + i * 6 * 3600  # Tuesday, every six hours
            runs.append(
                SimRun(
                    f"v5m-{w}-{i}",
                    "yolov5m",
                    start,
                    10,
                    1200.0 if last else 720.0,
                    0.45 if last else 0.81,
                    7.6 if last else 2.0,
                    16 if last else 64,
                    0.38 if last else 0.40,
                )
            )
            start_n = start + 3 * 3600
            if w == 1 and i == 0:  # a crash at epoch 5, resumed: two attempts of one training
                first = SimRun("v11n-1-0a", "yolo11n", start_n, 5, 600.0, 0.85, 2.0, 32, 0.20, status="failed")
                runs.append(first)
                runs.append(
                    SimRun(
                        "v11n-1-0b",
                        "yolo11n",
                        start_n + 3600,
                        5,
                        600.0,
                        0.85,
                        2.0,
                        32,
                        0.35,
                        attempt_of=first.id,
                        first_epoch=6,
                        map_before=0.20,
                    )
                )
            else:
                runs.append(SimRun(f"v11n-{w}-{i}", "yolo11n", start_n, 10, 600.0, 0.85, 2.0, 32, 0.35))
    return runs


def write(ledger: Ledger, runs: list[SimRun]) -> None:
    for r in runs:
        end = r.start + r.epochs * r.epoch_s
        meta = {
            "model": {"name": r.group},
            "batch": r.batch,
            "imgsz": 640,
            "workers": 8,
            "cpu_count": 8,
            "dataset": {"name": "parts", "images": {"train": TRAIN_IMAGES, "val": 500}},
        }
        ledger.create_run(
            RunRecord(
                id=r.id,
                command=["yolo", "train"],
                user="ana",
                host="gpu-box-1",
                cwd="/w",
                started_at=r.start,
                status=r.status,
                ended_at=end,
                attempt_of=r.attempt_of,
                meta=meta,
                labels={
                    "project": r.project,
                    "team": "vision",
                    "model": r.group,
                    "model_version": r.group,
                    "dataset": "parts",
                },
            )
        )
        uuid = f"GPU-{r.id}"
        ledger.add_devices(r.id, [GpuIdentity(0, uuid, "NVIDIA A100-SXM4-80GB", memory_total_b=80 * GIB)])
        n = round((end - r.start) / STEP)
        gpu = [
            GpuInterval(
                uuid,
                k,
                r.start + k * STEP,
                r.start + (k + 1) * STEP,
                samples=60,
                busy_s=r.busy * STEP,
                energy_j=300 * STEP,
                mem_used_max_b=40 * GIB,
                mem_used_last_b=40 * GIB,
                temp_max_c=60.0,
            )
            for k in range(n)
        ]
        host = [
            HostInterval(
                k,
                r.start + k * STEP,
                r.start + (k + 1) * STEP,
                samples=60,
                cpu_s=r.cpu_cores * STEP,
                rss_max_b=8 * GIB,
                procs_max=9,
            )
            for k in range(n)
        ]
        events, metrics = [], []
        for e in range(r.epochs):
            number = r.first_epoch + e
            t0, t1 = r.start + e * r.epoch_s, r.start + (e + 1) * r.epoch_s
            events += [
                Event(t0, "epoch_start", payload={"epoch": number}),
                Event(t1, "epoch_end", payload={"epoch": number, "images": TRAIN_IMAGES}),
            ]
            m = r.map_before + (r.best_map - r.map_before) * (e + 1) / r.epochs
            metrics += [
                Metric(t1, "metrics/mAP50-95(B)", m, number),
                Metric(t1, "train/box_loss", 1.0 / (e + 1), number),
            ]
        ledger.append(r.id, gpu=gpu, host=host, events=events, metrics=metrics)


def expected(runs: list[SimRun]) -> dict[tuple[str, float], Expected]:
    """(group, week start) -> cost on the allocated basis and mAP points gained, plain floats."""
    out: dict[tuple[str, float], Expected] = {}
    for r in runs:
        end = r.start + r.epochs * r.epoch_s
        week = max(w for w in WEEKS if w <= end)
        cell = out.setdefault((r.group, week), Expected())
        cell.cost += r.hours * RATE
        cell.points += max(0.0, r.best_map - r.map_before) * 100
        cell.runs.append(r.id)
    return out
