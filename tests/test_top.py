"""``gpuledger top --once``: the live runs of this machine, one frame."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

from click.testing import CliRunner

from diag_support import device, gpu_intervals, host_intervals
from gpuledger.cli.main import cli
from gpuledger.core.model import Event, RunRecord
from gpuledger.runs.host import host_name
from gpuledger.store import Ledger


def _live_run(ledger: Ledger, rid: str, pid: int, host: str, started: float, name: str) -> None:
    ledger.create_run(
        RunRecord(
            id=rid,
            command=["train"],
            user="ana",
            host=host,
            cwd="/",
            started_at=started,
            name=name,
            recorder_pid=pid,
            meta={"epochs": 10},
            labels={"project": "det"},
        )
    )
    ledger.add_devices(rid, [device(0), device(1)])
    for d in (device(0), device(1)):
        ledger.append(
            rid,
            gpu=gpu_intervals(
                d.uuid,
                10,
                step=5.0,
                start=started,
                util=lambda i: 0.75,
                mem_gib=lambda i: 40.0,
                proc_gib=lambda i: 38.0,
            ),
        )
    ledger.append(rid, host=host_intervals(10, step=5.0, start=started, cores=lambda i: 3.5))
    events = []
    for e in range(1, 4):  # three 10 s epochs done, the fourth running since 30 s
        events += [
            Event(started + (e - 1) * 10, "epoch_start", payload={"epoch": e}),
            Event(started + e * 10, "epoch_end", payload={"epoch": e}),
        ]
    events.append(Event(started + 30, "epoch_start", payload={"epoch": 4}))
    ledger.append(rid, events=events)


def test_top_once_shows_live_runs_of_this_host_only(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path}/ledger.db"
    # A live "recorder": a process started just now, as a run's recorder starts with its run.
    recorder = subprocess.Popen(["sleep", "60"])
    try:
        now = time.time()
        started = now - 50
        with Ledger(db) as ledger:
            _live_run(ledger, "0190aaaa-1111-7000-8000-000000000001", recorder.pid, host_name(), started, "live")
            _live_run(ledger, "0190aaaa-1111-7000-8000-000000000002", 2**22 + 7, host_name(), started, "dead recorder")
            _live_run(ledger, "0190aaaa-1111-7000-8000-000000000003", recorder.pid, "other-host", started, "elsewhere")
        runner = CliRunner()
        out = runner.invoke(cli, ["top", "--once", "--json", "--db", db])
        text = runner.invoke(cli, ["top", "--once", "--db", db], env={"COLUMNS": "200"}).stdout
    finally:
        recorder.kill()
        recorder.wait()
    assert out.exit_code == 0, out.output
    rows = json.loads(out.stdout)
    assert [r["name"] for r in rows] == ["live"]
    row = rows[0]
    assert row["epoch"] == 3 and row["epochs"] == 10
    assert row["eta_s"] is not None and abs(row["eta_s"] - (7 * 10 - 20)) < 5  # 7 epochs left, 20 s into one
    assert [g["index"] for g in row["gpus"]] == [0, 1]
    assert abs(row["gpus"][0]["util"] - 0.75) < 1e-9 and abs(row["cpu_cores"] - 3.5) < 1e-9
    assert "live" in text and "75%" in text and "3/10" in text and "dead recorder" not in text


def test_top_once_with_nothing_recording(tmp_path: Path) -> None:
    Ledger(f"sqlite:///{tmp_path}/l.db").close()  # a ledger, empty: a missing one is an error
    out = CliRunner().invoke(cli, ["top", "--once", "--db", f"sqlite:///{tmp_path}/l.db"], env={"COLUMNS": "200"})
    assert out.exit_code == 0 and "no run is recording here" in out.stdout


def test_a_run_before_its_first_sample_is_not_said_to_have_no_gpu(tmp_path: Path) -> None:
    """The recorder writes its first intervals at its first flush: until then top cannot know the
    run's GPUs, and says so instead of "no GPU"; once host intervals without GPUs are there, it has none."""
    db = f"sqlite:///{tmp_path}/ledger.db"
    recorder = subprocess.Popen(["sleep", "60"])
    try:
        started = time.time() - 2
        rid = "0190aaaa-1111-7000-8000-000000000004"
        with Ledger(db) as ledger:
            ledger.create_run(RunRecord(id=rid, command=["train"], user="ana", host=host_name(), cwd="/",
                                        started_at=started, name="fresh", recorder_pid=recorder.pid))  # fmt: skip
        runner = CliRunner()
        before = json.loads(runner.invoke(cli, ["top", "--once", "--json", "--db", db]).stdout)
        text_before = runner.invoke(cli, ["top", "--once", "--db", db], env={"COLUMNS": "200"}).stdout
        with Ledger(db) as ledger:
            ledger.append(rid, host=host_intervals(1, step=1.0, start=started, cores=lambda i: 1.0))
        text_after = runner.invoke(cli, ["top", "--once", "--db", db], env={"COLUMNS": "200"}).stdout
    finally:
        recorder.kill()
        recorder.wait()
    assert [(r["name"], r["gpus"], r["sampled"]) for r in before] == [("fresh", [], False)]
    assert "no sample yet" in text_before and "no GPU" not in text_before
    assert "no GPU" in text_after and "no sample yet" not in text_after
