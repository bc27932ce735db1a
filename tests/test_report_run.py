"""``gpuledger report run``: one model, three renderings (HTML, JSON, Markdown), through the CLI."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuledger.cli.main import cli
from gpuledger.core.ids import short_id
from gpuledger.reports.run import report as runreport
from gpuledger.store import Ledger
from report_support import NASTY_NAME, write_run

RUN = "0190cccc-0000-7000-8000-00000000000b"


@pytest.fixture
def db(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path}/ledger.db"
    with Ledger(url) as ledger:
        write_run(ledger, RUN)
    return url


def _cli(db: str, *args: str) -> str:
    result = CliRunner().invoke(cli, [*args, "--db", db], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.stdout


def test_json_twin_carries_summary_findings_charts_and_epochs(db: str) -> None:
    model = json.loads(_cli(db, "report", "run", RUN[:13], "--format", "json"))
    assert model["report"] == "run" and model["run"]["id"] == RUN
    rules = {f["rule"] for f in model["findings"]}
    assert {"oom_crash", "input_pipeline", "idle_gpus"} <= rules
    assert model["findings"][0]["severity"] == "critical"
    chart_ids = [c["id"] for c in model["charts"]]
    for wanted in (
        "gpu_util",
        "vram",
        "power",
        "temp",
        "clocks",
        "throttle",
        "cpu",
        "ram",
        "disk",
        "net",
        "losses",
        "quality",
        "lr",
    ):
        assert wanted in chart_ids
    vram = next(c for c in model["charts"] if c["id"] == "vram")
    assert [s["label"] for s in vram["series"]] == ["GPU 0", "GPU 0 run", "GPU 1", "GPU 1 run"]
    assert len([e for e in model["epochs"] if e["phase"] == "epoch"]) == 4
    assert [m["label"] for m in model["marks"]] == ["e1", "e2", "e3", "e4"]
    assert model["downsampling"]["bucket_seconds"] is None  # 240 intervals: every one drawn
    assert model["gpus"][0]["intervals"] == 240
    assert "<b>user</b> note & more" in [e["message"] for e in model["events"]["items"]]


def test_html_is_self_contained_and_escapes_user_text(db: str, tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    _cli(db, "report", "run", RUN, "-o", str(out))
    html = out.read_text()
    assert (
        "<script src" not in html and "<link" not in html and "http://" not in html.replace("http://www.w3.org", "")
    )  # nothing fetched: opens offline
    assert "uPlot" in html
    assert NASTY_NAME not in html  # the raw name would inject a script
    assert "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;" in html
    assert "&lt;b&gt;user&lt;/b&gt; note &amp; more" in html
    data = re.search(r'<script type="application/json" id="gl-data">(.*?)</script>', html, re.S).group(1)
    assert "<" not in data  # no string in the data can close the script element
    assert json.loads(data)["charts"]


def test_markdown_for_pull_requests(db: str) -> None:
    md = _cli(db, "report", "run", RUN, "--format", "md")
    assert md.startswith("### gpuledger run")
    assert "#### Findings" in md and "CUDA out of memory" in md
    assert "| 0 | NVIDIA A100-SXM4-80GB |" in md
    assert "<script>" not in md and "&lt;script&gt;" in md  # an entity: no raw HTML reaches a renderer
    assert "train/box\\_loss" in md or "metrics/mAP50-95(B)" in md


def test_html_default_file_name(db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["report", "run", RUN, "--db", db])
    assert result.exit_code == 0
    assert (tmp_path / f"gpuledger-{short_id(RUN)}.html").is_file()  # the short id people type


def test_unknown_run_is_a_one_line_error(db: str) -> None:
    result = CliRunner().invoke(cli, ["report", "run", "ffff0000", "--db", db])
    assert result.exit_code == 1 and "ffff0000" in result.output


def test_cost_block_appears_when_a_cost_engine_prices_the_run(db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    fake = types.ModuleType("gpuledger.reports.cost.run_money")
    fake.run_cost = lambda ledger, run_id: {"total": "11.70", "currency": "USD", "basis": "busy GPU-hours"}
    monkeypatch.setitem(__import__("sys").modules, "gpuledger.reports.cost.run_money", fake)
    with Ledger(db) as ledger:
        model = runreport.build(ledger, ledger.get_run(RUN))
    assert model["cost"]["total"] == "11.70"
    assert any(c["label"] == "Cost" and c["value"] == "11.70 USD" for c in model["cards"])
    assert {"label": "cost", "value": "11.70 USD"} in model["cost_rows"]


def test_no_cost_block_when_asked_or_when_the_cost_engine_fails(db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    with Ledger(db) as ledger:
        assert runreport.build(ledger, ledger.get_run(RUN), with_cost=False)["cost"] is None
        broken = types.ModuleType("gpuledger.reports.cost.run_money")

        def run_cost(ledger, run_id):
            raise RuntimeError("rate card unreadable")

        broken.run_cost = run_cost
        monkeypatch.setitem(__import__("sys").modules, "gpuledger.reports.cost.run_money", broken)
        model = runreport.build(ledger, ledger.get_run(RUN))
    assert model["cost"] is None and model["cost_rows"] == []  # the report still renders


def test_fast_epoch_accounting_equals_core_epochs(db: str) -> None:
    from gpuledger.core.training import epochs as core_epochs
    from gpuledger.reports.run import data as rundata

    with Ledger(db) as ledger:
        run = ledger.get_run(RUN)
        events = ledger.events(RUN)
        gpu = {}
        for iv in ledger.gpu_intervals(RUN):
            gpu.setdefault(iv.device_uuid, []).append(iv)
        host = ledger.host_intervals(RUN)
    fast = rundata.account(events, gpu, host, run.started_at, run.ended_at)
    ref = core_epochs.account(events, [iv for ivs in gpu.values() for iv in ivs], host, run.started_at, run.ended_at)
    assert len(fast) == len(ref)
    for a, b in zip(fast, ref, strict=True):
        assert (a.phase, a.epoch, a.exact, a.images) == (b.phase, b.epoch, b.exact, b.images)
        for name in ("wall_s", "gpu_busy_s", "gpu_energy_j", "gpu_mem_peak_b", "cpu_s", "rss_peak_b"):
            assert getattr(a, name) == pytest.approx(getattr(b, name)), name


def test_fast_epoch_accounting_shares_intervals_cut_by_a_boundary() -> None:
    from diag_support import T0, epoch_events, gpu_intervals, host_intervals
    from gpuledger.core.training import epochs as core_epochs
    from gpuledger.reports.run import data as rundata

    events = epoch_events(5, 333.0)  # boundaries fall inside the 7 s intervals
    gpu = {"GPU-test-0": gpu_intervals("GPU-test-0", 240, step=7.0, util=lambda i: (i % 10) / 10)}
    host = host_intervals(240, step=7.0, cores=lambda i: 1 + i % 3)
    fast = rundata.account(events, gpu, host, T0, T0 + 240 * 7)
    ref = core_epochs.account(events, gpu["GPU-test-0"], host, T0, T0 + 240 * 7)
    assert [(a.phase, a.epoch, a.exact) for a in fast] == [(b.phase, b.epoch, b.exact) for b in ref]
    for a, b in zip(fast, ref, strict=True):
        assert (a.gpu_busy_s, a.cpu_s, a.wall_s) == pytest.approx((b.gpu_busy_s, b.cpu_s, b.wall_s))


def test_regression_against_earlier_runs_of_the_same_configuration(tmp_path: Path) -> None:
    from diag_support import T0

    db = f"sqlite:///{tmp_path}/ledger.db"
    with Ledger(db) as ledger:
        for i in range(3):  # earlier runs: 300 s per epoch
            write_run(
                ledger,
                f"0190cccc-0000-7000-8000-00000000010{i}",
                status="succeeded",
                starved=False,
                name=f"earlier {i}",
                started_at=T0 - 86400 * (3 - i),
            )
        write_run(
            ledger, "0190cccc-0000-7000-8000-000000000200", n=300, status="succeeded", starved=False, name="now"
        )  # 375 s per epoch
        write_run(
            ledger,
            "0190cccc-0000-7000-8000-000000000300",
            status="succeeded",
            starved=False,
            name="other",
            started_at=T0 - 3600,
            meta={"model": {"name": "yolov8x"}, "imgsz": 1280, "batch": 4},
        )
    model = json.loads(_cli(db, "report", "run", "0190cccc-0000-7000-8000-000000000200", "--format", "json"))
    found = {f["rule"]: f for f in model["findings"]}
    assert found["regression"]["figures"]["baseline_sec_per_epoch"] == pytest.approx(300.0)
    assert len(found["regression"]["figures"]["baseline_runs"]) == 3  # not the other configuration
    assert "25 % slower per epoch" in found["regression"]["detail"]
    quiet = json.loads(
        _cli(db, "report", "run", "0190cccc-0000-7000-8000-000000000200", "--format", "json", "--no-history")
    )
    assert "regression" not in {f["rule"] for f in quiet["findings"]}


def test_results_csv_time_is_not_a_metric_chart_and_short_epochs_have_a_wall_time(tmp_path: Path) -> None:
    from diag_support import T0, host_intervals
    from gpuledger.core.model import Event, Metric, RunRecord
    from gpuledger.reports.render_html import render_run as html
    from gpuledger.reports.render_md import render_run as md

    run = RunRecord(id=RUN, command=["python", "train.py"], user="u", host="h", cwd="/", started_at=T0,
                    status="succeeded", ended_at=T0 + 2, exit_code=0)  # fmt: skip
    with Ledger(f"sqlite:///{tmp_path}/l.db") as ledger:
        ledger.create_run(run)
        ledger.append(RUN, host=host_intervals(4, 0.4, T0), events=[  # four epochs of 0.4 s
            e for k in range(1, 5) for e in (Event(T0 + (k - 1) * 0.4, "epoch_start", payload={"epoch": k}),
                                             Event(T0 + k * 0.4, "epoch_end", payload={"epoch": k}))],
            metrics=[m for k in range(1, 5) for m in (Metric(T0 + k * 0.4, "time", 0.4 * k, k),
                                                      Metric(T0 + k * 0.4, "val_accuracy", 0.2 * k, k))])  # fmt: skip
        model = runreport.build(ledger, ledger.get_run(RUN), with_history=False, with_cost=False)
    drawn = [s["label"] for c in model["charts"] if c["group"] == "metrics" for s in c["series"]]
    assert drawn == ["val_accuracy"]  # results.csv's clock is not a training metric
    text = md(model)
    assert "| 1 | 0.400 s |" in text and "0:00:00" not in text  # sub-second epochs keep their length
    assert "val\\_accuracy" in text and "0.8000" in text  # the run's own metric in the epochs table
    page = html(model)
    assert "<th>val_accuracy</th>" in page and "0.400 s" in page


def test_a_run_without_gpus_is_not_said_to_have_used_its_gpus_well(tmp_path: Path) -> None:
    from diag_support import T0, host_intervals
    from gpuledger.core.model import RunRecord
    from gpuledger.reports.render_html import render_run as html

    run = RunRecord(id=RUN, command=["yolo", "train"], user="u", host="h", cwd="/", started_at=T0,
                    status="succeeded", ended_at=T0 + 2, exit_code=0)  # fmt: skip
    with Ledger(f"sqlite:///{tmp_path}/l.db") as ledger:
        ledger.create_run(run)
        ledger.append(RUN, host=host_intervals(4, 0.4, T0))  # a CPU training: host intervals only
        model = runreport.build(ledger, ledger.get_run(RUN), with_history=False, with_cost=False)
    assert model["gpus"] == [] and model["findings"] == []
    page = html(model)
    assert "GPUs were used well" not in page and "no GPU was metered for this run" in page


def test_finding_evidence_times_say_utc_as_the_charts_use_the_browsers_zone(db: str, tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    _cli(db, "report", "run", RUN, "-o", str(out))
    html = out.read_text()
    buttons = re.findall(r'<button class="zoom" data-zoom="[^"]+">(.*?)</button>', html, flags=re.S)
    assert buttons and all(re.search(r"\d\d:\d\d:\d\d–\d\d:\d\d:\d\d UTC$", b.strip()) for b in buttons), buttons
    assert "<th>time (UTC)</th>" in html


def test_epoch_gpu_busy_is_gpu_time_absent_is_na_and_the_command_is_shell_quoted(tmp_path: Path) -> None:
    from gpuledger.reports.render_html import render_run as html
    from gpuledger.reports.render_md import render_run as md

    url = f"sqlite:///{tmp_path}/l.db"
    with Ledger(url) as ledger:
        run = write_run(ledger, RUN, epochs=4, gpus=2)  # GPU 0 busy 25 %, 300 s epochs
        ledger.update_run(RUN, command=["python", "train.py", "--name", "my run"])
        model = runreport.build(ledger, ledger.get_run(run.id), with_history=False, with_cost=False)
    # Eight GPUs busy for an hour are 8 GPU-hours: GPU time summed over GPUs is no clock time.
    epochs = [e for e in model["epochs"] if e["phase"] == "epoch"]
    assert epochs[0]["gpu_busy_s"] == pytest.approx(75.0)
    epochs[0]["gpu_busy_s"] = 8 * 3600.0
    del epochs[1]["metrics"]["metrics/mAP50-95(B)"]
    text = md(model)
    assert "| 1 | 0:05:00 | 8.00 GPU-h |" in text and "| 2 | 0:05:00 | 75.0 GPU-s |" in text
    assert "8:00:00" not in text and "–" not in text
    row2 = next(line for line in text.splitlines() if line.startswith("| 2 |"))
    assert "n/a" in row2
    page = html(model)
    assert "8.00 GPU-h" in page and "75.0 GPU-s" in page and "8:00:00" not in page
    cells = re.findall(r'<td class="num">([^<]*)</td>', page)
    assert "n/a" in cells and "–" not in cells and not any(c.startswith("n/a ") for c in cells)
    assert "python train.py --name &#39;my run&#39;" in page  # shlex.join, as gpuledger show prints it
