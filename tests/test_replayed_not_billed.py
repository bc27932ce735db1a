"""Demo runs out of money (issue 33): a run metered from a replayed GPU trace (``gpuledger run
--replay-gpus``, the README's demo path) is no real hardware, so no bill, FOCUS dataset or capacity
report counts it unless ``--include-replayed`` asks; then it is marked in every row and total it
touches, and it is marked wherever a run is shown.

Two real SQLite ledgers hold the same real run, written through the ledger API (no GPU here to
meter one); one of them also holds a real ``gpuledger run --replay-gpus`` run. Every report of the
ledger with the demo run must equal, figure for figure, the report of the ledger without it; with
the flag it must not, and must say which run is the demo. Real CLI processes, a real ``serve``.
"""

from __future__ import annotations

import csv
import io
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from e2e_helpers import cli_env, run_cli
from gpuledger.core.model import GpuIdentity, GpuInterval, RunRecord
from gpuledger.core.months import month_bounds, month_of
from gpuledger.store import Ledger
from server_support import ServerProcess, bearer, setup_accounts

REAL = "01900000-0000-7000-8000-0000000000aa"
REAL_GPU = "GPU-real-0"
OLD_DEMO = "01900000-0000-7000-8000-0000000000bb"
DEMO_GPUS = {"GPU-5d3c1f4e-8a21-4b7e-9c1a-0f6b2d9e7a11", "GPU-a7e2b9c0-3f14-4d6a-8b5e-71c9d0e4f322"}  # the trace's


@dataclass
class World:
    both: dict[str, str]  # env of the ledger with the real run and the demo run
    real: dict[str, str]  # env of the ledger with the real run only
    both_url: str
    demo: str  # the demo run's id
    month: str
    admin: str  # an admin token of the ledger with both runs


def _real_run(url: str, month: str) -> None:
    """A run on a real GPU (team vision, project A), two hours on the month's first day."""
    t0 = month_bounds(month)[0] + 3600
    with Ledger(url) as led:
        led.create_run(
            RunRecord(
                id=REAL, command=["train"], user="ana", host="node-1", cwd="/", started_at=t0,
                status="succeeded", ended_at=t0 + 7200, labels={"team": "vision", "project": "A"},
            )
        )  # fmt: skip
        led.add_devices(REAL, [GpuIdentity(0, REAL_GPU, "NVIDIA A100-SXM4-80GB")])
        step = 600.0
        led.append(
            REAL,
            gpu=[
                GpuInterval(device_uuid=REAL_GPU, seq=i, t0=t0 + i * step, t1=t0 + (i + 1) * step, busy_s=300.0,
                            energy_j=step * 250.0)
                for i in range(12)
            ],
        )  # fmt: skip


def _last_months_demo(url: str, month: str) -> None:
    """A replayed run of last month (written as the recorder writes one, ``replayed``): once rolled
    up it reaches the chargeback's trend and the capacity shares through the rollup sums only."""
    t0 = month_bounds(month)[0] - 8 * 86400  # in a complete ISO week, within the 8 weeks of the value trends
    with Ledger(url) as led:
        led.create_run(
            RunRecord(
                id=OLD_DEMO, command=["demo"], user="ana", host="node-1", cwd="/", started_at=t0, status="succeeded",
                ended_at=t0 + 3600, labels={"team": "demo", "project": "A", "model_version": "demo-v1"}, replayed=True,
            )
        )  # fmt: skip
        led.add_devices(OLD_DEMO, [GpuIdentity(0, "GPU-old-demo", "NVIDIA A100-SXM4-80GB")])
        led.append(OLD_DEMO, gpu=[GpuInterval(device_uuid="GPU-old-demo", seq=0, t0=t0, t1=t0 + 3600, busy_s=1800.0)])


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    root = tmp_path_factory.mktemp("replayed")
    urls = {k: f"sqlite:///{root / (k + '.db')}" for k in ("both", "real")}
    envs = {k: cli_env(root / k, url) for k, url in urls.items()}
    demo_run = run_cli(
        ["run", "--replay-gpus", "a100x2-example", "--interval", "0.5", "--project", "A", "--team", "demo",
         "--name", "demo-replay", "-q", "--", "python", "-c", "import time; time.sleep(2)"],
        envs["both"],
    )  # fmt: skip
    assert demo_run.returncode == 0, demo_run.stderr.decode()
    listed = json.loads(run_cli(["runs", "--format", "json"], envs["both"]).stdout)
    demo = next(r for r in listed if r["name"] == "demo-replay")
    month = month_of(time.time())
    assert month_of(month_bounds(month)[0] + 1) == month
    for url in urls.values():
        _real_run(url, month)
    _last_months_demo(urls["both"], month)
    tokens = setup_accounts(urls["both"])  # now a team server's ledger too: the server part below
    yield World(envs["both"], envs["real"], urls["both"], demo["id"], month, tokens.admin)


