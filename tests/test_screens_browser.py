"""What a manager reads, in Debian's Chromium at a laptop's 1280 px and a desktop's 1920 px: the
dashboard's overview and run page (a real uvicorn server), and the chargeback and capacity HTML
(made by the real CLI), all from one ledger (tests/screens_support.py).

On every screen: no table wider than its box (scrollWidth <= clientWidth: a clipped Share column or
a table running off the page fails), no number shown as 0.00 where the data is not zero (figures
compared with the JSON API or the report's JSON twin, formatted by core/units.py), names broken
between words only. Screenshots stay in the test's temporary folder.
"""

from __future__ import annotations

import json
import os
import re
from decimal import Decimal
from pathlib import Path

import pytest
from click.testing import CliRunner

import capacity_sim
import screens_support as ss
from browser_support import ARGS, CHROMIUM, need_browser
from dashboard_support import uvicorn_server, wait_js
from gpuledger.cli.main import cli
from gpuledger.core.ids import short_id
from gpuledger.core.units import fmt_kwh, fmt_money, fmt_number, fmt_pct, fmt_seconds
from gpuledger.store import Ledger, accounts

pytestmark = pytest.mark.slow
WIDTHS = (1280, 1920)

# Tables (not uPlot's legend) whose box is narrower than they are; and the page itself.
OVERFLOW_JS = """() => {
  const out = [];
  for (const t of document.querySelectorAll('table')) {
    if (t.closest('.u-legend')) continue;
    const box = t.parentElement;
    const name = box.id || box.className || box.tagName;
    if (box.scrollWidth > box.clientWidth) out.push([name, box.scrollWidth, box.clientWidth]);
  }
  const root = document.documentElement;
  if (root.scrollWidth > root.clientWidth) out.push(['page', root.scrollWidth, root.clientWidth]);
  return out;
}"""
# Text that reads as zero with decimals ("0.00", "0.0 s", "0.00 USD"), outside scripts and tooltips.
ZEROS_JS = """(skip) => {
  const out = [], w = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  let n;
  while ((n = w.nextNode())) {
    const p = n.parentElement;
    if (!p || p.closest('script,style,title') || (skip && p.closest(skip))) continue;
    if (/(^|[^\\d.,])-?0\\.0+(?!\\d)/.test(n.textContent)) out.push(n.textContent.trim());
  }
  return out;
}"""
# Cells of name columns whose text wraps somewhere else than between words ("platfo|rm").
BROKEN_JS = """(sel) => {
  const out = [];
  for (const td of document.querySelectorAll(sel)) {
    const text = td.textContent.trim();
    if (!text) continue;
    const range = document.createRange();
    range.selectNodeContents(td);
    const lines = new Set(Array.from(range.getClientRects()).map(r => Math.round(r.top))).size;
    if (lines > text.split(/\\s+/).length) out.push([text, lines]);
  }
  return out;
}"""
ROWS_JS = """(sel) => Array.from(document.querySelectorAll(sel + ' tbody tr')).map(
  tr => Array.from(tr.children).map(td => td.textContent.trim()))"""


@pytest.fixture(scope="module")
def screens(tmp_path_factory: pytest.TempPathFactory):
    sync_playwright = need_browser()
    root = tmp_path_factory.mktemp("screens")
    db = f"sqlite:///{root}/ledger.db"
    ss.seed(db)
    with Ledger(db) as ledger:
        _, admin = accounts.issue_token(ledger, "admin", role="admin", actor="test", create_user=True)
    rates = ss.rates_file(root)
    pools = root / "pools.toml"
    pools.write_text(capacity_sim.POOLS_TEXT)
    pages = {}
    for name, args in (
        ("chargeback", ["report", "chargeback", "--by", "team", "--rates", str(rates)]),
        ("capacity", ["report", "capacity", "--rates", str(rates), "--pools", str(pools)]),
        ("run", ["report", "run", ss.TINY_RUN]),
    ):
        out = root / f"{name}.html"
        month = [] if name == "run" else ["--month", ss.MONTH, "--format", "html"]
        cmd = [*args, *month, "--db", db, "-o", str(out)]
        result = CliRunner().invoke(cli, cmd)
        assert result.exit_code == 0, result.output
        pages[name] = out
    old = os.environ.get("GPULEDGER_RATES")
    os.environ["GPULEDGER_RATES"] = str(rates)  # the server prices with the same card
    try:
        with uvicorn_server(db, root / "server.log") as base, sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            yield {"base": base, "token": admin, "browser": browser, "pages": pages}
            browser.close()
    finally:
        if old is None:
            os.environ.pop("GPULEDGER_RATES", None)
        else:
            os.environ["GPULEDGER_RATES"] = old


