"""``gpuledger report chargeback --format focus`` end to end through click, on a simulated month:
CSV to stdout, Parquet with ``-o FILE.parquet``, the provider's name, and the shared idle cost
(``--share-idle``) as rows of its own, so the file adds up to the fleet's cost. Each in FOCUS 1.3
(the default: no option given) and in 1.0 (``--focus-version 1.0``), to that version's rules."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from focus_support import VERSIONS, focus_violations, month_env, read_csv, read_parquet, version_args
from focus_support import chargeback as _chargeback
from gpuledger.cli.cost_cmds import report_group


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return month_env(tmp_path_factory.mktemp("focus-cli"))


def _total(rows: list[dict[str, Any]], column: str = "BilledCost") -> Decimal:
    return sum((Decimal(str(r[column])) for r in rows if r[column] not in ("", None)), Decimal(0))


@pytest.mark.parametrize("version", VERSIONS)
def test_focus_csv_on_stdout_adds_up_to_the_chargeback(env: dict[str, str], version: str) -> None:
    result = _chargeback(env, "--format", "focus", *version_args(version))
    assert result.exit_code == 0, result.output
    columns, rows = read_csv(result.stdout)
    assert focus_violations(version, columns, rows, from_csv=True) == []
    report = json.loads(_chargeback(env, "--format", "json").stdout)
    assert _total(rows) == Decimal(report["total"]["cost"])
    # The provider is the rate card's name; the notes (unpriced hours) go to stderr, not into the CSV.
    assert {(r["ProviderName"], r["BillingAccountId"]) for r in rows} == {
        ("Vision cluster, 2026", "vision-cluster-2026")
    }
    if version == "1.3":  # the provider columns that replace ProviderName
        assert {(r["ServiceProviderName"], r["HostProviderName"]) for r in rows} == {("Vision cluster, 2026",) * 2}
    assert "note: " in result.stderr and "RTX-4090 have no rate" in result.stderr
    assert "note:" not in result.stdout


@pytest.mark.parametrize("version", VERSIONS)
def test_focus_parquet_with_o_and_the_provider_named(env: dict[str, str], version: str) -> None:
    target = Path(env["root"]) / f"march-{version}.parquet"
    args = ["--format", "focus", *version_args(version), "--provider", "ACME GPU Platform", "-o", str(target)]
    result = _chargeback(env, *args)
    assert result.exit_code == 0, result.output
    assert f"wrote {target}" in result.stderr
    columns, rows, schema = read_parquet(target)
    assert focus_violations(version, columns, rows, from_csv=False) == []
    assert str(schema.field("BilledCost").type).startswith("decimal128")
    assert {(r["ProviderName"], r["InvoiceIssuerName"], r["BillingAccountId"]) for r in rows} == {
        ("ACME GPU Platform", "ACME GPU Platform", "acme-gpu-platform")
    }
    if version == "1.3":
        assert {r["ServiceProviderName"] for r in rows} == {"ACME GPU Platform"}
    _, csv_rows = read_csv(_chargeback(env, "--format", "focus", *version_args(version)).stdout)
    assert _total(rows) == _total(csv_rows) and len(rows) == len(csv_rows)


@pytest.mark.parametrize("version", VERSIONS)
def test_shared_idle_rows_bring_the_file_to_the_fleet_cost(env: dict[str, str], version: str) -> None:
    report = json.loads(_chargeback(env, "--format", "json", "--share-idle", "allocated").stdout)
    result = _chargeback(env, "--format", "focus", *version_args(version), "--share-idle", "allocated")
    assert result.exit_code == 0, result.output
    columns, rows = read_csv(result.stdout)
    assert focus_violations(version, columns, rows, from_csv=True, split=True) == []
    shared = [r for r in rows if r["x_CostKind"] == "shared idle"]
    teams = {g["team"]: g for g in report["groups"]}
    assert {r["x_Team"]: Decimal(r["BilledCost"]) for r in shared} == {
        team: Decimal(g["shared_idle_cost"]) for team, g in teams.items() if Decimal(g["shared_idle_cost"])
    }
    assert len(shared) >= 4
    for r in shared:
        assert (r["ChargeCategory"], _share_rule(version, r), r["ChargePeriodStart"], r["ChargePeriodEnd"]) == (
            "Adjustment", "allocated", "2026-03-01T00:00:00Z", "2026-04-01T00:00:00Z",
        )  # fmt: skip
        assert r["PricingQuantity"] == r["ListUnitPrice"] == r["SkuPriceId"] == r["ResourceId"] == ""
    fleet = Decimal(report["fleet_cost"])
    assert _total(rows) == fleet == Decimal(report["total"]["cost_with_shared_idle"])
    assert _total(rows) > Decimal(report["total"]["cost"])


def _share_rule(version: str, row: dict[str, str]) -> str:
    """The rule a shared idle row was split by: x_ShareRule in 1.0; in 1.3 the split cost allocation's
    method, which names the same rule in AllocatedMethodId and in AllocatedMethodDetails."""
    if version == "1.0":
        return row["x_ShareRule"]
    assert "x_ShareRule" not in row  # its standard home in 1.3 is AllocatedMethodId
    rule = json.loads(row["AllocatedMethodDetails"])["x_ShareRule"]
    assert row["AllocatedMethodId"] == f"gpuledger-shared-idle-{rule}-gpu-hours"
    return rule


def test_shared_idle_focus_needs_one_month(env: dict[str, str]) -> None:
    base = ["chargeback", "--from", "2026-03-15", "--to", "2026-04-14", "--db", env["db"], "--rates", env["rates"]]
    result = CliRunner().invoke(report_group, [*base, "--format", "focus", "--share-idle", "busy"])
    assert result.exit_code == 2
    assert "one month's window" in result.output and "Traceback" not in result.output
    # Without --share-idle such a window is fine: each row's billing period is its own month.
    result = CliRunner().invoke(report_group, [*base, "--format", "focus"])
    assert result.exit_code == 0, result.output
    _, rows = read_csv(result.stdout)
    assert {r["BillingPeriodStart"] for r in rows} == {"2026-03-01T00:00:00Z", "2026-04-01T00:00:00Z"}
    assert min(r["ChargePeriodStart"] for r in rows) == "2026-03-15T00:00:00Z"
    assert max(r["ChargePeriodEnd"] for r in rows) <= "2026-04-15T00:00:00Z"
