"""``gpuledger compare``: differences against the first run, aligned epoch curves, every format."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from diag_support import T0
from gpuledger.cli.main import cli
from gpuledger.core.diagnosis import compare as core_compare
from gpuledger.core.ids import short_id
from gpuledger.store import Ledger
from report_support import write_run

A = "0190c0c0-0000-7000-8000-00000000000a"
B = "0190c0c0-0000-7000-8000-00000000000b"


def test_rows_diff_against_the_first_run_with_verdicts() -> None:
    rows = {
        r["key"]: r
        for r in core_compare.rows(
            [
                {"wall_seconds": 100.0, "best_map": 0.40, "gpus": "1 × A100", "cost": "10.00 USD"},
                {"wall_seconds": 125.0, "best_map": 0.44, "gpus": "2 × A100", "cost": "12.50 USD"},
            ]
        )
    }
    wall = rows["wall_seconds"]["cells"][1]
    assert wall["diff"] == "+25.0%" and wall["verdict"] == "worse"
    assert rows["best_map"]["cells"][1]["verdict"] == "better"
    assert rows["gpus"]["cells"][1]["diff"] is None  # text: no percentage
    assert rows["cost"]["cells"][1]["diff"] == "+25.0%"  # money kept as decimal strings still compares
    assert "energy_kwh" not in rows  # no run has it


def test_aligned_curves_leave_gaps() -> None:
    epochs, values = core_compare.aligned_curves([{1: 1.0, 2: 0.8}, {1: 1.1, 2: 0.9, 3: 0.7}])
    assert epochs == [1, 2, 3] and values == [[1.0, 0.8, None], [1.1, 0.9, 0.7]]


@pytest.fixture
def db(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path}/ledger.db"
    with Ledger(url) as ledger:
        write_run(ledger, A, status="succeeded", starved=False, name="baseline", started_at=T0 - 86400)
        write_run(ledger, B, n=300, status="succeeded", starved=True, name="slower")
    return url


def test_compare_json_has_figures_and_epoch_curves(db: str) -> None:
    out = CliRunner().invoke(cli, ["compare", A, B, "--format", "json", "--db", db])
    assert out.exit_code == 0, out.output
    model = json.loads(out.stdout)
    assert [r["id"] for r in model["runs"]] == [A, B]
    rows = {r["key"]: r for r in model["rows"]}
    per_epoch = rows["sec_per_epoch"]["cells"]
    assert per_epoch[0]["value"] == pytest.approx(300.0) and per_epoch[1]["diff"] == "+25.0%"
    assert per_epoch[1]["verdict"] == "worse"
    assert rows["mean_utilization"]["cells"][1]["verdict"] == "worse"
    charts = {c["id"]: c for c in model["charts"]}
    assert charts["map"]["x"] == [1, 2, 3, 4] and charts["map"]["time"] is False
    # Labelled by short id: the ids share their first 8 digits (a timestamp), not their tail.
    labels = [s["label"] for s in charts["epoch_time"]["series"]]
    assert labels == [f"baseline ({short_id(A)})", f"slower ({short_id(B)})"] and short_id(A) != short_id(B)


def test_compare_table_md_and_html(db: str, tmp_path: Path) -> None:
    runner = CliRunner()
    table = runner.invoke(cli, ["compare", A, B, "--db", db], env={"COLUMNS": "200"})
    assert table.exit_code == 0 and "time per epoch" in table.stdout and "+25.0%" in table.stdout
    md = runner.invoke(cli, ["compare", A, B, "--format", "md", "--db", db]).stdout
    assert md.startswith("### gpuledger compare") and "| time per epoch (median) |" in md
    html = tmp_path / "c.html"
    assert runner.invoke(cli, ["compare", A, B, "--format", "html", "-o", str(html), "--db", db]).exit_code == 0
    text = html.read_text()
    assert "uPlot" in text and "chart-map" in text and "<script src" not in text


def test_compare_needs_two_runs(db: str) -> None:
    out = CliRunner().invoke(cli, ["compare", A, "--db", db])
    assert out.exit_code == 2 and "at least two runs" in out.output


def test_the_config_row_shows_the_dataset_the_note_is_about(tmp_path: Path) -> None:
    """Two runs that differ only in their dataset: the row must show it, not "– · – · – · –"
    beside "n/a" under a note saying they differ."""
    url = f"sqlite:///{tmp_path}/ledger.db"
    with Ledger(url) as ledger:
        write_run(ledger, A, status="succeeded", meta={"model": "yolov8n", "dataset": "coco8.yaml"})
        write_run(ledger, B, status="succeeded", meta={"model": "yolov8n", "dataset": "coco128.yaml"})
    out = CliRunner().invoke(cli, ["compare", A, B, "--format", "json", "--db", url])
    assert out.exit_code == 0, out.output
    model = json.loads(out.stdout)
    config = {r["key"]: r for r in model["rows"]}["config"]
    assert "dataset" in config["label"]
    texts = [c["text"] for c in config["cells"]]
    assert texts == ["yolov8n · coco8.yaml · – · – · –", "yolov8n · coco128.yaml · – · – · –"]
    assert any("differ in configuration" in n for n in model["notes"])