def _page(screens, width: int, problems: list[str]):
    page = screens["browser"].new_page(viewport={"width": width, "height": 1000})
    page.on("console", lambda m: problems.append(f"{m.type}: {m.text}") if m.type in ("error", "warning") else None)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    return page


def _dashboard(screens, width: int, problems: list[str]):
    page = _page(screens, width, problems)
    page.goto(screens["base"] + "/dashboard/login")
    page.evaluate("t => sessionStorage.setItem('gpuledger.token', t)", screens["token"])
    return page


def _shot(page, tmp_path: Path, name: str) -> None:
    page.screenshot(path=str(tmp_path / name), full_page=True)


def _the_same_on_screen(page, tmp_path: Path, name: str, names: str) -> None:
    _shot(page, tmp_path, name)
    assert page.evaluate(OVERFLOW_JS) == [], f"{name}: a table is wider than its box"
    assert page.evaluate(BROKEN_JS, names) == [], f"{name}: a name broken mid-word"


@pytest.mark.parametrize("width", WIDTHS)
def test_overview_fits_and_shows_the_clis_numbers(screens, tmp_path: Path, width: int) -> None:
    problems: list[str] = []
    page = _dashboard(screens, width, problems)
    page.goto(f"{screens['base']}/dashboard/?month={ss.MONTH}")
    wait_js(page, "window.gpuledgerOverview && window.gpuledgerOverview.loads > 0", timeout=60, what="the overview")
    _the_same_on_screen(page, tmp_path, f"overview-{width}.png", "td.name")
    assert page.evaluate(ZEROS_JS, None) == []
    assert problems == [] and page.evaluate("GL.errors") == []

    # Cost by team: every cell as the CLI formats the JSON API's figures.
    team = page.evaluate("window.gpuledgerOverview.reports.team")
    cur = team["currency"]
    expected = [
        [
            "TOTAL" if g is team["total"] else g["team"] or "(none)",
            str(g["runs"]),
            fmt_number(g["busy_gpu_h"]),
            fmt_number(g["idle_gpu_h"]),
            fmt_pct(g["mean_utilization"]),
            fmt_kwh(g["energy_kwh"]),
            fmt_money(g["cost"], cur),
            fmt_money(g["idle_cost"], cur),
            fmt_pct(g["share"]),
        ]
        for g in [*team["groups"], team["total"]]
    ]
    assert page.evaluate(ROWS_JS, "#cost-team") == expected
    tiny = next(r for r in expected if r[0] == ss.TINY_TEAM)
    assert tiny[6] == tiny[7] == "<0.01 USD" and tiny[2] == "0.000833"  # 10 s at 30 %: digits, not 0.00

    # TOP lists by cost and by idle cost; an unnamed run is named by the CLI's short id.
    for box in ("#top-runs-cost", "#top-runs-idle", "#top-users-cost", "#top-users-idle"):
        assert page.locator(f"{box} tbody tr").count() > 0, box
    first = team["top_runs_by_cost"][0]
    assert page.locator("#top-runs-cost tbody tr").first.locator("td").nth(1).inner_text() == (
        first["name"] or short_id(first["run_id"])
    )
    unnamed = page.locator(f"#top a[title='{ss.UNNAMED}']")
    assert unnamed.count() >= 1 and unnamed.first.inner_text() == short_id(ss.UNNAMED)

    # Charts: a bar per month of the trend, the weeks of the month to date; anomalies with causes.
    charts = page.evaluate("window.gpuledgerOverviewCharts")
    assert charts["errors"] == []
    assert charts["charts"]["month"]["xticks"] == team["trend_months"]
    assert set(charts["charts"]["month"]["series"]) >= {"vision", ss.TINY_TEAM, ss.LONG_TEAM}
    weeks = charts["charts"]["week"]["xticks"]
    assert weeks[-1] == "W14 (to date)" and "W13" in weeks  # March 30th and 31st are in week 14
    anomalies = page.inner_text("#anomalies")
    assert "yolov5m" in anomalies and "batch changed 64 → 16" in anomalies and "likely cause" in anomalies
    page.close()


