"""The chargeback HTML's value sections in a real headless Chromium (Debian's, driven by Playwright):
the weekly trend charts, the TOP lists and the anomaly with its cause are on the page, and the page
fetches nothing. The page is made by the real CLI from simulated weeks in a SQLite ledger."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from browser_support import ARGS, ARTIFACTS, CHROMIUM, need_browser
from gpuledger.cli.main import cli
from gpuledger.store import Ledger
from value_sim import CARD_TEXT, simulate, write


@pytest.fixture(scope="module")
def page_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("value-html")
    db = f"sqlite:///{root}/ledger.db"
    with Ledger(db) as ledger:
        write(ledger, simulate())
    rates = root / "rates.toml"
    rates.write_text(f'[card]\ncurrency = "USD"\nbasis = "allocated"\n{CARD_TEXT}')
    out = root / "march.html"
    args = ["report", "chargeback", "--month", "2026-03", "--format", "html", "--rates", str(rates), "--db", db]
    result = CliRunner().invoke(cli, [*args, "-o", str(out)])
    assert result.exit_code == 0, result.output
    return out


def test_the_page_carries_the_value_sections_and_their_json_twin(page_file: Path) -> None:
    page = page_file.read_text()
    assert not re.search(r"""(src|href)=["']?https?:""", page)
    twin = json.loads(re.search(r'id="value-trends-data">(.*?)</script>', page, re.S).group(1))
    # The weeks reach the end of March: 2026-W14 holds March 30th and 31st, counted to April 1st.
    assert twin["weeks"][-2:] == ["2026-W13", "2026-W14"] and twin["by"] == "model_version"
    assert twin["last_week_to"] == "2026-04-01T00:00:00.000Z"
    first = twin["anomalies"][0]
    assert (first["model_version"], first["metric"]) == ("yolov5m", "cost_per_map_point")
    assert "batch changed 64 → 16" in first["message"] and first["causes"][0]["kind"] == "setting_changed"
    assert twin["top_by_cost"][0]["model_version"] == "yolov5m"


def test_chromium_shows_trend_top_lists_and_the_anomaly_offline(page_file: Path) -> None:
    sync_playwright = need_browser()
    problems: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.on("console", lambda m: problems.append(f"{m.type}: {m.text}") if m.type in ("error", "warning") else None)
        page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
        page.on("request", lambda r: None if r.url.startswith(("file:", "data:")) else problems.append(r.url))
        page.goto(page_file.as_uri())
        for section in ("#value-trend", "#value-top", "#value-anomalies"):
            assert page.locator(section).is_visible(), section
        # Three weekly line charts (cost, cost per mAP point, per epoch), one line per model version.
        charts = page.locator("#value-trend ~ .charts").first.locator("svg")
        assert charts.count() == 3
        labels = [charts.nth(i).get_attribute("aria-label") for i in range(3)]
        assert labels == [
            "Cost per week by model_version (USD)",
            "Cost per mAP point by model_version (USD)",
            "Cost per epoch by model_version (USD)",
        ]
        assert charts.nth(1).locator("polyline").count() == 2
        # TOP lists: the dearest model version first.
        top = page.locator("table.top-by-cost tbody tr")
        assert top.count() == 2 and top.first.locator("td").nth(1).inner_text() == "yolov5m"
        worst = page.locator("table.top-by-cost-per-map-point tbody tr").first.locator("td").nth(1).inner_text()
        assert worst == "yolov5m"
        # The anomaly, with its cause, as a manager reads it.
        first = page.locator("li.anomaly").first.inner_text()
        assert first.startswith("cost per mAP point of yolov5m runs rose 75 % last week (2026-W13)")
        assert "utilisation fell from 81 % to 45 % after batch changed 64 → 16" in first
        assert "input-pipeline bound in 4 of 4 runs (0 of 16 before)" in first
        assert page.locator("table.anomaly-table tbody tr").count() == 3
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "chargeback-value-trends.png"), full_page=True)
        browser.close()
    assert problems == []