def _json(args: list[str], env: dict[str, str]) -> dict[str, Any]:
    out = run_cli(args, env)
    assert out.returncode == 0, out.stderr.decode()
    return json.loads(out.stdout)


def _text(args: list[str], env: dict[str, str]) -> str:
    out = run_cli(args, env)
    assert out.returncode == 0, out.stderr.decode()
    return out.stdout.decode()


def _figures(report: dict[str, Any]) -> dict[str, Any]:
    """A report less what says which replayed runs it left out (the ledgers differ only there)."""
    return {k: v for k, v in report.items() if k not in ("warnings", "replayed_runs", "unsealed_runs")}


def test_runs_list_json_and_show_mark_the_demo(world: World) -> None:
    table = _text(["runs"], world.both)
    assert "[replayed] demo-replay" in table
    rows = {r["id"]: r for r in json.loads(_text(["runs", "--format", "json"], world.both))}
    assert rows[world.demo]["replayed"] is True and rows[REAL]["replayed"] is False
    assert "REPLAYED GPU TRACE" in _text(["show", world.demo], world.both)
    assert "REPLAYED" not in _text(["show", REAL], world.both)


def test_cost_of_a_demo_run_shows_figures_and_says_it_is_not_billed(world: World) -> None:
    report = _json(["cost", world.demo, "--format", "json"], world.both)
    entry = report["runs"][0]
    assert entry["replayed"] is True and entry["billed"] is False
    assert Decimal(entry["total"]["cost"]) > 0  # the figures are there
    assert all("replayed" in g["flags"].split(";") for g in entry["gpus"])
    assert "replayed" in entry["total"]["flags"].split(";")
    text = _text(["cost", world.demo], world.both)
    assert "REPLAYED GPU trace" in text and "not billed" in text
    real = _json(["cost", REAL, "--format", "json"], world.both)["runs"][0]
    assert real["replayed"] is False and real["billed"] is True and "replayed" not in real["total"]["flags"]
    assert "not billed" not in _text(["cost", REAL], world.both)
    report_md = _text(["report", "run", world.demo, "--cost", "--format", "md"], world.both)
    assert "| billed | no: a replayed GPU trace, not real hardware |" in report_md
    assert "| billed | yes |" in _text(["report", "run", REAL, "--cost", "--format", "md"], world.both)
    csv_rows = list(csv.DictReader(io.StringIO(_text(["cost", world.demo, "--format", "csv"], world.both))))
    assert csv_rows and all("replayed" in r["flags"].split(";") for r in csv_rows)


def test_chargeback_is_the_real_runs_alone(world: World) -> None:
    args = ["report", "chargeback", "--month", world.month, "--by", "team", "--format", "json"]
    with_demo, without = _json(args, world.both), _json(args, world.real)
    assert _figures(with_demo) == _figures(without)
    assert with_demo["total"]["attempts"] == 1 and with_demo["total"]["replayed_runs"] == 0
    real_cost = Decimal(_json(["cost", REAL, "--format", "json"], world.both)["total"]["cost"])
    assert Decimal(with_demo["total"]["cost"]) == real_cost
    assert [g["team"] for g in with_demo["groups"]] == ["vision"]
    assert with_demo["replayed_runs"] == [] and with_demo["include_replayed"] is False
    assert any("replayed run" in w and "left out" in w for w in with_demo["warnings"])
    # rolled up, the runs are read from rollup rows (the columnar path; the trend's sums): the same
    for env in (world.both, world.real):
        _text(["report", "rollup"], env)
    assert _figures(_json(args, world.both)) == _figures(_json(args, world.real)) == _figures(without)
    trend = _json([*args, "--include-replayed"], world.both)["trend"]
    assert any(r["team"] == "demo" and Decimal(r["cost"]) > 0 for r in trend)  # last month's demo, when asked


