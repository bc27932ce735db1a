"""A simulated month in a real ledger: the chargeback's totals equal the bill computed
independently from the generated runs (tests/cost_sim.py), on SQLite (3,000 runs) and PostgreSQL
(a smaller month, to keep CI fast), from the intervals and again from rollups."""

from __future__ import annotations

from decimal import Decimal

import pytest

from cost_sim import CARD, MONTH, expected_bill, simulate, write
from cost_support import ts
from gpuledger.reports.cost.costing import chargeback
from gpuledger.reports.cost.rollups import materialise_rollups
from gpuledger.store import Ledger


def _check(cb, bills) -> None:  # type: ignore[no-untyped-def]
    teams = {g["team"]: g for g in cb.groups}
    assert set(teams) == set(bills) - {"TOTAL"}
    for key, bill in bills.items():
        row = cb.total if key == "TOTAL" else teams[key]
        # µh / mWh rounding happens once per priced piece: a few 10^-6 per piece at most
        pieces = max(1, len(bill.runs)) * 40
        assert abs(float(row["cost"]) - bill.cost) <= pieces * 0.00002, key
        assert row["allocated_gpu_h"] == pytest.approx(bill.alloc_h, rel=1e-6, abs=1e-4), key
        assert row["busy_gpu_h"] == pytest.approx(bill.busy_h, rel=1e-6, abs=1e-4), key
        assert row["energy_kwh"] == pytest.approx(bill.energy_kwh, rel=1e-6, abs=1e-4), key
        assert row["unpriced_gpu_h"] == pytest.approx(bill.unpriced_h, rel=1e-6, abs=1e-4), key
        assert row["runs"] == len(bill.runs), key
    assert sum(Decimal(g["cost"]) for g in cb.groups) == Decimal(cb.total["cost"])


def _month(led: Ledger):  # type: ignore[no-untyped-def]
    return chargeback(led, scope=None, card=CARD, start=ts(MONTH[0]), end=ts(MONTH[1]), by=("team",), trend_months=1)


@pytest.mark.parametrize("n_runs", [pytest.param(3000, id="3000-runs")])
def test_simulated_month_on_sqlite(tmp_path, n_runs: int) -> None:  # type: ignore[no-untyped-def]
    runs = simulate(n_runs)
    led = Ledger(tmp_path / "month.db")
    write(led, runs)
    _assert_month(led, runs)
    led.close()


@pytest.mark.postgres
@pytest.mark.parametrize("ledger_url", ["postgres"], indirect=True)
def test_simulated_month_on_postgres(ledger_url: str) -> None:
    runs = simulate(400, seed=11)
    led = Ledger(ledger_url)
    write(led, runs)
    _assert_month(led, runs)
    led.close()


def _assert_month(led: Ledger, runs) -> None:  # type: ignore[no-untyped-def]
    kinds = {r.status for r in runs}
    assert (
        {"killed", "lost", "failed"} <= kinds and any(r.shared_with for r in runs) and any(r.attempt_of for r in runs)
    )
    cb = _month(led)
    bills = expected_bill(runs, ts(MONTH[0]), ts(MONTH[1]))
    _check(cb, bills)
    feb = next(r for r in cb.trend if r["team"] == "TOTAL" and r["month"] == "2026-02")
    assert abs(float(feb["cost"]) - expected_bill(runs, ts("2026-02-01"), ts(MONTH[0]))["TOTAL"].cost) < 0.05
    assert any("priced up to their last recorded interval" in w for w in cb.warnings)
    assert any("RTX-4090" in w and "no rate" in w for w in cb.warnings)

    # Rollups: the same bill (the day of the mid-day price change is read from the intervals, cut
    # exactly), to the cent.
    materialise_rollups(led)
    rolled = _month(led)
    _check(rolled, bills)
    for column in ("allocated_gpu_h", "busy_gpu_h", "energy_kwh", "unpriced_gpu_h"):
        assert rolled.total[column] == pytest.approx(cb.total[column], rel=1e-6)
    assert abs(Decimal(rolled.total["cost"]) - Decimal(cb.total["cost"])) < Decimal("0.01")
    # The trend month before the report is priced from rollup sums per group: the same bill.
    feb_rolled = next(r for r in rolled.trend if r["team"] == "TOTAL" and r["month"] == "2026-02")
    assert abs(float(feb_rolled["cost"]) - float(feb["cost"])) < 0.05
    assert feb_rolled["allocated_gpu_h"] == pytest.approx(feb["allocated_gpu_h"], rel=1e-6)
    assert _team_months(rolled) == _team_months(cb)


def _team_months(cb):  # type: ignore[no-untyped-def]
    return sorted((r["team"], r["month"]) for r in cb.trend)
