"""The FinOps Foundation's FOCUS validator (focus-validator 1.0.0, pinned in requirements-focus.txt)
run on gpuledger's FOCUS files of a simulated month, as its own command, against FOCUS 1.0: the
export's 1.0 rows, and the files ``gpuledger report chargeback|capacity --format focus
--focus-version 1.0`` writes (1.3 is the CLI's default; the validator knows no version after 1.0).

It lives in a virtualenv of its own (it needs numpy < 2, which the project's pyarrow refuses):
build/focus-validator, or the ``focus-validator`` executable named by GPULEDGER_FOCUS_VALIDATOR.
Without it these tests are skipped, and fail instead when GPULEDGER_REQUIRE_FOCUS_VALIDATOR=1 (CI).

How it is run, and why: from the folder holding its package, because it opens its list of
currency codes by a path relative to the working directory ("focus_validator/utils/..."); with
its JUnit XML output, whose test cases say which checks passed, failed, errored or were skipped;
with tests/data/focus_validator_overrides.yaml, which skips the five checks that test pre-1.0
column names (each is checked from the 1.0 text by tests/focus_spec_rules.py instead).
"""

from __future__ import annotations

import csv
import io
import os
import subprocess
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from capacity_sim import CARD as FLEET_CARD
from capacity_sim import CARD_TEXT as FLEET_CARD_TEXT
from capacity_sim import POOLS_TEXT, load
from cost_sim import CARD, CARD_TEXT, MONTH
from cost_support import ts
from focus_support import month_ledger
from gpuledger.cli.capacity_cmds import capacity_cmd
from gpuledger.cli.cost_cmds import report_group
from gpuledger.core.capacity.pools import Pools, parse_pools
from gpuledger.core.chargeback.focus_columns import COLUMNS, FOCUS_VERSION
from gpuledger.reports.capacity.focus import capacity_focus
from gpuledger.reports.capacity.report import add_shared_idle, fleet_cost
from gpuledger.reports.cost.costing import chargeback
from gpuledger.reports.cost.focus import add_shared_idle_rows, chargeback_focus, default_identity
from gpuledger.reports.cost.focus_render import focus_csv, write_focus_parquet
from gpuledger.store import Ledger

ROOT = Path(__file__).resolve().parents[1]
OVERRIDES = ROOT / "tests" / "data" / "focus_validator_overrides.yaml"
INSTALL = "python -m venv build/focus-validator && build/focus-validator/bin/pip install -r requirements-focus.txt"


def _validator() -> Path:
    path = Path(
        os.environ.get("GPULEDGER_FOCUS_VALIDATOR") or ROOT / "build" / "focus-validator" / "bin" / "focus-validator"
    )
    if path.is_file() and os.access(path, os.X_OK):
        return path
    why = f"the FinOps Foundation's FOCUS validator is not at {path}; install it: {INSTALL}"
    if os.environ.get("GPULEDGER_REQUIRE_FOCUS_VALIDATOR") == "1":
        pytest.fail(why)
    pytest.skip(why)


@dataclass
class Verdict:
    """The validator's result per check: check name -> its message, by outcome."""

    passed: set[str] = field(default_factory=set)
    failed: dict[str, str] = field(default_factory=dict)
    errored: dict[str, str] = field(default_factory=dict)
    skipped: set[str] = field(default_factory=set)
    console: str = ""