def test_chargeback_with_the_flag_bills_and_marks_the_demo(world: World) -> None:
    args = ["report", "chargeback", "--month", world.month, "--by", "team", "--include-replayed"]
    report = _json([*args, "--format", "json"], world.both)
    groups = {g["team"]: g for g in report["groups"]}
    assert groups["demo"]["replayed_runs"] == 1 and groups["vision"]["replayed_runs"] == 0
    assert report["total"]["replayed_runs"] == 1 and report["replayed_runs"] == [world.demo]
    plain = _json(["report", "chargeback", "--month", world.month, "--by", "team", "--format", "json"], world.both)
    assert Decimal(groups["demo"]["cost"]) > 0 and groups["vision"] == plain["groups"][0] | {
        "share": groups["vision"]["share"]
    }
    # exact: money is Decimal; the demo adds its own group's cost and nothing else
    assert Decimal(report["total"]["cost"]) == Decimal(plain["total"]["cost"]) + Decimal(groups["demo"]["cost"])
    top = {r["run_id"]: r for r in report["top_runs_by_cost"]}
    assert "replayed" in top[world.demo]["flags"].split(";") and "replayed" not in top[REAL]["flags"]
    assert any("included and marked replayed" in w for w in report["warnings"])
    table = _text([*args, "--format", "table"], world.both)
    assert "INCLUDES REPLAYED RUNS" in table and "REPLAYED" in table.splitlines()[2]
    md = _text([*args, "--format", "md"], world.both)
    assert "INCLUDES REPLAYED RUNS" in md and "| REPLAYED |" in md
    html = _text([*args, "--format", "html"], world.both)
    assert "INCLUDES REPLAYED RUNS" in html and "included and marked replayed" in html and "<th>REPLAYED</th>" in html
    assert "demo-v1" in html  # the weekly value for money has last month's demo model version, when asked
    assert "demo-v1" not in _text(["report", "chargeback", "--month", world.month, "--format", "html"], world.both)
    groups_csv = {r["team"]: r for r in csv.DictReader(io.StringIO(_text([*args, "--format", "csv"], world.both)))}
    assert groups_csv["demo"]["replayed_runs"] == "1" and groups_csv["TOTAL"]["replayed_runs"] == "1"
    runs_csv = _text([*args, "--format", "csv", "--section", "runs"], world.both)
    assert any("replayed" in r["flags"] for r in csv.DictReader(io.StringIO(runs_csv)) if r["run_id"] == world.demo)
    plain = _text(["report", "chargeback", "--month", world.month, "--format", "table"], world.both)
    assert "INCLUDES REPLAYED RUNS" not in plain and "left out" in plain


def _focus(args: list[str], env: dict[str, str]) -> tuple[list[dict[str, str]], str]:
    out = run_cli(args, env)
    assert out.returncode == 0, out.stderr.decode()
    return list(csv.DictReader(io.StringIO(out.stdout.decode()))), out.stderr.decode()


def test_focus_is_the_real_runs_alone_and_marks_the_demo_when_asked(world: World) -> None:
    args = ["report", "chargeback", "--month", world.month, "--format", "focus"]
    with_demo, notes = _focus(args, world.both)
    without, _ = _focus(args, world.real)
    assert with_demo == without and {r["ResourceId"] for r in with_demo} == {REAL}
    assert "left out" in notes
    real_cost = Decimal(_json(["cost", REAL, "--format", "json"], world.both)["total"]["cost"])
    assert sum(Decimal(r["BilledCost"]) for r in with_demo) == real_cost
    included, notes = _focus([*args, "--include-replayed"], world.both)
    demo_rows = [r for r in included if r["ResourceId"] == world.demo]
    assert demo_rows and all("replayed" in r["x_Flags"].split(";") for r in demo_rows)
    assert all("replayed" not in (r["x_Flags"] or "") for r in included if r["ResourceId"] == REAL)
    assert "included and marked replayed" in notes


