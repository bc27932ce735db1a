"""The dashboard in a real headless Chromium (Debian's, driven by Playwright) against a real server.

A uvicorn server serves a SQLite ledger. The test logs in with a token, checks the overview, the
runs list and a run page load with no console error and no request leaving the server, that user
text (names, labels, alert messages full of markup) stays text, and that a run recorded DURING the
test by `gpuledger run --server URL` (an agent token) appears in the list by itself and its charts
gain points while it records.
Screenshots go to test-artifacts/. Skipped without Chromium or Playwright unless CI is set.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from browser_support import need_browser
from dashboard_support import shot, uvicorn_server, wait_for, wait_js, watch
from e2e_helpers import GPULEDGER, cli_env
from gpuledger.cli.main import cli
from gpuledger.core.model import Event, GpuIdentity, GpuInterval, HostInterval, Metric, RunRecord
from gpuledger.store import Ledger, accounts
from prom_support import write_constant_trace

pytestmark = pytest.mark.slow
EVIL = '<img src=x onerror="alert(1)"><script>alert(2)</script>'
RUN_S = 22
# The live run reaches the server as a user's would: `gpuledger run --server URL` with an agent token
# (local ledger first, pushed from its outbox). False: the run writes straight into the server's ledger.
VIA_SERVER = True


def _seed(db: str) -> dict[str, str]:
    """An admin token, a member token of project "vision" only, a finished run of each project with
    hostile text everywhere, and an alert event."""
    now = time.time()
    with Ledger(db) as ledger:
        for n, project in enumerate(("vision", "secret")):
            run = RunRecord(
                id=f"01900000-0000-7000-8000-0000000000a{n}",
                command=["python", EVIL],
                user=EVIL,
                host="node",
                cwd="/w",
                started_at=now - 600,
                status="failed",
                ended_at=now - 300,
                name=f"{project} {EVIL}",
                labels={"project": project, "team": EVIL},
            )
            ledger.create_run(run)
            ledger.add_devices(run.id, [GpuIdentity(index=0, uuid=f"GPU-{n}", name="NVIDIA A100-SXM4-80GB")])
            gpu = [
                GpuInterval(f"GPU-{n}", s, now - 600 + 30 * s, now - 570 + 30 * s, busy_s=15.0, power_max_w=200.0)
                for s in range(10)
            ]
            host = [HostInterval(s, now - 600 + 30 * s, now - 570 + 30 * s, cpu_s=1.0) for s in range(10)]
            epochs = [Event(now - 540 + 60 * e, "epoch_end", "", {"epoch": e}) for e in range(4)]
            metrics = [
                Metric(now - 540 + 60 * e, key, value / (e + 1), epoch=e)
                for e in range(4)
                for key, value in (("train/box_loss", 1.2), ("metrics/mAP50(B)", 0.1), ("lr/pg0", 0.01))
            ]
            ledger.append(run.id, gpu, host, [*epochs, Event(now - 310, "oom", f"out of memory {EVIL}")], metrics)
        # Accounts last: a ledger with tokens is a team ledger, which takes runs through its server only.
        _, admin = accounts.issue_token(ledger, "admin", role="admin", actor="test", create_user=True)
        accounts.add_project(ledger, "vision", actor="test")
        accounts.add_project(ledger, "secret", actor="test")
        _, member = accounts.issue_token(ledger, "ann", role="member", actor="test", create_user=True)
        accounts.add_member(ledger, "ann", "vision", actor="test")
        _, agent = accounts.issue_token(
            ledger, "node-1", role="agent", actor="test", create_user=True, projects=["vision"]
        )
    return {"admin": admin, "member": member, "agent": agent}


def _login(page, base: str, token: str) -> None:
    page.goto(base + "/dashboard/")
    page.wait_for_url("**/dashboard/login?next=*")
    page.fill("#token", token)
    page.click("#login-form button[type=submit]")
    page.wait_for_url(base + "/dashboard/")


def _no_markup_ran(page) -> None:
    assert page.evaluate("document.querySelectorAll('main img, main script').length") == 0
    assert EVIL in page.inner_text("main")


def test_dashboard_shows_a_run_recorded_during_the_test(tmp_path: Path) -> None:
    sync_playwright = need_browser()
    db = f"sqlite:///{tmp_path}/server.db"
    tokens = _seed(db)
    trace = write_constant_trace(tmp_path / "constant.jsonl")
    with uvicorn_server(db, tmp_path / "server.log") as base, sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path="/usr/bin/chromium",
            args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        problems = watch(page, base)

        # A wrong token is refused on the login page.
        page.goto(base + "/dashboard/login")
        page.fill("#token", "glt_000000000000_wrong")
        page.click("#login-form button[type=submit]")
        wait_js(page, "!document.getElementById('login-error').hidden", what="the login error")
        assert all("401" in msg for msg in problems), problems  # the refused token, nothing else
        problems.clear()

        _login(page, base, tokens["admin"])
        wait_js(page, "window.gpuledgerOverview && window.gpuledgerOverview.loads > 0", what="the overview")
        assert page.inner_text("#who") == "admin (admin)"
        assert page.evaluate("window.gpuledgerOverview.cost") == "installed"  # the cost module ships: no fallback
        assert page.locator("#cost-team table").count() == 1 and page.locator("#cost-project table").count() == 1
        assert "out of memory" in page.inner_text("#alerts")
        _no_markup_ran(page)
        shot(page, "dashboard-overview.png")

        page.goto(base + "/dashboard/runs")
        wait_js(page, "window.gpuledgerRuns && window.gpuledgerRuns.loads > 0", what="the runs list")
        assert page.locator("#runs tbody tr").count() == 2
        _no_markup_ran(page)

        # A run recorded now: pushed to the server by its agent, or written into the server's ledger.
        if VIA_SERVER:
            env = cli_env(tmp_path / "home", f"sqlite:///{tmp_path}/local.db", GPULEDGER_TOKEN=tokens["agent"])
            where = ["--server", base]
        else:
            env, where = cli_env(tmp_path / "home", db), []
        run = subprocess.Popen(
            [
                *GPULEDGER,
                "run",
                *where,
                "--interval",
                "1",
                "--project",
                "vision",
                "--team",
                "cv",
                "--name",
                "live <b>run</b>",
                "--replay-gpus",
                str(trace),
                "--",
                sys.executable,
                "-c",
                f"import time; time.sleep({RUN_S})",
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            # The list refreshes itself: the new run appears without a reload.
            link = wait_for(lambda: page.query_selector("#runs a:text('live <b>run</b>')"), 30, "the new run")
            assert page.evaluate("window.gpuledgerRuns.loads") > 1
            shot(page, "dashboard-runs.png")
            run_id = link.get_attribute("title")
            link.click()
            page.wait_for_url(f"**/dashboard/runs/{run_id}")
            wait_js(page, "window.gpuledgerCharts && window.gpuledgerCharts.ready", what="the run's charts")
            assert page.evaluate("window.gpuledgerRun.live") is True
            assert page.is_visible("#live")
            first = _points(page)
            assert {"gpu_util", "vram", "power", "temp", "throttle", "cpu", "ram"} <= set(first)
            polls = page.evaluate("window.gpuledgerRun.polls")
            wait_for(lambda: _points(page)["gpu_util"] >= first["gpu_util"] + 3, 20, "new points on the chart")
            assert page.evaluate("window.gpuledgerRun.polls") > polls
            assert _gpu_util_values(page) == pytest.approx([50.0, 80.0], abs=3)
            shot(page, "dashboard-run-live.png")
            # When the run ends, the page notices, reads the rest and stops polling.
            wait_js(page, "window.gpuledgerRun.done", timeout=RUN_S + 30, what="the end of the run")
            assert not page.is_visible("#live")
            assert "succeeded" in page.inner_text("#run-title")
            shot(page, "dashboard-run-ended.png")
        finally:
            _out, err = run.communicate(timeout=RUN_S + 60)
        assert run.returncode == 0, err.decode()
        charts = page.evaluate("window.gpuledgerCharts")
        assert charts["errors"] == []
        assert [c["id"] for c in charts["charts"]] == _report_chart_ids(db, run_id)

        # A finished run with training metrics: the same charts as its report, metrics included.
        finished = "01900000-0000-7000-8000-0000000000a0"
        page.goto(f"{base}/dashboard/runs/{finished}")
        wait_js(page, "window.gpuledgerRun && window.gpuledgerRun.done", what="the finished run")
        drawn = page.evaluate("window.gpuledgerCharts.charts")
        assert [c["id"] for c in drawn] == _report_chart_ids(db, finished)
        assert {"losses", "quality", "lr"} <= {c["id"] for c in drawn}
        _no_markup_ran(page)
        shot(page, "dashboard-run-metrics.png")
        assert problems == []
        # A member of "vision" does not see the "secret" project's run, not even by its URL.
        page.evaluate("sessionStorage.clear()")
        _login(page, base, tokens["member"])
        page.goto(base + "/dashboard/runs")
        wait_js(page, "window.gpuledgerRuns && window.gpuledgerRuns.loads > 0", what="the member's runs")
        visible = page.evaluate("window.gpuledgerRuns.rows.map(r => r.project)")
        assert set(visible) == {"vision"}
        page.goto(base + "/dashboard/runs/01900000-0000-7000-8000-0000000000a1")
        wait_js(page, "window.gpuledgerRun && window.gpuledgerRun.done", what="the refused run page")
        assert "not one of your projects" in page.inner_text("#status")
        shot(page, "dashboard-member-refused.png")
        browser.close()
    assert all("404" in msg for msg in problems), problems  # the refused run answered 404, nothing else


def _points(page) -> dict[str, int]:
    return {c["id"]: c["points"] for c in page.evaluate("window.gpuledgerCharts.charts")}


def _gpu_util_values(page) -> list[float]:
    """The latest busy share of each GPU on the chart (the replay holds 50 % and 80 %)."""
    return page.evaluate("window.gpuledgerCharts.latest.gpu_util")


def _report_chart_ids(db: str, run_id: str) -> list[str]:
    result = CliRunner().invoke(cli, ["report", "run", run_id, "--format", "json", "--db", db])
    assert result.exit_code == 0, result.output
    return [c["id"] for c in json.loads(result.stdout)["charts"]]
