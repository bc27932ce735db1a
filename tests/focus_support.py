"""A simulated month for the FOCUS export tests: tests/cost_sim.py's cluster plus two runs recorded
through the ledger's own API (a p4d.24xlarge run across the card's mid-day price change, and a run
labelled with a model_version), readers of the files the export writes, and the rules of each
FOCUS version the CLI writes (1.3 by default, 1.0 with ``--focus-version 1.0``)."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from cost_sim import CARD_TEXT, CHANGE_MIDDAY, simulate, write
from cost_support import ts
from focus13_spec_rules import NEW_COLUMNS, violations13
from focus_spec_rules import violations
from gpuledger.cli.cost_cmds import report_group
from gpuledger.core.model import GpuIdentity, GpuInterval, RunRecord
from gpuledger.store import Ledger

STEP = 900.0
CHANGE_RUN = "p4d-across-change"  # 10:00-15:00 on 2026-03-20, the price changes at 12:07:30
LABELLED_RUN = "yolo-v8m-3"
# The CLI's FOCUS versions, the default first: a test run for each says the same facts hold in both.
VERSIONS = ("1.3", "1.0")


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


def version_args(version: str) -> list[str]:
    """The CLI arguments that give ``version``: none for 1.3, so the tests of 1.3 test the default."""
    return [] if version == VERSIONS[0] else ["--focus-version", version]


def as_10(columns: list[str], rows: list[dict[str, Any]]) -> tuple[list[str], list[dict[str, Any]]]:
    """The columns FOCUS 1.0 knows and the x_ ones, in the file's order: what 1.0's rules apply to."""
    keep = [c for c in columns if c not in NEW_COLUMNS]
    return keep, [{c: r[c] for c in keep} for r in rows]


def focus_violations(
    version: str, columns: list[str], rows: list[dict[str, Any]], *, from_csv: bool, split: bool = False
) -> list[str]:
    """Every rule of FOCUS ``version`` the file breaks. 1.0: focus_spec_rules (a 1.3 column is a
    custom column without the x_ prefix there, so a 1.3 file fails). 1.3: focus13_spec_rules on the
    columns it adds, and 1.0's rules on the columns it keeps. ``split``: the rows hold a split cost
    allocation (``--share-idle``)."""
    if version == "1.0":
        return violations(columns, rows, from_csv=from_csv)
    return violations13(columns, rows, split=split) + violations(*as_10(columns, rows), from_csv=from_csv)


def month_env(root: Path) -> dict[str, str]:
    """The simulated month's ledger and the vision cluster's rate card under ``root``."""
    month_ledger(root / "month.db").close()
    rates = root / "rates.toml"
    rates.write_text(f'[card]\nname = "Vision cluster, 2026"\ncurrency = "USD"\nbasis = "busy"\n{CARD_TEXT}')
    return {"db": str(root / "month.db"), "rates": str(rates), "root": str(root)}


def chargeback(env: dict[str, str], *args: str) -> Any:
    """``gpuledger report chargeback`` of March 2026 on ``month_env``'s ledger and card."""
    base = ["chargeback", "--month", "2026-03", "--db", env["db"], "--rates", env["rates"]]
    return CliRunner().invoke(report_group, [*base, *args], catch_exceptions=False)