@pytest.mark.parametrize("width", WIDTHS)
def test_run_page_fits_and_its_charts_do_not_overlap(screens, tmp_path: Path, width: int) -> None:
    problems: list[str] = []
    page = _dashboard(screens, width, problems)
    for run_id, short in ((ss.UNNAMED, "long"), (ss.TINY_RUN, "short")):
        page.goto(f"{screens['base']}/dashboard/runs/{run_id}")
        wait_js(page, "window.gpuledgerRun && window.gpuledgerRun.done && window.gpuledgerCharts.ready", timeout=60)
        _the_same_on_screen(page, tmp_path, f"run-{short}-{width}.png", "td.name")
        assert page.evaluate(ZEROS_JS, None) == []
        assert short_id(run_id) in page.inner_text("#run-title")
        summary = page.evaluate("p => GL.get(p)", f"/runs/{run_id}")
        cards = page.evaluate(
            "() => Object.fromEntries(Array.from(document.querySelectorAll('.card')).map("
            "c => [c.querySelector('.label').textContent, c.querySelector('.value').textContent]))"
        )
        assert cards["CPU"] == fmt_seconds(summary["cpu_seconds"]) and cards["Energy"] == fmt_kwh(summary["energy_kwh"])
        assert cards["Busy GPU-hours"] == fmt_number(summary["busy_gpu_hours"])
        # Each chart inside its box, no two boxes over each other.
        boxes = page.evaluate(
            "() => Array.from(document.querySelectorAll('.chart')).map(b => {"
            " const r = b.getBoundingClientRect(), u = b.querySelector('.uplot').getBoundingClientRect();"
            " return [r.left, r.top, r.right, r.bottom, u.right <= r.right + 0.5]; })"
        )
        assert boxes and all(b[4] for b in boxes), boxes
        for i, a in enumerate(boxes):
            for b in boxes[i + 1 :]:
                assert a[2] <= b[0] or b[2] <= a[0] or a[3] <= b[1] or b[3] <= a[1], (a, b)
        # Time ticks: whole seconds at most, never milliseconds, never twice the same label.
        ticks = page.evaluate("window.gpuledgerCharts.xticks")
        assert set(ticks) == {c["id"] for c in page.evaluate("window.gpuledgerCharts.charts")}  # every chart
        for chart, labels in ticks.items():
            assert labels and len(set(labels)) == len(labels), (chart, labels)
            assert all(re.fullmatch(r"\d\d:\d\d(:\d\d)?(\n\d{4}-\d\d-\d\d)?", t) for t in labels), (chart, labels)
    assert problems == []
    page.close()


def _report(screens, name: str, width: int, problems: list[str]):
    page = _page(screens, width, problems)
    page.goto(screens["pages"][name].as_uri())
    twin_id = "chargeback-data" if name == "chargeback" else "capacity-data"
    return page, json.loads(page.locator(f"#{twin_id}").text_content())


@pytest.mark.parametrize("width", WIDTHS)
def test_chargeback_html_fits_and_its_figures_are_its_jsons(screens, tmp_path: Path, width: int) -> None:
    problems: list[str] = []
    page, twin = _report(screens, "chargeback", width, problems)
    _the_same_on_screen(page, tmp_path, f"chargeback-{width}.png", "td.name")
    cur = twin["currency"]
    groups = page.evaluate(ROWS_JS, "#groups")
    expected = [
        [
            "TOTAL" if g is twin["total"] else g["team"] or "(none)",
            str(g["runs"]),
            fmt_number(g["allocated_gpu_h"]),
            fmt_number(g["busy_gpu_h"]),
            fmt_number(g["idle_gpu_h"]),
            fmt_pct(g["mean_utilization"]),
            fmt_number(g["a100eq_h"]),
            fmt_number(g["energy_kwh"]),
            fmt_money(g["cost"]),
            fmt_money(g["idle_cost"]),
            fmt_money(g["cost_per_a100eq_h"]),
            fmt_pct(g["share"]),
        ]
        for g in [*twin["groups"], twin["total"]]
    ]
    assert groups == expected  # and so "TOTAL", never "TOTAL n/a"
    # Bar labels: the cost of each group in cents, as the table says (<0.01, never 0.00).
    labels = page.evaluate(
        "() => Array.from(document.querySelectorAll('svg')).map(s => [s.getAttribute('aria-label'),"
        " Array.from(s.querySelectorAll('text.value')).map(t => t.textContent)])"
    )
    by_title = dict(labels)
    ranked = sorted(twin["groups"], key=lambda g: -Decimal(g["cost"]))
    assert by_title[f"Cost by team ({cur})"] == [fmt_money(g["cost"]) for g in ranked]
    # Cost per month: one bar per month, labelled with the month's total, across the plot.
    totals = {r["month"]: r["cost"] for r in twin["trend"] if r["team"] == "TOTAL"}
    assert by_title[f"Cost per month ({cur})"] == [fmt_money(totals.get(m, 0)) for m in twin["trend_months"]]
    bars = page.evaluate(
        "t => { const s = document.querySelector(`svg[aria-label='${t}']`), b = s.getBoundingClientRect();"
        " const keys = Array.from(s.querySelectorAll('rect')).filter(r => r.getAttribute('height') === '10');"
        " const plot = Array.from(s.querySelectorAll('rect')).filter(r => r.getAttribute('height') !== '10');"
        " return {width: b.width, xs: plot.map(r => r.getBoundingClientRect().left - b.left),"
        " keyTop: Math.min(...keys.map(r => r.getBoundingClientRect().top)),"
        " plotBottom: Math.max(...plot.map(r => r.getBoundingClientRect().bottom))}; }",
        f"Cost per month ({cur})",
    )
    assert min(bars["xs"]) < bars["width"] * 0.5  # bars spread over the plot, not dots at its right edge
    assert bars["keyTop"] > bars["plotBottom"]  # the legend below the plot, not inside it
    # The weekly value for money reaches the month's end; counts are "1 run", not "1 runs".
    value = json.loads(page.locator("#value-trends-data").text_content())
    assert value["weeks"][-1] == "2026-W14" and value["last_week_to"].startswith("2026-04-01")
    assert not re.search(r"\b1 runs\b", page.inner_text("body"))
    # Zeros: only where the report's JSON says zero, or has no row: the group used nothing that month.
    costs = {(r["team"], r["month"]): Decimal(r["cost"]) for r in twin["trend"]}
    assert len(page.evaluate(ZEROS_JS, "#trend, svg")) == 0
    pivot = page.evaluate(ROWS_JS, "#trend")
    for row in pivot:
        for month, cell in zip(twin["trend_months"], row[1:], strict=True):
            if re.fullmatch(r"-?0\.0+", cell):
                assert costs.get((row[0], month), Decimal(0)) == 0, (row, month)
    assert problems == []
    page.close()


