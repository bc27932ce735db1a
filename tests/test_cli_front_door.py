"""The everyday commands as a user meets them: one spelling for JSON, the same default run, short
ids that are typed, live figures for a running run, readable tables, honest numbers."""

from __future__ import annotations

import io
import json
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from rich.console import Console

from diag_support import T0, device, gpu_intervals, host_intervals
from gpuledger.cli.main import cli
from gpuledger.core.ids import short_id, tail_of_short_id, uuid7
from gpuledger.core.metering.summary import format_summary, summarize
from gpuledger.core.model import Event, HostInterval, Metric, RunRecord
from gpuledger.runs.host import host_name
from gpuledger.store import Ledger
from report_support import write_run

YOLO = "0190e0e0-0000-7000-8000-0000000000aa"  # a finished YOLO-like run (write_run)
REPLAYED = "0190e0e0-0000-7000-8000-0000000000bb"  # replayed, the longest command, a short success
CUSTOM = "0190e0e0-0000-7000-8000-0000000000cc"  # gpuledger.track() metrics, no YOLO names
LIVE = "0190e0e0-0000-7000-8000-0000000000dd"  # still recording (its recorder is alive)
YOLO_COMMAND = ["yolo", "train", "data=coco.yaml", "model=yolov8n.yaml", "epochs=300", "imgsz=640", "batch=64",
                "workers=16", "device=0,1,2,3", "project=runs/detect", "name=baseline-with-a-long-name",
                "optimizer=AdamW", "lr0=0.001", "cos_lr=True", "close_mosaic=15"]  # fmt: skip


@pytest.fixture(scope="module")
def recorder() -> Iterator[subprocess.Popen]:
    proc = subprocess.Popen(["sleep", "600"])  # stands in for a live run's recorder process
    yield proc
    proc.kill()
    proc.wait()


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory, recorder: subprocess.Popen) -> str:
    url = f"sqlite:///{tmp_path_factory.mktemp('front')}/ledger.db"
    now = time.time()
    with Ledger(url) as ledger:
        write_run(ledger, YOLO, n=40, status="succeeded", starved=False, name="yolo", started_at=now - 7200)
        ledger.create_run(RunRecord(id=REPLAYED, command=YOLO_COMMAND, user="bo", host="gpu-box-1", cwd="/",
                                    started_at=now - 3600, status="succeeded", ended_at=now - 3590, exit_code=0,
                                    replayed=True, labels={"project": "detector", "dataset": "coco"}))  # fmt: skip
        ledger.add_devices(REPLAYED, [device(0)])
        ledger.append(REPLAYED, gpu=gpu_intervals(device(0).uuid, 2, 5.0, now - 3600))
        ledger.create_run(RunRecord(id=CUSTOM, command=["python", "train.py"], user="cy", host="h", cwd="/",
                                    started_at=now - 1800, status="succeeded", ended_at=now - 1700, exit_code=0,
                                    name="custom"))  # fmt: skip
        ledger.append(CUSTOM, events=[e for k in (1, 2) for e in (
            Event(now - 1800 + (k - 1) * 40, "epoch_start", payload={"epoch": k}),
            Event(now - 1800 + k * 40, "epoch_end", payload={"epoch": k}))],
            metrics=[Metric(now - 1800 + k * 40, key, value * k, k) for k in (1, 2)
                     for key, value in (("my_accuracy", 0.31), ("time", 40.0))])  # fmt: skip
        # Started after its (stand-in) recorder process, as a run starts after gpuledger.
        ledger.create_run(RunRecord(id=LIVE, command=["python", "train.py"], user="di", host=host_name(), cwd="/",
                                    started_at=now - 50, name="live", recorder_pid=recorder.pid))  # fmt: skip
        ledger.add_devices(LIVE, [device(0)])
        # 30 s written at 80 % busy; the last 20 s are still in the recorder's memory.
        ledger.append(LIVE, gpu=gpu_intervals(device(0).uuid, 6, 5.0, now - 50, util=lambda i: 0.8),
                      host=host_intervals(6, 5.0, now - 50))  # fmt: skip
    return url


def invoke(db: str, *args: str, **env: str) -> Result:
    result = CliRunner().invoke(cli, [*args, "--db", db], env={"GPULEDGER_RATES": "", **env})
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result


# -- one spelling for JSON, one default run ----------------------------------------------------------