def test_capacity_has_no_demo_gpus_and_shares_no_demo_idle(world: World) -> None:
    args = ["report", "capacity", "--month", world.month, "--by", "gpu", "--format", "json"]
    with_demo, without = _json(args, world.both), _json(args, world.real)
    assert _figures(with_demo) == _figures(without)
    assert [g["gpu"] for g in with_demo["groups"]] == [REAL_GPU]
    assert any("left out" in w for w in with_demo["warnings"])
    shared = ["--share-idle", "allocated"]  # the demo's GPUs' idle time is nobody's to share
    cap = _json([*args, *shared], world.both)
    assert _figures(cap) == _figures(_json([*args, *shared], world.real))
    assert {s.get("team") for s in cap["shares"]} <= {"vision"}
    cb = ["report", "chargeback", "--month", world.month, "--format", "json", *shared]
    assert _figures(_json(cb, world.both)) == _figures(_json(cb, world.real))
    focus = ["report", "capacity", "--month", world.month, "--format", "focus"]
    assert _focus(focus, world.both)[0] == _focus(focus, world.real)[0]

    included = _json([*args, "--include-replayed"], world.both)
    assert {g["gpu"] for g in included["groups"]} == {REAL_GPU, *DEMO_GPUS}
    assert set(included["replayed_gpus"]) == DEMO_GPUS and included["replayed_runs"] == [world.demo]
    assert any("included and marked replayed" in w for w in included["warnings"])
    rows, _ = _focus([*focus, "--include-replayed"], world.both)
    assert {r["ResourceId"] for r in rows if "replayed" in (r["x_Flags"] or "")} == DEMO_GPUS


def test_server_dashboard_data_and_metrics_mark_the_demo(world: World) -> None:
    with ServerProcess(world.both_url) as server:
        auth = bearer(world.admin)
        runs = {r["id"]: r for r in httpx.get(server.url + "/api/v1/runs", headers=auth, timeout=30).json()}
        assert runs[world.demo]["replayed"] is True and runs[REAL]["replayed"] is False
        cb = httpx.get(
            server.url + "/api/v1/reports/chargeback", params={"month": world.month}, headers=auth, timeout=60
        )
        assert cb.status_code == 200, cb.text
        report = cb.json()
        assert report["total"]["replayed_runs"] == 0 and [g["team"] for g in report["groups"]] == ["vision"]
        assert any("left out" in w for w in report["warnings"])  # the overview shows the report's notes
        params = {"month": world.month, "include_replayed": "true"}
        marked = httpx.get(server.url + "/api/v1/reports/chargeback", params=params, headers=auth, timeout=60).json()
        assert marked["total"]["replayed_runs"] == 1
        top = {r["run_id"]: r for r in marked["top_runs_by_cost"]}
        assert "replayed" in top[world.demo]["flags"].split(";")
        # the dashboard's run links turn that into a visible mark
        api_js = httpx.get(server.url + "/dashboard/static/api.js", timeout=30).text
        assert 'class: "pill replayed"' in api_js and "run.replayed" in api_js
        metrics = httpx.get(server.url + "/metrics", headers=auth, timeout=30)
        assert metrics.status_code == 200, metrics.text
        info = {
            s.labels["run_id"]: s.labels
            for family in text_string_to_metric_families(metrics.text)
            for s in family.samples
            if s.name == "gpuledger_run_info"
        }
        assert info[world.demo]["replayed"] == "true"  # (the month-old real run is past /metrics' recent window)
        assert all(labels["replayed"] == "false" for rid, labels in info.items() if rid != world.demo)


def test_a_ledger_without_demo_runs_says_nothing_about_them(world: World) -> None:
    report = _json(["report", "chargeback", "--month", world.month, "--format", "json"], world.real)
    assert not any("replayed" in w for w in report["warnings"])


def test_query_gpu_hours_counts_the_real_runs_alone_unless_asked(world: World) -> None:
    """The audit of GPU-hours agrees with the bill: a demo used no real GPU. Left out, it is said so
    on stderr; counted, each row says how many of its runs were replayed."""
    args = ["query", "gpu-hours", "--by", "team", "--format", "json"]
    with_demo, without = run_cli(args, world.both), run_cli(args, world.real)
    assert with_demo.returncode == without.returncode == 0, with_demo.stderr.decode()
    assert json.loads(with_demo.stdout) == json.loads(without.stdout)
    assert [r["team"] for r in json.loads(with_demo.stdout)] == ["vision"]
    assert "2 run(s) metered from a replayed GPU trace left out" in with_demo.stderr.decode()
    assert without.stderr.decode() == ""
    counted = _json([*args, "--include-replayed"], world.both)
    demo = [r for r in counted if r["team"] == "demo"]
    assert demo and all(r["replayed_runs"] == r["runs"] >= 1 and r["allocated_gpu_hours"] > 0 for r in demo)
    assert [r["replayed_runs"] for r in counted if r["team"] == "vision"] == [0]