@pytest.fixture(scope="module")
def validate():  # type: ignore[no-untyped-def]
    executable = _validator()
    python = executable.parent / "python"
    locate = "import focus_validator, os; print(os.path.dirname(os.path.dirname(focus_validator.__file__)))"
    where = subprocess.run(
        [str(python), "-c", locate], check=True, capture_output=True, text=True, timeout=120
    ).stdout.strip()
    versions = subprocess.run(
        [str(executable), "--supported-versions"], cwd=where, check=True, capture_output=True, text=True, timeout=120
    ).stdout.split()
    assert FOCUS_VERSION in versions

    def run(data: Path, tmp: Path) -> Verdict:
        report = tmp / f"{data.name}.xml"
        args = [str(executable), "--data-file", str(data), "--validate-version", FOCUS_VERSION]
        args += ["--override-file", str(OVERRIDES), "--output-type", "unittest", "--output-destination", str(report)]
        done = subprocess.run(args, cwd=where, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0 and report.is_file(), done.stdout + done.stderr
        verdict = _parse(report)
        if verdict.failed or verdict.errored:  # the console report names the rows and values
            console = subprocess.run(args[:-4], cwd=where, capture_output=True, text=True, timeout=300)
            verdict.console = console.stdout + console.stderr
        return verdict

    return run


def _parse(report: Path) -> Verdict:
    verdict = Verdict()
    for case in ET.parse(report).getroot().iter("testcase"):
        check = case.get("name", "").split(" :: ")[0]
        failure, error, skipped = case.find("failure"), case.find("error"), case.find("skipped")
        if failure is not None:
            verdict.failed[check] = failure.get("message", "")
        elif error is not None:
            verdict.errored[check] = error.get("message", "")
        elif skipped is not None:
            verdict.skipped.add(check)
        else:
            verdict.passed.add(check)
    return verdict


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("focus-validator")
    led = month_ledger(root / "month.db")
    start, end = ts(MONTH[0]), ts(MONTH[1])
    export = chargeback_focus(led, scope=None, card=CARD, start=start, end=end)
    (root / "month.csv").write_text(focus_csv(export, COLUMNS))
    write_focus_parquet(export, str(root / "month.parquet"), COLUMNS)
    # The same month with the fleet's unbilled cost shared by busy hours: Adjustment rows too.
    cb = chargeback(led, scope=None, card=CARD, start=start, end=end, by=("team", "project"), trend_months=0)
    cb = add_shared_idle(cb, fleet_cost(led, card=CARD, pools=Pools(), start=start, end=end), "busy")
    shared = add_shared_idle_rows(export, cb, card=CARD, start=start, end=end, identity=default_identity(CARD))
    assert any(r["ChargeCategory"] == "Adjustment" for r in shared.rows)
    (root / "shared.csv").write_text(focus_csv(shared, COLUMNS))
    led.close()
    # The capacity report's rows of a simulated fleet (tests/capacity_sim.py).
    load(str(root / "fleet.db"))
    with Ledger(root / "fleet.db") as fleet_led:
        fleet = capacity_focus(fleet_led, card=FLEET_CARD, pools=parse_pools(POOLS_TEXT), start=start, end=end)
    (root / "capacity.csv").write_text(focus_csv(fleet, COLUMNS))
    # The same month and fleet as the CLI writes them with --focus-version 1.0.
    header = '[card]\nname = "Vision cluster, 2026"\ncurrency = "USD"\nbasis = "busy"\n'
    (root / "rates.toml").write_text(header + CARD_TEXT)
    (root / "fleet-rates.toml").write_text(header + FLEET_CARD_TEXT)
    (root / "pools.toml").write_text(POOLS_TEXT)
    focus_10 = ["--month", "2026-03", "--format", "focus", "--focus-version", "1.0"]
    cli = [
        (report_group, ["chargeback", "--db", str(root / "month.db"), "--rates", str(root / "rates.toml"),
                        "--share-idle", "busy", "-o", str(root / "cli-chargeback.csv")]),
        (capacity_cmd, ["--db", str(root / "fleet.db"), "--rates", str(root / "fleet-rates.toml"),
                        "--pools", str(root / "pools.toml"), "-o", str(root / "cli-capacity.csv")]),
    ]  # fmt: skip
    for command, args in cli:
        done = CliRunner().invoke(command, [*args, *focus_10], catch_exceptions=False)
        assert done.exit_code == 0, done.output
        # exactly the 1.0 dataset: the validator would pass a 1.3 file too (it ignores the columns it does not know)
        assert Path(args[-1]).read_text().splitlines()[0].split(",") == [c.name for c in COLUMNS]
    names = ("month", "shared", "capacity", "cli-chargeback", "cli-capacity")
    return {name: root / f"{name}.csv" for name in names} | {"parquet": root / "month.parquet"}


def _overrides() -> set[str]:
    return set(yaml.safe_load(OVERRIDES.read_text())["overrides"])


@pytest.mark.parametrize("name", ["month", "shared", "capacity", "cli-chargeback", "cli-capacity"])
def test_the_validator_finds_no_error_in_the_csv(validate, files, tmp_path, name) -> None:  # type: ignore[no-untyped-def]
    verdict = validate(files[name], tmp_path)
    assert verdict.failed == {} and verdict.errored == {}, verdict.console
    assert verdict.skipped == _overrides()  # only the documented ones, and each really is a check
    assert len(verdict.passed) >= 120  # the whole FOCUS 1.0 rule set ran
    for check in (
        "BilledCost_IsDecimal",
        "ChargePeriodStart_IsDateTime",
        "BillingCurrency_IsCurrencyCode",
        "ServiceCategory_Enum",
        "Tags_IsJSONObject",
        "ChargeClass_Enum",
        "PricingCategory_Enum_1.0",
    ):
        assert check in verdict.passed


def test_the_validator_passes_the_parquet_but_for_reading_decimal128_as_a_float(validate, files, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The validator types a FOCUS Decimal column as pandas float64; pandas reads Parquet decimal128
    as Python Decimals, so each decimal column's type check fails on the type alone, whatever the
    values. gpuledger keeps decimal128 (exact money; FOCUS 1.0's Numeric Format names decimal128
    among its precisions). Every other check passes, the value checks of those columns included."""
    verdict = validate(files["parquet"], tmp_path)
    decimal_columns = {"BilledCost", "EffectiveCost", "ListCost", "ContractedCost", "ListUnitPrice",
                       "ContractedUnitPrice", "PricingQuantity", "ConsumedQuantity"}  # fmt: skip
    assert set(verdict.failed) == {f"{c}_IsDecimal" for c in decimal_columns}, verdict.console
    assert verdict.errored == {} and verdict.skipped == _overrides()
    for check in (
        "ChargePeriodStart_IsDateTime",
        "BillingPeriodEnd_IsDateTime",
        "BilledCost_NotNull",
        "Tags_IsJSONObject",
    ):
        assert check in verdict.passed


def test_the_validator_really_checks_values(validate, files, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The same file with four broken values: each is caught by the check it breaks, and only those."""
    reader = csv.DictReader(io.StringIO(files["month"].read_text()))
    rows = list(reader)
    rows[3]["ChargePeriodStart"] = "2026-03-05T01:00:00+01:00"  # not UTC
    rows[5]["BilledCost"] = ""  # a null cost
    rows[7]["ServiceCategory"] = "GPU"  # not one of FOCUS 1.0's service categories
    rows[9]["BillingCurrency"] = "usd"  # not an ISO 4217 code
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=reader.fieldnames or [], lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    broken = tmp_path / "broken.csv"
    broken.write_text(out.getvalue())
    verdict = validate(broken, tmp_path)
    assert set(verdict.failed) == {
        "ChargePeriodStart_IsDateTime",
        "BilledCost_NotNull",
        "ServiceCategory_Enum",
        "BillingCurrency_IsCurrencyCode",
    }, verdict.console
    assert "Rows: 4" in verdict.console and "Rows: 6" in verdict.console  # the validator counts rows from 1
