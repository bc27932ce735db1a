"""Audit queries against a generated ledger whose answers are known (SQLite and PostgreSQL)."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest
from click.testing import CliRunner

from diag_support import gpu_intervals
from gpuledger.cli.main import cli
from gpuledger.core.model import Event, GpuIdentity, Metric, RunRecord
from gpuledger.store import Ledger
from gpuledger.store import audit_queries as aq


def ts(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=timezone.utc).timestamp()


def _run(
    ledger: Ledger,
    rid: str,
    user: str,
    team: str,
    project: str,
    start: str,
    hours: float,
    gpus: list[str],
    util: float,
    status: str = "succeeded",
    reason: str | None = None,
    meta: dict | None = None,
    events: list[Event] | None = None,
    best_map: float | None = None,
) -> None:
    t0 = ts(start)
    end = t0 + hours * 3600
    ledger.create_run(
        RunRecord(
            id=rid,
            command=["train"],
            user=user,
            host="box",
            cwd="/",
            started_at=t0,
            status=status,
            ended_at=end,
            status_reason=reason,
            name=rid[-4:],
            labels={"team": team, "project": project},
            meta=meta or {},
        )
    )
    ledger.add_devices(rid, [GpuIdentity(index=i, uuid=u, name="NVIDIA A100") for i, u in enumerate(gpus)])
    n = round(hours * 60)
    for u in gpus:
        ledger.append(rid, gpu=gpu_intervals(u, n, step=60.0, start=t0, util=lambda i: util))
    if events:
        ledger.append(rid, events=events)
    if best_map is not None:
        ledger.append(
            rid,
            metrics=[
                Metric(end, "metrics/mAP50-95(B)", best_map / 2, 1),
                Metric(end, "metrics/mAP50-95(B)", best_map, 2),
            ],
        )


@pytest.fixture
def ledger(ledger_url: str):
    yolo = {"model": {"name": "yolov8n"}, "imgsz": 640, "batch": 16, "hyperparameters": {"workers": 8}}
    yolo_big = {"model": {"name": "yolov8s"}, "imgsz": 1280, "batch": 8, "hyperparameters": {"workers": 8}}
    with Ledger(ledger_url) as led:
        # Monday 2026-03-02 23:00 for 2 h on 2 GPUs at 50 %: crosses midnight, stays in ISO week 10.
        _run(
            led,
            "r-a",
            "alice",
            "vision",
            "det",
            "2026-03-02T23:00:00",
            2,
            ["GPU-shared", "GPU-a2"],
            0.5,
            meta=yolo,
            best_map=0.40,
        )
        # Sunday 2026-03-08 23:00 for 2 h on 1 GPU at 100 %: one hour in week 10, one in week 11.
        _run(
            led,
            "r-b",
            "bob",
            "vision",
            "seg",
            "2026-03-08T23:00:00",
            2,
            ["GPU-shared"],
            1.0,
            meta=yolo_big,
            best_map=0.50,
        )
        # April: a CUDA OOM, a short run, a killed run.
        oom = [Event(ts("2026-04-01T10:29:00"), "cuda_oom", "CUDA out of memory", {"fatal": True})]
        _run(
            led,
            "r-c",
            "alice",
            "nlp",
            "det",
            "2026-04-01T10:00:00",
            0.5,
            ["GPU-c"],
            0.9,
            status="failed",
            reason="CUDA out of memory at epoch 2",
            events=oom,
        )
        _run(led, "r-d", "carol", "nlp", "chat", "2026-04-02T10:00:00", 1 / 60, ["GPU-d"], 0.1)
        _run(
            led,
            "r-e",
            "carol",
            "nlp",
            "chat",
            "2026-04-03T10:00:00",
            1,
            ["GPU-e1", "GPU-e2"],
            0.2,
            status="killed",
            reason="killed by SIGTERM (forwarded by gpuledger)",
        )
        # A second run of alice's configuration, less efficient.
        _run(led, "r-f", "alice", "vision", "det", "2026-04-05T00:00:00", 4, ["GPU-a2"], 1.0, meta=yolo, best_map=0.40)
        yield led


def _by(rows: list[dict], *keys: str) -> dict:
    return {tuple(r[k] for k in keys): r for r in rows}


def test_gpu_hours_per_user_per_month(ledger: Ledger) -> None:
    rows = _by(aq.gpu_hours(ledger, by="user", per="month"), "period", "user")
    a = rows[("2026-03", "alice")]
    assert a["runs"] == 1
    assert a["allocated_gpu_hours"] == pytest.approx(4.0)  # 2 h x 2 GPUs
    assert a["busy_gpu_hours"] == pytest.approx(2.0)
    assert a["idle_gpu_hours"] == pytest.approx(2.0)
    assert a["energy_kwh"] == pytest.approx(2 * 120 * 300 * 60 / 3.6e6)
    assert rows[("2026-04", "alice")]["runs"] == 2  # the OOM run and r-f
    assert rows[("2026-04", "alice")]["busy_gpu_hours"] == pytest.approx(0.45 + 4.0)
    assert rows[("2026-04", "carol")]["allocated_gpu_hours"] == pytest.approx(1 / 60 + 2.0)


def test_gpu_hours_per_team_per_iso_week_splits_at_midnight(ledger: Ledger) -> None:
    rows = _by(
        aq.gpu_hours(ledger, by="team", per="week", start=ts("2026-03-01T00:00:00"), end=ts("2026-03-31T00:00:00")),
        "period",
        "team",
    )
    assert set(rows) == {("2026-W10", "vision"), ("2026-W11", "vision")}
    assert rows[("2026-W10", "vision")]["allocated_gpu_hours"] == pytest.approx(4.0 + 1.0)
    assert rows[("2026-W10", "vision")]["busy_gpu_hours"] == pytest.approx(2.0 + 1.0)
    assert rows[("2026-W11", "vision")]["busy_gpu_hours"] == pytest.approx(1.0)
    assert rows[("2026-W11", "vision")]["runs"] == 1


def test_failures_counts_wasted_hours_and_causes(ledger: Ledger) -> None:
    result = aq.failures(ledger, short_s=300)
    assert result["runs"] == 3
    assert result["by_status"] == {"failed": 1, "short": 1, "killed": 1}
    assert result["wasted_gpu_hours"] == pytest.approx(0.5 + 1 / 60 + 2.0)
    causes = {c["cause"]: c for c in result["causes"]}
    assert causes["cuda_oom"]["runs"] == 1 and causes["cuda_oom"]["gpu_hours"] == pytest.approx(0.5)
    assert "killed by SIGTERM (forwarded by gpuledger)" in causes
    assert causes["short run"]["runs"] == 1


def test_configs_ranked_by_map_per_busy_gpu_hour(ledger: Ledger) -> None:
    rows = aq.configs(ledger)
    assert [(r["model"], r["imgsz"], r["batch"], r["workers"]) for r in rows] == [
        ("yolov8s", 1280, 8, 8),
        ("yolov8n", 640, 16, 8),
    ]
    small = rows[1]
    assert small["runs"] == 2 and small["best_map"] == pytest.approx(0.40)
    # r-a: 40 points / 2 busy h = 20; r-f: 40 / 4 = 10 -> median 15
    assert small["map_points_per_busy_gpu_hour"] == pytest.approx(15.0)
    assert rows[0]["map_points_per_busy_gpu_hour"] == pytest.approx(25.0)  # 50 points / 2 h


def test_who_ran_on_a_gpu_in_a_time_range(ledger: Ledger) -> None:
    march = aq.gpu_users(ledger, "GPU-shared", ts("2026-03-01T00:00:00"), ts("2026-03-05T00:00:00"))
    assert [(r["id"], r["user"]) for r in march] == [("r-a", "alice")]
    assert march[0]["busy_gpu_hours"] == pytest.approx(1.0)  # its own GPU only: 2 h at 50 %
    everyone = aq.gpu_users(ledger, "GPU-shared")
    assert [r["user"] for r in everyone] == ["alice", "bob"]
    assert aq.gpu_users(ledger, "GPU-nobody") == []


def test_mig_slices_count_as_their_gpu(ledger: Ledger) -> None:
    slice_ = GpuIdentity(index=0, uuid="MIG-1111", name="A100 MIG 3g.40gb", mig_parent_uuid="GPU-parent")
    ledger.create_run(
        RunRecord(
            id="r-mig",
            command=["x"],
            user="dan",
            host="h",
            cwd="/",
            started_at=ts("2026-05-01T00:00:00"),
            status="succeeded",
            ended_at=ts("2026-05-01T01:00:00"),
        )
    )
    ledger.add_devices("r-mig", [slice_])
    assert [r["id"] for r in aq.gpu_users(ledger, "GPU-parent")] == ["r-mig"]


def test_query_cli_json(ledger: Ledger) -> None:
    url = ledger.database.url.render_as_string(hide_password=False)
    runner = CliRunner()
    out = runner.invoke(cli, ["query", "gpu-hours", "--by", "project", "--per", "month", "--json", "--db", url])
    assert out.exit_code == 0, out.output
    rows = _by(json.loads(out.stdout), "period", "project")
    assert rows[("2026-03", "det")]["busy_gpu_hours"] == pytest.approx(2.0)
    for args in (["failures"], ["configs"], ["gpu", "GPU-shared", "--from", "2026-03-01", "--to", "2026-03-05"]):
        out = runner.invoke(cli, ["query", *args, "--db", url])
        assert out.exit_code == 0, out.output
        json_out = runner.invoke(cli, ["query", *args, "--json", "--db", url])
        assert json.loads(json_out.stdout)
    assert "alice" in runner.invoke(cli, ["query", "gpu", "GPU-shared", "--db", url]).stdout