@pytest.mark.parametrize("width", WIDTHS)
def test_capacity_html_fits_and_its_figures_are_its_jsons(screens, tmp_path: Path, width: int) -> None:
    problems: list[str] = []
    page, twin = _report(screens, "capacity", width, problems)
    _the_same_on_screen(page, tmp_path, f"capacity-{width}.png", "td.name")
    groups = sorted(twin["groups"], key=lambda r: -float(r["fleet_gpu_h"]))
    svg = page.evaluate(
        "() => { const s = document.querySelector('svg'), b = s.getBoundingClientRect();"
        " return {ends: Array.from(s.querySelectorAll('text.value')).map(t => t.textContent),"
        " keys: Array.from(s.querySelectorAll('text')).filter(t => t.getBoundingClientRect().top >"
        "  Math.max(...Array.from(s.querySelectorAll('text.value')).map(v => v.getBoundingClientRect().bottom)))"
        "  .map(t => [t.textContent, t.getBoundingClientRect().right <= b.right + 0.5])}; }"
    )
    # Each bar ends with its fleet GPU-hours, three digits (no stray "0"); the legend whole.
    assert svg["ends"] == [fmt_number(float(g["fleet_gpu_h"])) for g in groups[:20]]
    assert [k for k, _ in svg["keys"]] == [
        "busy, owner found",
        "busy, no owner",
        "allocated, idle",
        "unallocated",
        "unobserved",
    ]
    assert all(inside for _, inside in svg["keys"]), svg["keys"]
    # The money table: cents as fmt_money says, so a 0.00 is a zero of the JSON.
    money = page.evaluate(ROWS_JS, "#money")
    columns = ["asset_cost", "unallocated_cost", "alloc_idle_cost", "busy_attributed_cost"]
    for row, g in zip(money, [*twin["groups"], twin["total"]], strict=True):
        assert row[1 : 1 + len(columns)] == [fmt_money(g[c]) for c in columns], row
    hours = page.evaluate(ROWS_JS, "#hours")
    assert [r[2] for r in hours] == [fmt_number(float(g["fleet_gpu_h"])) for g in [*twin["groups"], twin["total"]]]
    assert hours[-1][0] == "TOTAL"
    assert problems == []
    page.close()


@pytest.mark.parametrize("width", WIDTHS)
def test_run_report_of_ten_seconds_has_a_time_axis_in_seconds(screens, tmp_path: Path, width: int) -> None:
    problems: list[str] = []
    page = _page(screens, width, problems)
    page.goto(screens["pages"]["run"].as_uri())
    page.wait_for_function("window.gpuledgerCharts && window.gpuledgerCharts.ready", timeout=15000)
    _the_same_on_screen(page, tmp_path, f"report-run-{width}.png", "td.name")
    charts = page.evaluate("window.gpuledgerCharts.charts")
    timed = [c for c in charts if c["id"] in ("gpu_util", "vram", "power", "cpu")]
    assert timed
    for chart in timed:
        labels = chart["ticks"].get("x")
        assert labels and len(set(labels)) == len(labels), chart
        assert all(re.fullmatch(r"\d\d:\d\d:\d\d(\n\d{4}-\d\d-\d\d)?", t) for t in labels), labels
    assert problems == []
    page.close()
