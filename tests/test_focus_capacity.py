"""``gpuledger report capacity --format focus``: the simulated fleet of tests/capacity_sim.py (hosts,
pools, on-prem GPUs billed with energy, cloud GPUs, a mid-day price change, a GPU moved, one never
used, an agent down) as FOCUS rows, held to the rules of FOCUS 1.3 (the CLI's default) and 1.0
(``--focus-version 1.0``) and to the capacity report of the same month, to the last unit."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from capacity_sim import CARD, CARD_TEXT, END, L4_CHANGE, POOLS_TEXT, START, load
from focus_support import VERSIONS, focus_violations, read_csv, read_parquet, version_args
from gpuledger.cli.capacity_cmds import capacity_cmd
from gpuledger.core.capacity.pools import parse_pools
from gpuledger.core.chargeback.focus import utc
from gpuledger.core.money import money_decimal
from gpuledger.reports.capacity.focus import capacity_focus
from gpuledger.reports.capacity.report import capacity
from gpuledger.store import Ledger

STATES = {
    "unallocated": "unallocated_uh",
    "allocated idle": "alloc_idle_uh",
    "busy attributed": "busy_attr_uh",
    "busy unattributed": "busy_unattr_uh",
    "unobserved": "unobserved_uh",
}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("focus-capacity")
    db = root / "fleet.db"
    load(str(db))
    (root / "rates.toml").write_text(f'[card]\ncurrency = "USD"\nbasis = "busy"\n{CARD_TEXT}')
    (root / "pools.toml").write_text(POOLS_TEXT)
    pools = parse_pools(POOLS_TEXT)
    with Ledger(db) as led:
        report = capacity(led, card=CARD, pools=pools, start=START, end=END, by=("host",))
        export = capacity_focus(led, card=CARD, pools=pools, start=START, end=END)
    return {"root": root, "db": str(db), "report": report, "export": export}


def _invoke(fleet: dict[str, Any], *args: str) -> Any:
    root = fleet["root"]
    base = ["--month", "2026-03", "--db", fleet["db"], "--rates", str(root / "rates.toml")]
    base += ["--pools", str(root / "pools.toml"), "--format", "focus"]
    return CliRunner().invoke(capacity_cmd, [*base, *args], catch_exceptions=False)


def test_rows_add_up_to_the_capacity_report_per_state_exactly(fleet: dict[str, Any]) -> None:
    total, rows = fleet["report"].total_units, fleet["export"].rows
    assert sum((r["BilledCost"] for r in rows), Decimal(0)) == money_decimal(total.fleet_cost)
    energy = [r for r in rows if r["x_CostKind"] == "energy"]
    assert energy and sum((r["BilledCost"] for r in energy), Decimal(0)) == money_decimal(total.energy_cost)
    for state, attr in STATES.items():
        of_state = [r for r in rows if r["x_CapacityState"] == state]
        hours = sum((r["PricingQuantity"] for r in of_state), Decimal(0))
        assert hours == Decimal(getattr(total, attr)) / 10**6, state
        assert sum((r["BilledCost"] for r in of_state), Decimal(0)) == money_decimal(
            getattr(total, attr.replace("_uh", "_cost"))
        ), state
    # Each GPU that was in the fleet has rows: the never-used one (all unallocated) too.
    assert {r["ResourceId"] for r in rows} >= {g for g in fleet["report"].total_units.gpus}
    never_used = {r["ResourceId"] for r in rows} - {
        r["ResourceId"] for r in rows if r["x_CapacityState"] not in ("unallocated", "unobserved", None)
    }
    assert never_used


def test_a_mid_day_price_change_splits_the_gpu_day(fleet: dict[str, Any]) -> None:
    change = utc(L4_CHANGE)
    day = [r for r in fleet["export"].rows if r["x_GpuModel"] == "L4" and r["ChargePeriodStart"].day == 16]
    before = [r for r in day if r["ChargePeriodEnd"] == change]
    after = [r for r in day if r["ChargePeriodStart"] == change]
    assert before and after and len(before) + len(after) == len(day)
    assert {r["ListUnitPrice"] for r in before} == {Decimal("0.8")} and {r["ListUnitPrice"] for r in after} == {
        Decimal("0.9")
    }
    for r in day:
        assert r["ListUnitPrice"] * r["PricingQuantity"] == r["BilledCost"]


@pytest.mark.parametrize("version", VERSIONS)
def test_capacity_focus_from_the_cli_keeps_the_versions_rules(fleet: dict[str, Any], version: str) -> None:
    result = _invoke(fleet, *version_args(version), "--provider", "ACME GPU platform")
    assert result.exit_code == 0, result.output
    columns, rows = read_csv(result.stdout)
    assert focus_violations(version, columns, rows, from_csv=True) == []
    assert {(r["ProviderName"], r["ResourceType"]) for r in rows} == {("ACME GPU platform", "GPU")}
    if version == "1.3":
        assert {(r["ServiceProviderName"], r["HostProviderName"]) for r in rows} == {("ACME GPU platform",) * 2}
    target = Path(fleet["root"]) / f"fleet-{version}.parquet"
    result = _invoke(fleet, *version_args(version), "-o", str(target))
    assert result.exit_code == 0, result.output
    columns, typed, _ = read_parquet(target)
    assert focus_violations(version, columns, typed, from_csv=False) == []
    assert sum((r["BilledCost"] for r in typed), Decimal(0)) == money_decimal(fleet["report"].total_units.fleet_cost)
    assert {r["x_Host"] for r in typed} >= {"a100-01", "a100-02", "p4d-01", "l4-01", "ws-01"}
    assert {r["x_Pool"] for r in typed if r["x_Host"] == "p4d-01"} == {"cloud"}


def test_capacity_focus_refuses_share_idle(fleet: dict[str, Any]) -> None:
    result = _invoke(fleet, "--share-idle", "busy")
    assert result.exit_code == 2 and "report chargeback --format focus" in result.output