JSON_COMMANDS = [["runs"], ["show", short_id(YOLO)], ["cost", short_id(YOLO)], ["query", "gpu-hours"],
                 ["query", "failures"], ["query", "configs"], ["query", "gpu", "GPU-test-0"], ["top"],
                 ["report", "run", short_id(YOLO), "--no-history"], ["compare", short_id(YOLO), short_id(CUSTOM)],
                 ["report", "chargeback"]]  # fmt: skip


@pytest.mark.parametrize("command", JSON_COMMANDS, ids=" ".join)
def test_json_and_format_json_are_the_same_on_every_read_command(db: str, command: list[str]) -> None:
    long, short = invoke(db, *command, "--format", "json"), invoke(db, *command, "--json")
    assert long.exit_code == 0 and short.exit_code == 0, long.output + short.output
    assert _stable(json.loads(short.stdout)) == _stable(json.loads(long.stdout))


# A live run's clock, and when a report was made.
MOVING = {"wall_seconds", "elapsed_seconds", "elapsed_s", "age_s", "eta_s", "cpu_cores", "generated_at"}


def _stable(value: object) -> object:
    if isinstance(value, dict):
        return {k: _stable(v) for k, v in value.items() if k not in MOVING}
    if isinstance(value, list):
        return [_stable(v) for v in value]
    return value


def test_show_and_cost_default_to_the_newest_run_and_say_so(db: str) -> None:
    newest = json.loads(invoke(db, "runs", "--json", "--limit", "1").stdout)[0]["id"]
    assert json.loads(invoke(db, "show", "--json").stdout)["id"] == newest
    assert json.loads(invoke(db, "cost", "--json").stdout)["runs"][0]["run_id"] == newest
    for command in ("show", "cost", "logs", "export", "report"):
        args = ["report", "run"] if command == "report" else [command]
        help_text = " ".join(CliRunner().invoke(cli, [*args, "--help"]).output.split())
        assert "default: the newest run" in help_text, command


# -- short ids ----------------------------------------------------------------------------------------


def test_runs_of_the_same_moment_get_short_ids_that_differ_and_resolve(tmp_path: Path) -> None:
    ms = int(T0 * 1000)
    ids = [uuid7(ms) for _ in range(50)]  # one millisecond: the first 12 hex digits are all the same
    assert len({i[:13] for i in ids}) == 1 and len({short_id(i) for i in ids}) == 50
    url = f"sqlite:///{tmp_path}/l.db"
    with Ledger(url) as ledger:
        for i in ids:
            ledger.create_run(RunRecord(id=i, command=["x"], user="u", host="h", cwd="/", started_at=T0))
        for i in ids:
            s = short_id(i)
            assert len(s) == 8 and i.endswith(tail_of_short_id(s))
            assert ledger.resolve(s) == i and ledger.resolve(s.upper()) == i  # typed in capitals too
        assert ledger.resolve(ids[0][:-2]) == ids[0]  # a prefix of the full id still works
    listed = invoke(url, "runs", "--json", "--limit", "100")
    assert {r["short_id"] for r in json.loads(listed.stdout)} == {short_id(i) for i in ids}
    out = invoke(url, "show", ids[0][:8])  # the shared timestamp prefix: ambiguous, says what to do
    assert out.exit_code == 1 and "matches several runs" in out.output and "full id" in out.output


@pytest.mark.parametrize("command", [["show"], ["logs"], ["export"], ["cost"], ["report", "run", "--format", "md"],
                                     ["compare", short_id(CUSTOM)]], ids=" ".join)  # fmt: skip
def test_every_command_takes_a_short_id(db: str, command: list[str]) -> None:
    out = invoke(db, *command, short_id(YOLO))
    assert out.exit_code in (0, 1) and "no run matches" not in out.output, out.output  # logs: 1, none archived
    if command[0] == "logs":
        assert f"run {YOLO} has no archived log" in out.output


def test_show_names_the_short_id(db: str) -> None:
    assert invoke(db, "show", YOLO).stdout.splitlines()[0].startswith(f"run {YOLO} ({short_id(YOLO)})")


# -- runs, top and query gpu: whole ids, readable tables ------------------------------------------------


def _terminal(width: int) -> Console:
    return Console(file=io.StringIO(), width=width, force_terminal=True, color_system=None)


