"""``gpuledger cost`` and ``gpuledger report chargeback | rollup`` end to end through click."""

from __future__ import annotations

import csv
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuledger.cli.cost_cmds import cost_cmd, report_group
from gpuledger.core.chargeback.columns import COLUMNS
from gpuledger.store import Ledger
from test_cost_ledger import scenario

RATES = """[card]
currency = "USD"
basis = "busy"

[[gpu]]
model = "A100-40GB-SXM"
price_per_hour = "2.50"

[[gpu]]
model = "A100-80GB-SXM"
price_per_hour = "3.43"
"""


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("cli")
    db = root / "ledger.db"
    with Ledger(db) as led:
        scenario(led)
    rates = root / "rates.toml"
    rates.write_text(RATES)
    return {"db": str(db), "rates": str(rates), "root": str(root)}


def _run(command, args: list[str]):  # type: ignore[no-untyped-def]
    result = CliRunner().invoke(command, args, catch_exceptions=False)
    return result


def test_cost_of_one_run_as_table_json_and_csv(env: dict[str, str]) -> None:
    base = ["--db", env["db"], "--rates", env["rates"]]
    table = _run(cost_cmd, ["solo", *base])
    assert table.exit_code == 0, table.output
    assert "11.70" in table.output and "A100-40GB-SXM" in table.output
    data = json.loads(_run(cost_cmd, ["solo", "--format", "json", *base]).output)
    assert data["runs"][0]["total"]["cost"] == "11.70" and data["total"]["cost"] == "11.70"
    rows = list(csv.reader(io.StringIO(_run(cost_cmd, ["solo", "att2", "--format", "csv", *base]).output)))
    assert rows[0] == [c.name for c in COLUMNS["cost"]]
    assert rows[-1][0] == "TOTAL" and any(r[0] == "att1" for r in rows)  # the logical run's row
    allocated = json.loads(_run(cost_cmd, ["solo", "--format", "json", "--basis", "allocated", *base]).output)
    assert allocated["total"]["cost"] == "15.00"


def test_cost_by_prefix_instance_override_and_default_run(env: dict[str, str]) -> None:
    out = _run(cost_cmd, ["--db", env["db"], "--format", "json"])  # newest run, example card
    assert json.loads(out.output)["runs"][0]["run_id"] == "cross"
    out = _run(cost_cmd, ["sol", "--db", env["db"]])
    assert out.exit_code == 1 and "at least 4 characters" in out.output
    out = _run(cost_cmd, ["solo", "--db", env["db"], "--instance-type", "p4d.24xlarge", "--format", "json"])
    assert json.loads(out.output)["runs"][0]["total"]["instance_type"] == "p4d.24xlarge"
    out = _run(cost_cmd, ["shared-b", "--db", env["db"], "--project", "llm"])
    assert out.exit_code == 1 and "shared-b" in out.output


def test_cost_of_a_project_with_no_run_names_the_project(env: dict[str, str]) -> None:
    """The ledger has runs, none of this project: not "no runs yet"."""
    out = _run(cost_cmd, ["--db", env["db"], "--project", "no-such-project"])
    assert out.exit_code == 1
    assert "no run of project no-such-project" in out.output and "no runs yet" not in out.output


def test_chargeback_formats(env: dict[str, str]) -> None:
    base = ["chargeback", "--month", "2026-03", "--db", env["db"], "--rates", env["rates"]]
    table = _run(report_group, [*base, "--by", "team,user"])
    assert table.exit_code == 0, table.output
    assert "TOTAL" in table.output and "Top runs by cost" in table.output and "Cost by month" in table.output
    data = json.loads(_run(report_group, [*base, "--format", "json"]).output)
    assert data["currency"] == "USD" and data["by"] == ["team"] and data["scope"] is None
    assert {g["team"] for g in data["groups"]} == {"vision", "nlp", "ops"}
    for section, key in (
        ("groups", "groups"),
        ("runs", "runs"),
        ("users", "users"),
        ("trend", "trend"),
        ("anomalies", "anomalies"),
    ):
        text = _run(report_group, [*base, "--format", "csv", "--section", section]).output
        header = next(csv.reader(io.StringIO(text)))
        lead = ["team"] if section in ("groups", "trend", "anomalies") else []
        assert header == lead + [c.name for c in COLUMNS[key]], section
    md = _run(report_group, [*base, "--format", "md"]).output
    assert md.startswith("# Chargeback") and "| TOTAL |" in md


def _top_runs_shown(table: str) -> int:
    """Rows of the table's "Top runs by cost" section."""
    section = table.split("Top runs by cost\n", 1)[1].split("\n\n", 1)[0]
    return sum(1 for line in section.splitlines() if re.match(r"\s*\d+\s", line))


