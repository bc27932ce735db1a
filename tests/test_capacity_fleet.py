"""The capacity report of a simulated fleet (tests/capacity_sim.py), on SQLite and PostgreSQL, checked
against what the simulation says it must be, computed there without gpuledger's capacity or cost
code: every GPU-second in exactly one state, the states adding up to GPUs x seconds, asset cost to
the unit, and the cost no run was billed for shared back so that the teams' totals add up to the
fleet's cost."""

from __future__ import annotations

import json
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import pytest
from click.testing import CliRunner

from capacity_sim import CARD, CARD_TEXT, END, POOLS_TEXT, START, expected_bills, load, workstation_truth
from gpuledger.cli.main import cli
from gpuledger.core.capacity.pools import parse_pools
from gpuledger.reports.capacity.report import capacity, fleet
from gpuledger.store import Ledger

POOLS = parse_pools(POOLS_TEXT)
STATE_COLUMNS = ("unallocated_gpu_h", "alloc_idle_gpu_h", "busy_attributed_gpu_h", "busy_unattributed_gpu_h")
HOSTS_BY_POOL = {"train": ("a100-01", "a100-02"), "cloud": ("p4d-01",), "L4": ("l4-01",), "T4": ("ws-01",)}


@pytest.fixture
def sim(ledger_url: str):  # type: ignore[no-untyped-def]
    gpus, truth, runs = load(ledger_url)
    ws_ms, ws_states, ws_asset = workstation_truth(runs)
    truth.fleet_ms["ws-01"], truth.state_ms["ws-01"], truth.asset["ws-01"] = ws_ms, ws_states, ws_asset
    truth.gpu_seconds += ws_ms // 1000
    return ledger_url, gpus, truth, runs


def _report(url: str, **kw):  # type: ignore[no-untyped-def]
    with Ledger(url) as led:
        return capacity(led, card=CARD, pools=POOLS, start=START, end=END, **kw)


def _uh(ms: int) -> int:
    assert (ms * 10) % 36 == 0, "the simulation keeps every presence edge on a whole hour"
    return ms * 10 // 36


def _money(text: str | None) -> Fraction:
    return Fraction(Decimal(text or "0"))


def test_every_gpu_second_of_the_fleet_is_in_exactly_one_state(sim) -> None:  # type: ignore[no-untyped-def]
    url, gpus, truth, _ = sim
    report = _report(url, by=("host",))
    total = report.total_units
    assert total.fleet_uh == truth.gpu_seconds * 1_000_000 // 3600  # GPUs x seconds, to the micro-hour
    assert (
        total.unallocated_uh + total.alloc_idle_uh + total.busy_attr_uh + total.busy_unattr_uh + (total.unobserved_uh)
        == total.fleet_uh
    )
    assert report.total["gpus"] == len(gpus) + 1  # the workstation's T4, known from its runs, too
    rows = {r["host"]: r for r in report.groups}
    assert set(rows) == set(truth.fleet_ms)
    for host, row in rows.items():
        units = report.group_units[(host,)]
        assert units.fleet_uh == _uh(truth.fleet_ms[host]), host
        assert units.unobserved_uh == _uh(truth.unobserved_ms.get(host, 0)), host
        for column, ms in zip(STATE_COLUMNS, truth.state_ms[host], strict=True):
            # each GPU-day's parts are rounded to micro-hours once: within a micro-hour per cell
            assert row[column] == pytest.approx(ms / 3_600_000, abs=2e-4), (host, column)
    # the mover's day and a half in transit and the L4 host's two days without an agent
    assert rows["a100-01"]["unobserved_gpu_h"] == 36.0 and rows["l4-01"]["unobserved_gpu_h"] == 96.0
    assert rows["l4-01"]["unallocated_gpu_h"] >= (31 - 2) * 24  # the never-used L4, every hour it was seen


def test_asset_cost_is_every_gpu_hour_at_its_rate_and_the_states_add_up_to_it(sim) -> None:  # type: ignore[no-untyped-def]
    url, _, truth, _ = sim
    report = _report(url, by=("host",))
    for row in report.groups:
        host = row["host"]
        assert _money(row["asset_cost"]) == truth.asset[host], host  # exact, to 10^-21
        parts = ("unallocated_cost", "alloc_idle_cost", "busy_attributed_cost", "busy_unattributed_cost",
                 "unobserved_cost")  # fmt: skip
        assert sum(_money(row[c]) for c in parts) == _money(row["asset_cost"])
        energy = truth.energy_cost.get(host, Fraction(0))
        assert abs(_money(row["energy_cost"]) - energy) < Fraction(1, 1000), host  # per-cell mWh rounding
        assert _money(row["fleet_cost"]) == _money(row["asset_cost"]) + _money(row["energy_cost"])
    fleet_truth = sum(truth.asset.values()) + sum(truth.energy_cost.values())
    assert abs(_money(report.total["fleet_cost"]) - fleet_truth) < Fraction(1, 200)  # to the cent
    assert sum(_money(r["fleet_cost"]) for r in report.groups) == _money(report.total["fleet_cost"])