def test_runs_in_a_120_column_terminal_cuts_the_command_not_ids_or_status(
    db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    screen = _terminal(120)
    monkeypatch.setattr("gpuledger.cli.render.console", lambda: screen)
    assert invoke(db, "runs").exit_code == 0
    lines = screen.file.getvalue().splitlines()  # type: ignore[attr-defined]
    assert all(len(line) <= 120 for line in lines)
    row = next(line for line in lines if line.startswith(short_id(REPLAYED)))
    assert "succeeded" in row and row.rstrip().endswith("…") and "[replayed] yolo train" in row
    for run_id in (YOLO, REPLAYED, CUSTOM, LIVE):
        assert any(line.startswith(short_id(run_id) + " ") for line in lines)


def test_runs_piped_keeps_whole_commands(db: str) -> None:
    assert " ".join(YOLO_COMMAND) in invoke(db, "runs").stdout


def test_runs_label_filter_and_the_empty_answers(db: str, tmp_path: Path) -> None:
    found = json.loads(invoke(db, "runs", "--json", "--label", "dataset=coco").stdout)
    assert [r["id"] for r in found] == [REPLAYED]
    assert invoke(db, "runs", "--label", "dataset=imagenet").stdout.strip() == "no run matches --label dataset=imagenet"
    assert invoke(db, "runs", "--project", "nope").stdout.strip() == "no run matches --project nope"
    Ledger(f"sqlite:///{tmp_path}/empty.db").close()  # a ledger with no run yet
    empty = invoke(f"sqlite:///{tmp_path}/empty.db", "runs").stdout
    assert empty.startswith("no runs yet")


def test_query_gpu_keeps_ids_whole_at_80_columns_and_marks_replayed_runs(
    db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    screen = _terminal(80)
    monkeypatch.setattr("gpuledger.cli.report_render.terminal", lambda: screen)
    assert invoke(db, "query", "gpu", "GPU-test-0").exit_code == 0
    text = screen.file.getvalue()  # type: ignore[attr-defined]
    for run_id in (YOLO, REPLAYED):
        assert short_id(run_id) in text
    assert f"{short_id(REPLAYED)} (replayed)" in text
    rows = {r["id"]: r for r in json.loads(invoke(db, "query", "gpu", "GPU-test-0", "--json").stdout)}
    assert rows[REPLAYED]["replayed"] is True and rows[YOLO]["replayed"] is False


def test_top_piped_prints_plain_text_with_whole_ids(db: str) -> None:
    out = invoke(db, "top", "--once")
    assert out.exit_code == 0
    assert short_id(LIVE) in out.stdout and "1 run recording" in out.stdout
    assert not re.search(r"[┏━│└]", out.stdout)  # no box drawing in a pipe
    assert "80%" in out.stdout


def test_top_on_a_narrow_terminal_never_cuts_the_run(db: str) -> None:
    from gpuledger.cli.top_cmd import frame
    from gpuledger.reports.run.top import snapshot

    with Ledger(db) as ledger:
        rows = snapshot(ledger, time.time())
    screen = _terminal(80)
    screen.print(frame(rows, time.time()))
    lines = screen.file.getvalue().splitlines()  # type: ignore[attr-defined]
    assert all(len(line) <= 80 for line in lines)
    run_line = next(line for line in lines if line.startswith(short_id(LIVE) + " "))
    assert run_line.endswith("  live") and " di " in run_line  # one line per run: id, user, name
    assert any(line.startswith("  GPU 0 ") and "80%" in line and "30/80G" in line for line in lines)


# -- a run still recording, epoch tables, failures ---------------------------------------------------


def test_show_of_a_running_run_has_live_figures_up_to_the_latest_write(db: str) -> None:
    data = json.loads(invoke(db, "show", short_id(LIVE), "--json").stdout)
    assert data["status"] == "running" and data["busy_gpu_hours"] == pytest.approx(24 / 3600)
    # Utilisation over what was written (80 %), not diluted by the 20 s still in the recorder.
    assert data["mean_utilization"] == pytest.approx(0.8) and data["wall_seconds"] == pytest.approx(30, abs=0.01)
    assert data["elapsed_seconds"] >= 50 and data["measured_until"] is not None
    text = invoke(db, "show", short_id(LIVE)).stdout
    assert "mean 80%" in text and "figures up to" in text and "running for" in text
    cost = json.loads(invoke(db, "cost", short_id(LIVE), "--json").stdout)["runs"][0]["total"]
    assert cost["busy_gpu_h"] == pytest.approx(data["busy_gpu_hours"], rel=1e-3)
    assert cost["allocated_gpu_h"] == pytest.approx(data["allocated_gpu_hours"], rel=1e-3)  # show and cost agree


def test_show_lists_metrics_logged_with_track_in_the_epoch_table(db: str) -> None:
    text = invoke(db, "show", short_id(CUSTOM)).stdout
    table = text[text.index("Epochs") :]
    header = table.splitlines()[1]
    assert "my_accuracy" in header and "time" not in header.split()  # results.csv's clock is "wall s"
    assert "0.3100" in table and "0.6200" in table


def test_show_on_a_narrow_terminal_fits_its_epoch_table(db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("gpuledger.cli.render.console", lambda: _terminal(40))
    lines = invoke(db, "show", short_id(CUSTOM)).stdout.splitlines()
    assert all(len(line) <= 40 for line in lines)
    table = lines[lines.index("Epochs") + 1 :]
    assert table[0].startswith("epoch") and any(line.startswith("not shown at this width:") for line in table)
    assert any(line.startswith("1 ") for line in table) and any(line.startswith("total") for line in table)


def test_query_failures_does_not_count_short_successes_as_waste(db: str) -> None:
    data = json.loads(invoke(db, "query", "failures", "--json").stdout)
    assert data["runs"] == 0 and data["wasted_gpu_hours"] == 0 and data["causes"] == []
    assert data["short_runs"]["runs"] >= 2  # REPLAYED (10 s) and CUSTOM (100 s) succeeded quickly
    assert all(not i["wasted"] for i in data["items"])
    text = invoke(db, "query", "failures").stdout
    assert text.startswith("0 failed runs") and "not counted as waste" in text


def test_short_runs_and_failures_together(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/l.db"
    with Ledger(url) as ledger:
        write_run(ledger, YOLO, n=12, status="failed", started_at=time.time() - 7200)
        ledger.create_run(RunRecord(id=CUSTOM, command=["x"], user="u", host="h", cwd="/", started_at=time.time() - 60,
                                    status="succeeded", ended_at=time.time() - 30, exit_code=0))  # fmt: skip
        ledger.add_devices(CUSTOM, [device(0)])
    data = json.loads(invoke(url, "query", "failures", "--json").stdout)
    assert data["by_status"] == {"failed": 1} and data["short_runs"]["runs"] == 1
    assert data["wasted_gpu_hours"] == pytest.approx(2 * 60 / 3600)  # the failed run's 2 GPUs x 60 s only
    assert invoke(url, "query", "failures").stdout.startswith("1 failed run (failed 1)")


# -- numbers ------------------------------------------------------------------------------------------


def test_a_command_too_short_to_sample_has_no_peak_rss_not_zero() -> None:
    run = RunRecord(id=YOLO, command=["true"], user="u", host="h", cwd="/", started_at=T0, status="succeeded",
                    ended_at=T0 + 0.01, exit_code=0)  # fmt: skip
    never_seen = HostInterval(0, T0, T0 + 0.01, samples=1, cpu_s=0.001, rss_max_b=0, read_b=0, write_b=0,
                              procs_max=0)  # fmt: skip
    s = summarize(run, [], [], [never_seen], now=T0 + 1)
    assert s["peak_rss_bytes"] is None and s["cpu_seconds"] == 0.001  # CPU was credited by wait4: measured
    assert "peak RSS n/a" in format_summary(s)
    seen = HostInterval(0, T0, T0 + 1, samples=1, cpu_s=0.5, rss_max_b=0, read_b=0, write_b=0, procs_max=1)
    assert summarize(run, [], [], [seen], now=T0 + 1)["peak_rss_bytes"] == 0  # seen alive: a real reading


def test_compare_has_no_percentage_of_a_zero_and_money_in_cents() -> None:
    from gpuledger.core.diagnosis.compare import rows

    table = {r["key"]: r for r in rows([{"cpu_seconds": 0.0, "cost": "0.00012348 USD"},
                                        {"cpu_seconds": 4.5, "cost": "0.03974341 USD"}])}  # fmt: skip
    assert table["cpu_seconds"]["cells"][1]["diff"] is None  # a change from nothing has no %
    assert [c["text"] for c in table["cost"]["cells"]] == ["<0.01 USD", "0.04 USD"]
    assert table["cost"]["cells"][1]["value"] == "0.03974341 USD"  # exact for machines


def test_summary_lines_use_one_rounding_rule() -> None:
    run = RunRecord(id=YOLO, command=["x"], user="u", host="h", cwd="/", started_at=T0, status="succeeded",
                    ended_at=T0 + 61.2, exit_code=0)  # fmt: skip
    gpu = gpu_intervals(device(0).uuid, 1, 61.2, T0, util=lambda i: 0.3)
    text = format_summary(summarize(run, [device(0)], gpu, [], now=T0 + 100))
    assert "allocated 0.0170   busy 0.00510   idle 0.0119" in text  # three significant digits each
    assert not re.search(r"\de-\d", text) and "0.00510 kWh" in text  # no scientific notation
