"""FOCUS 1.3, the default of ``--format focus``: the chargeback and the fleet as FOCUS 1.3 datasets, checked against the
specification's column definitions (focus13_spec_rules.py, written from the spec) and FOCUS 1.0's
rules for the columns 1.3 keeps (focus_spec_rules.py). The shared idle split (``--share-idle``) is a
split cost allocation: its rows carry the Allocated* columns, their ratios add up to 1 exactly."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from focus13_spec_rules import ALLOCATION, NEW_COLUMNS, ratios, split_rows, violations13
from focus_spec_rules import violations
from focus_support import as_10 as _as_10
from focus_support import chargeback as _chargeback
from focus_support import month_env, read_csv, read_parquet
from gpuledger.cli.capacity_cmds import capacity_cmd
from gpuledger.cli.cost_cmds import report_group
from gpuledger.core.chargeback.focus_columns import COLUMNS as COLUMNS_10
from gpuledger.core.chargeback.focus_v13 import allocation_cells


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return month_env(tmp_path_factory.mktemp("focus13"))


@pytest.mark.parametrize("rule", ["allocated", "busy"])
def test_the_shared_idle_split_is_a_focus_13_split_cost_allocation(env: dict[str, str], rule: str) -> None:
    report = json.loads(_chargeback(env, "--format", "json", "--share-idle", rule).stdout)
    result = _chargeback(env, "--format", "focus", "--focus-version", "1.3", "--share-idle", rule)
    assert result.exit_code == 0, result.output
    columns, rows = read_csv(result.stdout)
    assert violations13(columns, rows, split=True) == []
    assert violations(*_as_10(columns, rows), from_csv=True) == []
    assert "x_ShareRule" not in columns  # its standard home now: AllocatedMethodId
    split = split_rows(rows)
    assert split == [r for r in rows if r["x_CostKind"] == "shared idle"] and len(split) >= 4
    pool = sum((Decimal(r["BilledCost"]) for r in split), Decimal(0))
    groups = {g["team"]: g for g in report["groups"]}
    hours_key = "allocated_gpu_h" if rule == "allocated" else "busy_gpu_h"
    for r in split:
        [ratio] = ratios(r)
        assert abs(ratio - Decimal(r["BilledCost"]) / pool) < Decimal("1e-11")  # its share of the origin charge
        assert r["AllocatedMethodId"] == f"gpuledger-shared-idle-{rule}-gpu-hours"
        team = r["x_Team"]
        assert r["AllocatedResourceId"] == f"team={team}" and r["AllocatedResourceName"] == f"team {team}"
        assert json.loads(r["AllocatedTags"]) == {"team": team}
        [element] = json.loads(r["AllocatedMethodDetails"], parse_float=Decimal)["Elements"]
        group = groups[team]
        hours = Decimal(str(group[hours_key])) + (Decimal(str(group["unmeasured_gpu_h"] or 0)) if rule == "busy" else 0)
        assert (element["UsageUnit"], element["UsageQuantity"]) == ("GPU-Hours", hours)
    assert sum((ratios(r)[0] for r in split), Decimal(0)) == 1  # exactly, not to float precision
    # the money is the 1.0 export's: only columns were added
    _, rows_10 = read_csv(_chargeback(env, "--format", "focus", "--focus-version", "1.0", "--share-idle", rule).stdout)
    assert [r["BilledCost"] for r in rows] == [r["BilledCost"] for r in rows_10]


def test_a_charge_with_no_split_has_null_allocation_columns(env: dict[str, str]) -> None:
    result = _chargeback(env, "--format", "focus", "--focus-version", "1.3")
    columns, rows = read_csv(result.stdout)
    assert violations13(columns, rows, split=False) == []
    assert rows and all(r[c] == "" for r in rows for c in ALLOCATION)
    assert {(r["ServiceProviderName"], r["HostProviderName"], r["ProviderName"]) for r in rows} == {
        ("Vision cluster, 2026",) * 3
    }


def test_focus_13_parquet_types_follow_the_spec(env: dict[str, str]) -> None:
    target = Path(env["root"]) / "march13.parquet"
    result = _chargeback(env, "--format", "focus", "--focus-version", "1.3", "--share-idle", "busy", "-o", str(target))
    assert result.exit_code == 0, result.output
    columns, rows, schema = read_parquet(target)
    assert violations13(columns, rows, split=True) == []
    assert violations(*_as_10(columns, rows), from_csv=False) == []
    for name in NEW_COLUMNS:  # String, and JSON serialized as a string
        assert str(schema.field(name).type) == "string", name


def test_focus_13_is_the_default_and_1_0_stays_selectable(env: dict[str, str]) -> None:
    default = _chargeback(env, "--format", "focus", "--share-idle", "allocated")
    columns, rows = read_csv(default.stdout)
    # columns only FOCUS 1.3 defines, filled as it asks; and the 1.0 custom column it replaces is gone
    assert {"AllocatedMethodId", "AllocatedResourceId", "ServiceProviderName", "HostProviderName"} <= set(columns)
    assert "x_ShareRule" not in columns and violations13(columns, rows, split=True) == []
    explicit = _chargeback(env, "--format", "focus", "--focus-version", "1.3", "--share-idle", "allocated")
    assert explicit.stdout == default.stdout
    # --focus-version 1.0: exactly FOCUS 1.0's columns and gpuledger's, as before 1.3 was the default
    columns_10, _ = read_csv(
        _chargeback(env, "--format", "focus", "--focus-version", "1.0", "--share-idle", "allocated").stdout
    )
    assert columns_10 == [c.name for c in COLUMNS_10] and "x_ShareRule" in columns_10
    assert not set(NEW_COLUMNS) & set(columns_10)


def test_an_unknown_focus_version_is_a_usage_error(env: dict[str, str]) -> None:
    base = ["chargeback", "--month", "2026-03", "--db", env["db"], "--rates", env["rates"]]
    result = CliRunner().invoke(report_group, [*base, "--format", "focus", "--focus-version", "1.2"])
    assert result.exit_code == 2 and "'1.2' is not one of '1.0', '1.3'" in result.output


def test_capacity_focus_13_is_the_default(env: dict[str, str]) -> None:
    args = ["--month", "2026-03", "--db", env["db"], "--rates", env["rates"], "--format", "focus"]
    result = CliRunner().invoke(capacity_cmd, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    columns, rows = read_csv(result.stdout)
    assert "AllocatedMethodId" in columns and "ServiceProviderName" in columns
    assert rows and violations13(columns, rows, split=False) == []
    assert violations(*_as_10(columns, rows), from_csv=True) == []
    explicit = CliRunner().invoke(capacity_cmd, [*args, "--focus-version", "1.3"], catch_exceptions=False)
    assert explicit.stdout == result.stdout
    columns_10, rows_10 = read_csv(
        CliRunner().invoke(capacity_cmd, [*args, "--focus-version", "1.0"], catch_exceptions=False).stdout
    )
    assert columns_10 == [c.name for c in COLUMNS_10] and violations(columns_10, rows_10, from_csv=True) == []
    assert [r["BilledCost"] for r in rows_10] == [r["BilledCost"] for r in rows]  # the same rows and money


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=-(10**9), max_value=10**12), min_size=1, max_size=12))
def test_allocated_ratios_add_up_to_one_exactly(parts_units: list[int]) -> None:
    # shared idle parts in exact money units (add_shared_idle's strings); zero parts get no row
    groups = [{"team": f"t{i}", "shared_idle_cost": str(Decimal(p).scaleb(-6)), "allocated_gpu_h": 1.0}
              for i, p in enumerate(parts_units)]  # fmt: skip
    cells = allocation_cells(groups, ["team"], "allocated")
    shared = [p for p in parts_units if p]
    assert len(cells) == len(shared)
    if not shared or not sum(shared):
        return
    got = [ratios({"AllocatedMethodDetails": c["AllocatedMethodDetails"]})[0] for c in cells]
    assert sum(got, Decimal(0)) == 1
    for ratio, part in zip(got, shared, strict=True):  # each its part of the origin charge, to 12 places
        exact = Decimal(part) / Decimal(sum(shared))
        assert abs(ratio - exact) <= Decimal(len(shared)) * Decimal("1e-12") * max(1, abs(exact))