def test_pools_group_hosts_as_the_pools_file_says(sim) -> None:  # type: ignore[no-untyped-def]
    url, _, truth, _ = sim
    report = _report(url, by=("pool",))
    for pool, hosts in HOSTS_BY_POOL.items():
        assert report.group_units[(pool,)].fleet_uh == sum(_uh(truth.fleet_ms[h]) for h in hosts), pool
    assert {r["pool"] for r in report.groups} == set(HOSTS_BY_POOL)
    by_model = _report(url, by=("gpu_model",))
    assert {r["gpu_model"] for r in by_model.groups} == {"A100-80GB-SXM", "A100-40GB-SXM", "L4", "T4"}
    assert by_model.total_units.fleet_cost == report.total_units.fleet_cost  # any grouping, the same total


@pytest.mark.parametrize("rule", ["allocated", "busy"])
def test_unbilled_cost_shared_back_adds_up_to_the_fleet_cost(sim, rule: str) -> None:  # type: ignore[no-untyped-def]
    url, _, truth, runs = sim
    report = _report(url, by=("host",), share_rule=rule)
    bills = expected_bills(runs)
    fleet_cost = _money(report.total["fleet_cost"])
    rows = {r["team"]: r for r in report.shares}
    assert set(rows) == set(bills)  # vision, nlp, edge, and the run without a team label
    assert sum(_money(r["total_cost"]) for r in rows.values()) == fleet_cost  # to the unit
    assert _money(report.shares_total["total_cost"]) == fleet_cost
    pool = sum(truth.asset.values()) + sum(truth.energy_cost.values()) - sum(b.billed for b in bills.values())
    weights = {t: (b.allocated_h if rule == "allocated" else b.busy_h) for t, b in bills.items()}
    for team, bill in bills.items():
        row = rows[team]
        assert abs(_money(row["billed_cost"]) - bill.billed) < Fraction(1, 200), team
        expected_share = pool * weights[team] / sum(weights.values())
        assert abs(_money(row["shared_idle_cost"]) - expected_share) < Fraction(1, 100), team
    assert report.params["share_idle"] == rule


def test_chargeback_with_shared_idle_totals_the_fleet_cost(sim, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    url, _, _, _ = sim
    rates, pools = tmp_path / "rates.toml", tmp_path / "pools.toml"
    rates.write_text('[card]\ncurrency = "USD"\nbasis = "busy"\n' + CARD_TEXT)
    pools.write_text(POOLS_TEXT)
    args = ["--db", url, "--month", "2026-03", "--rates", str(rates), "--pools", str(pools), "--json"]
    result = CliRunner().invoke(cli, ["report", "chargeback", "--share-idle", "busy", *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    cb = json.loads(result.output)
    capacity_json = CliRunner().invoke(cli, ["report", "capacity", *args], catch_exceptions=False).output
    fleet_cost = json.loads(capacity_json)["total"]["fleet_cost"]
    assert cb["total"]["cost_with_shared_idle"] == fleet_cost == cb["fleet_cost"]
    assert sum(Decimal(g["cost_with_shared_idle"]) for g in cb["groups"]) == Decimal(fleet_cost)
    assert sum(Decimal(g["shared_idle_cost"]) for g in cb["groups"]) == Decimal(fleet_cost) - Decimal(
        cb["total"]["cost"]
    )


def test_the_fleet_lists_moves_disappearances_and_gpus_known_from_runs(sim) -> None:  # type: ignore[no-untyped-def]
    url, gpus, _, _ = sim
    with Ledger(url) as led:
        rows = {r["gpu"]: r for r in fleet(led, card=CARD, pools=POOLS, now=END)}
    assert len(rows) == len(gpus) + 1
    mover = rows["GPU-mover"]
    assert (mover["host"], mover["hosts"], mover["status"]) == ("a100-02", "a100-01 > a100-02", "present")
    assert rows["GPU-p4d-3"]["status"] == "missing"  # its host's agent went on reporting without it
    assert rows["GPU-p4d-0"]["instance_type"] == "p4d.24xlarge" and rows["GPU-p4d-0"]["rate"] == "2.745"
    assert rows["GPU-p4d-0"]["price_line"].startswith("instance p4d.24xlarge")
    assert rows["GPU-a1-0"]["price_line"].startswith("gpu A100-80GB-SXM: 15000 / (4 y x 8760 h x 0.5)")
    assert (rows["GPU-ws"]["source"], rows["GPU-ws"]["pool"], rows["GPU-ws"]["status"]) == ("runs", "T4", "runs only")
    assert rows["GPU-l4-1"]["pool"] == "L4" and rows["GPU-a2-0"]["pool"] == "train"
