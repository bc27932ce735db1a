"""The HTML report in a real headless Chromium (Debian's /usr/bin/chromium, driven by Playwright).

The page must load offline with no console error, draw every chart of the JSON twin with exactly
its series, shade the findings' evidence, and keep user text inert. A screenshot of each page is
kept under test-artifacts/. Outside CI the test is skipped when Chromium or Playwright is absent;
in CI (CI set) their absence is a failure.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from browser_support import ARGS, ARTIFACTS, CHROMIUM
from browser_support import need_browser as _need_browser
from gpuledger.cli.main import cli
from gpuledger.store import Ledger
from report_support import write_run


@pytest.fixture(scope="module")
def browser():
    sync_playwright = _need_browser()
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


def _render(tmp_path: Path, run_id: str, **kw) -> tuple[Path, dict]:
    db = f"sqlite:///{tmp_path}/ledger.db"
    with Ledger(db) as ledger:
        write_run(ledger, run_id, **kw)
    out = tmp_path / f"{run_id}.html"
    runner = CliRunner()
    assert runner.invoke(cli, ["report", "run", run_id, "-o", str(out), "--db", db]).exit_code == 0
    result = runner.invoke(cli, ["report", "run", run_id, "--format", "json", "--db", db])
    return out, json.loads(result.stdout)


def _open(browser, path: Path, shot: str) -> tuple[dict, list[str]]:
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    problems: list[str] = []
    page.on(
        "console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type in ("error", "warning") else None
    )
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("dialog", lambda d: (problems.append(f"dialog: {d.message}"), d.dismiss()))
    page.on(
        "request", lambda r: problems.append(f"network: {r.url}") if not r.url.startswith(("file:", "data:")) else None
    )
    page.goto(path.as_uri())
    page.wait_for_function("window.gpuledgerCharts && window.gpuledgerCharts.ready", timeout=15000)
    registry = page.evaluate("window.gpuledgerCharts")
    canvases = page.evaluate(
        "Array.from(document.querySelectorAll('.chart canvas')).map(c => [c.closest('.chart').id, c.width, c.height])"
    )
    registry["canvases"] = canvases
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / shot), full_page=True)
    # Zooming to a finding's evidence must redraw without errors.
    if page.locator("button[data-zoom]").count():
        page.locator("button[data-zoom]").first.click()
        page.wait_for_timeout(200)
    page.close()
    return registry, problems


def test_report_renders_every_chart_with_its_series(browser, tmp_path: Path) -> None:
    path, model = _render(tmp_path, "0190dddd-0000-7000-8000-00000000000c")
    registry, problems = _open(browser, path, "report-run.png")
    assert problems == []
    assert registry["errors"] == []
    drawn = {c["id"]: c for c in registry["charts"]}
    assert list(drawn) == [c["id"] for c in model["charts"]]
    for chart in model["charts"]:
        assert drawn[chart["id"]]["series"] == [s["label"] for s in chart["series"]]
        assert drawn[chart["id"]]["drawn"] == len(chart["series"])
        assert drawn[chart["id"]]["points"] == len(chart["x"])
    assert drawn["gpu_util"]["shaded"] > 0  # idle GPU 1 and the starved input: evidence shaded
    assert drawn["vram"]["marks"] == 4  # epoch ends
    sizes = {cid: (w, h) for cid, w, h in registry["canvases"]}
    assert set(sizes) == {f"chart-{c['id']}" for c in model["charts"]}
    assert all(w > 200 and h > 100 for w, h in sizes.values())


def test_downsampled_report_draws_bands(browser, tmp_path: Path) -> None:
    path, model = _render(
        tmp_path,
        "0190eeee-0000-7000-8000-00000000000d",
        n=2600,
        step=1.0,
        gpus=1,
        starved=False,
        status="succeeded",
        name="big run",
    )
    assert model["downsampling"]["bucket_seconds"] is not None
    util = next(c for c in model["charts"] if c["id"] == "gpu_util")
    assert "lo" in util["series"][0]
    registry, problems = _open(browser, path, "report-run-downsampled.png")
    assert problems == [] and registry["errors"] == []
    assert len(registry["charts"]) == len(model["charts"])


def test_chromium_is_debians_not_a_downloaded_one() -> None:
    if not os.path.exists(CHROMIUM):
        pytest.skip("no Chromium here")
    assert shutil.which("chromium") == CHROMIUM or os.path.realpath(CHROMIUM).startswith("/usr/")


def test_small_values_keep_their_digits_on_the_axis(browser, tmp_path: Path) -> None:
    from gpuledger.core.model import Metric

    run_id = "0190ffff-0000-7000-8000-00000000000e"
    db = f"sqlite:///{tmp_path}/ledger.db"
    with Ledger(db) as ledger:
        run = write_run(ledger, run_id, n=48, gpus=1, status="succeeded", name="small lr")
        epoch_ends = [e.t for e in ledger.events(run_id, "epoch_end")]
        ledger.append(run_id, metrics=[Metric(t, "lr/pg1", 0.0002 * e, e) for e, t in enumerate(epoch_ends, 1)])
    out = tmp_path / "report.html"
    assert CliRunner().invoke(cli, ["report", "run", run.id, "-o", str(out), "--db", db]).exit_code == 0
    registry, problems = _open(browser, out, "report-run-small-values.png")
    assert problems == [] and registry["errors"] == []
    lr = next(c for c in registry["charts"] if c["id"] == "lr")
    ticks = lr["ticks"][""]
    assert len(ticks) >= 3 and len(set(ticks)) == len(ticks), ticks  # was "0 0 0 0.01 0.01"
    assert any(t not in ("0", "0.0", "0.00") and float(t) < 0.005 for t in ticks), ticks
