"""``gpuledger export``: non-finite readings as null, and ``--metrics`` columns that a run's own
metric cannot overwrite."""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from diag_support import T0, device, gpu_intervals, host_intervals
from gpuledger.cli.main import cli
from gpuledger.core.model import Event, Metric, RunRecord
from gpuledger.store import Ledger

RUN = "0190eeee-0000-7000-8000-000000000001"


def _run(ledger: Ledger, run_id: str = RUN, n: int = 60, gpus: int = 2, step: float = 5.0, **kw: Any) -> None:
    ledger.create_run(
        RunRecord(
            id=run_id,
            command=["python", "train.py"],
            user="ana",
            host="box",
            cwd="/w",
            started_at=T0,
            status="succeeded",
            ended_at=T0 + n * step,
            exit_code=0,
        )
    )
    devs = [device(i) for i in range(gpus)]
    ledger.add_devices(run_id, devs)
    for d in devs:
        ivs = gpu_intervals(d.uuid, n, step, throttle=lambda i: {"thermal": 1.5, "power": 0.25} if i % 7 == 0 else {})
        ivs = [replace(iv, proc_mem_max_b=None, util_idle_s=None) if i % 5 == 0 else iv for i, iv in enumerate(ivs)]
        ledger.append(run_id, gpu=ivs)
    ledger.append(run_id, host=host_intervals(n, step, iowait=lambda i: None if i % 3 == 0 else 0.1))
    for k, v in kw.items():
        ledger.append(run_id, **{k: v})


def _cli(url: str, *args: str) -> str:
    result = CliRunner().invoke(cli, [*args, "--db", url], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.stdout


# -- non-finite readings ------------------------------------------------------------------------


def test_jsonl_writes_a_non_finite_reading_as_null(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/ledger.db"
    with Ledger(url) as ledger:
        _run(ledger, n=0)
        ivs = gpu_intervals("GPU-test-0", 5)
        ivs[2] = replace(ivs[2], temp_max_c=math.inf, power_max_w=-math.inf)
        ledger.append(RUN, gpu=ivs)
    lines = [json.loads(line) for line in _cli(url, "export", RUN, "--format", "jsonl").splitlines()]
    bad = next(r for r in lines if r["seq"] == 2)
    assert bad["temp_max_c"] is None and bad["power_max_w"] is None
    assert bad["busy_s"] == 4.5 and lines[0]["temp_max_c"] == 60.0


# -- export --metrics -----------------------------------------------------------------------------


@pytest.fixture
def metrics_url(tmp_path: Path) -> str:
    """A run whose own metrics are named like fixed columns (images, wall_s), plus the
    bookkeeping keys Hugging Face / Lightning (epoch) and results.csv (time) log."""
    url = f"sqlite:///{tmp_path}/ledger.db"
    events, metrics = [], []
    for e in (1, 2):
        events += [
            Event(T0 + (e - 1) * 150, "epoch_start", payload={"epoch": e}),
            Event(T0 + e * 150, "epoch_end", payload={"epoch": e, "images": 1000}),
        ]
        t = T0 + e * 150
        metrics += [
            Metric(t, "loss", 1.0 / e, e),
            Metric(t, "images", 999.5, e),
            Metric(t, "wall_s", 0.25, e),
            Metric(t, "epoch", e - 0.5, e),
            Metric(t, "time", 149.0, e),
        ]
    with Ledger(url) as ledger:
        _run(ledger, n=60, gpus=1, events=events, metrics=metrics)
    return url


def test_a_metric_named_like_a_fixed_column_does_not_overwrite_it(metrics_url: str, tmp_path: Path) -> None:
    text = _cli(metrics_url, "export", RUN, "--metrics")
    header = text.splitlines()[0].split(",")
    assert len(header) == len(set(header))  # no duplicate column
    assert header[-3:] == ["loss", "metric:images", "metric:wall_s"]
    assert "time" not in header and header.count("epoch") == 1  # not training metrics, as in show
    epoch1 = next(r for r in csv.DictReader(io.StringIO(text)) if r["epoch"] == "1")
    assert (epoch1["images"], epoch1["wall_s"]) == ("1000", "150.0")  # the fixed columns won
    assert (epoch1["metric:images"], epoch1["metric:wall_s"]) == ("999.5", "0.25")
    lines = [
        json.loads(line) for line in _cli(metrics_url, "export", RUN, "--metrics", "--format", "jsonl").splitlines()
    ]
    jl = next(r for r in lines if r["epoch"] == 1)
    assert (jl["images"], jl["metric:images"], jl["wall_s"], jl["metric:wall_s"]) == (1000, 999.5, 150.0, 0.25)
    assert "time" not in jl


def test_metrics_parquet_with_colliding_names_reads_back(metrics_url: str, tmp_path: Path) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "epochs.parquet"
    _cli(metrics_url, "export", RUN, "--metrics", "--format", "parquet", "-o", str(path))
    table = pq.read_table(path)  # ArrowInvalid "multiple matches" when two columns shared a name
    epoch1 = next(r for r in table.to_pylist() if r["epoch"] == 1)
    assert (epoch1["images"], epoch1["metric:images"], epoch1["wall_s"]) == (1000, 999.5, 150.0)


def test_a_prefixed_name_that_is_taken_too_gets_another_prefix() -> None:
    from gpuledger.reports.run.epochs import metric_column_names

    names = metric_column_names(["images", "metric:images", "loss"])
    assert names == {"images": "metric:metric:images", "metric:images": "metric:images", "loss": "loss"}
