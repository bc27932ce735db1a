"""The run report's Content-Security-Policy: it names exactly the inlined scripts and style sheets
by their sha256, allows nothing else, and a real Chromium refuses a script slipped into the file
while the report's own charts still draw."""

from __future__ import annotations

import base64
import hashlib
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from browser_support import ARGS, CHROMIUM, need_browser
from gpuledger.cli.main import cli
from gpuledger.store import Ledger
from report_support import write_run

RUN = "01900000-0000-7000-8000-00000000c5b0"


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> str:
    tmp = tmp_path_factory.mktemp("csp")
    db = f"sqlite:///{tmp}/ledger.db"
    with Ledger(db) as ledger:
        write_run(ledger, RUN)
    out = tmp / "r.html"
    result = CliRunner().invoke(cli, ["report", "run", RUN, "-o", str(out), "--db", db])
    assert result.exit_code == 0, result.output
    return out.read_text(encoding="utf-8")


def _sha(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


def test_the_policy_names_exactly_the_inline_code(report: str) -> None:
    head = report[: report.index("</head>")]
    meta = re.search(r'<meta http-equiv="Content-Security-Policy" content="([^"]+)">', head)
    assert meta is not None
    assert head.index(meta.group(0)) < head.index("<style>")  # before anything it governs
    policy = dict(part.strip().split(" ", 1) for part in meta.group(1).replace("&#39;", "'").split(";"))
    assert policy["default-src"] == "'none'" and policy["base-uri"] == "'none'" and policy["form-action"] == "'none'"
    scripts = re.findall(r"<script>(.*?)</script>", report, re.S)  # the executable ones (not the JSON block)
    styles = re.findall(r"<style>(.*?)</style>", report, re.S)
    assert len(scripts) == 2 and len(styles) == 2
    assert policy["script-src"].split() == [_sha(s) for s in scripts]
    assert policy["style-src"].split() == [_sha(s) for s in styles]
    assert "unsafe" not in meta.group(1) and "http" not in meta.group(1)


def test_chromium_runs_the_report_and_refuses_anything_else(report: str, tmp_path: Path) -> None:
    sync_playwright = need_browser()
    injected = report.replace("</main>", "<script>document.title = 'pwned';</script></main>", 1)
    path = tmp_path / "injected.html"
    path.write_text(injected, encoding="utf-8")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page()
            console: list[str] = []
            page.on("console", lambda m: console.append(m.text))
            page.goto(path.as_uri())
            page.wait_for_function("window.gpuledgerCharts && window.gpuledgerCharts.ready", timeout=15000)
            assert page.title() != "pwned"  # the slipped-in script did not run ...
            assert any("Content Security Policy" in line for line in console), console  # ... the policy refused it
            assert page.evaluate("document.querySelectorAll('.chart canvas').length") > 0  # the report's own did
        finally:
            browser.close()