def test_chargeback_table_shows_as_many_top_runs_as_top_asks(env: dict[str, str]) -> None:
    base = ["chargeback", "--month", "2026-03", "--db", env["db"], "--rates", env["rates"]]
    ranked = len(json.loads(_run(report_group, [*base, "--format", "json"]).output)["top_runs_by_cost"])
    assert ranked > 5  # the scenario has more runs than the table's default shows
    assert _top_runs_shown(_run(report_group, base).output) == 5  # one screen by default
    # An explicit --top is honoured, above 5 too (it was silently capped at 5).
    assert _top_runs_shown(_run(report_group, [*base, "--top", str(ranked)]).output) == ranked
    assert _top_runs_shown(_run(report_group, [*base, "--top", "2"]).output) == 2


def test_chargeback_html_is_one_offline_file_with_charts(env: dict[str, str]) -> None:
    out = Path(env["root"]) / "march.html"
    result = _run(
        report_group,
        [
            "chargeback",
            "--month",
            "2026-03",
            "--db",
            env["db"],
            "--rates",
            env["rates"],
            "--format",
            "html",
            "-o",
            str(out),
        ],
    )
    assert result.exit_code == 0
    page = out.read_text()
    assert page.count("<svg") == 3 and 'aria-label="Cost per month' in page  # by group, busy/idle hours, per month
    assert not re.search(r"""(src|href)=["']?https?:""", page)  # nothing fetched from the network
    embedded = re.search(r'<script type="application/json" id="chargeback-data">(.*?)</script>', page, re.S)
    assert embedded and json.loads(embedded.group(1))["total"]["team"] == "TOTAL"


def test_bad_input_gets_clear_errors(env: dict[str, str], tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[card]\ncurrency = "USD"\nbasis = "busy"\n[[gpu]]\nmodel = "A100"\nprice_per_hour = "x"\n')
    out = _run(report_group, ["chargeback", "--month", "2026-03", "--db", env["db"], "--rates", str(bad)])
    assert out.exit_code == 1
    assert f"{bad}:5: [[gpu]] #1 model: 'A100' is not a GPU model key" in out.output
    assert f"{bad}:6: [[gpu]] #1 price_per_hour" in out.output
    out = _run(report_group, ["chargeback", "--month", "2026-13", "--db", env["db"]])
    assert out.exit_code == 2 and "YYYY-MM" in out.output
    out = _run(report_group, ["chargeback", "--by", "team,colour", "--db", env["db"]])
    assert out.exit_code == 2 and "--by" in out.output
    out = _run(report_group, ["chargeback", "--month", "2026-03", "--from", "2026-03-01", "--db", env["db"]])
    assert out.exit_code == 2 and "not both" in out.output


def test_rollup_command(tmp_path: Path) -> None:
    db = tmp_path / "l.db"
    with Ledger(db) as led:
        scenario(led)
    out = _run(report_group, ["rollup", "--db", str(db)])
    assert out.exit_code == 0 and "rolled up 8 runs" in out.output
    assert "rolled up 0 runs" in _run(report_group, ["rollup", "--db", str(db)]).output


def test_cost_table_says_n_a_for_what_was_not_measured(tmp_path: Path) -> None:
    """A run without GPUs has no utilisation: the table says n/a (README's number policy), not a dash or 0."""
    db = f"sqlite:///{tmp_path / 'ledger.db'}"
    cmd = [sys.executable, "-m", "gpuledger", "run", "--db", db, "--no-gpu", "-q", "--", sys.executable, "-c", "pass"]
    subprocess.run(cmd, check=True, capture_output=True)
    out = _run(cost_cmd, ["--db", db])
    assert out.exit_code == 0, out.output
    run_line = next(line for line in out.output.splitlines() if line.strip()[:8].isalnum() and "RUN_ID" not in line)
    header = next(line for line in out.output.splitlines() if "RUN_ID" in line)
    end = header.index("UTIL") + len("UTIL")  # numbers are right-aligned under their header
    assert run_line[:end].split()[-1] == "n/a", out.output
    assert "—" not in out.output


def test_cost_by_month_gives_a_group_0_for_a_month_it_used_nothing(env: dict[str, str]) -> None:
    """The trend's months before a team's first run cost it nothing: 0.00, as TOTAL says, not n/a
    (not known), in the table, the Markdown and the HTML alike."""
    base = ["chargeback", "--month", "2026-03", "--db", env["db"], "--rates", env["rates"], "--by", "team"]
    data = json.loads(_run(report_group, [*base, "--format", "json"]).output)
    used = {(r["team"], r["month"]) for r in data["trend"] if r["team"] != "TOTAL"}
    months = sorted({r["month"] for r in data["trend"]})
    assert len(months) == 4 and any((t, m) not in used for t in ("vision", "nlp", "ops") for m in months)
    for fmt in ("table", "md", "html"):
        out = _run(report_group, [*base, "--format", fmt]).output
        section = out[out.index("Cost by month") :]
        section = section[: section.index("Anomalies")] if "Anomalies" in section else section
        assert "n/a" not in section and "0.00" in section, (fmt, section)
