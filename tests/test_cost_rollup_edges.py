"""Figures that must not change when runs are rolled up or shown as a trend month, on SQLite and
PostgreSQL: the edge cases an audit of the money arithmetic found (a price change inside a day, a
window that ends inside a day, GPUs that measure no busy time, grouping by status). Each test
states the hand-computed bill; CHARGEBACK.md and RATE_CARDS.md give the rules."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from cost_support import H, card, price_change, ts
from gpuledger.core.model import GpuIdentity, GpuInterval, RunRecord
from gpuledger.core.pricing.ratecard import RateCard
from gpuledger.reports.capacity.runs import team_bills
from gpuledger.reports.cost.costing import chargeback, month_window, run_costs
from gpuledger.reports.cost.rollups import materialise_rollups
from gpuledger.store import Ledger

A100 = "NVIDIA A100-SXM4-40GB"
FLAT = card('[[gpu]]\nmodel = "A100-40GB-SXM"\nprice_per_hour = "2.50"\n')


@pytest.fixture
def led(ledger_url: str) -> Iterator[Ledger]:
    with Ledger(ledger_url) as ledger:
        yield ledger


def _run(led: Ledger, rid: str, start: str, hours: float, busy: list[float | None], team: str = "vision") -> None:
    """A run on one GPU of its own, ``busy`` the busy share of each of its hours (None: unmeasured)."""
    t0 = ts(start)
    labels = {"team": team, "project": "det"}
    run = RunRecord(id=rid, command=["train"], user="ana", host="h", cwd="/", started_at=t0, status="succeeded",
                    ended_at=t0 + hours * H, labels=labels)  # fmt: skip
    led.create_run(run)
    led.add_devices(rid, [GpuIdentity(0, f"GPU-{rid}", A100)])
    ivs = []
    for i, b in enumerate(busy):
        a = t0 + i * H
        ivs.append(GpuInterval(f"GPU-{rid}", i, a, a + H, busy_s=None if b is None else b * H, energy_j=300.0 * H))
    led.append(rid, gpu=ivs)


def _cost(led: Ledger, c: RateCard, month: str = "2026-03", **kw) -> str:  # type: ignore[no-untyped-def]
    start, end = kw.pop("window", month_window(month))
    return chargeback(led, scope=None, card=c, start=start, end=end, by=("team",), trend_months=0, **kw).total["cost"]


def _trend(led: Ledger, c: RateCard, by: tuple[str, ...] = ("team",)) -> dict[str, str]:
    """The April report's trend rows for the TOTAL, by month."""
    start, end = month_window("2026-04")
    report = chargeback(led, scope=None, card=c, start=start, end=end, by=by, trend_months=1)
    return {r["month"]: r["cost"] for r in report.trend if r[by[0]] == "TOTAL"}


def test_gpuledger_cost_cuts_busy_time_at_a_price_change_inside_a_day(led: Ledger) -> None:
    # 18:00-24:00, fully busy until the change at 21:00 (3.00), idle after it (1.00): 3 h x 3.00.
    c = price_change("A100-40GB-SXM", "2026-03-10T21:00:00", "3.00", "1.00")
    _run(led, "r1", "2026-03-10T18:00", 6, [1, 1, 1, 0, 0, 0])
    assert run_costs(led, ["r1"], scope=None, card=c)["total"]["cost"] == "9.00"
    assert _cost(led, c) == "9.00"  # the chargeback has always said so


def test_a_window_ending_inside_a_day_gives_the_same_bill_after_rollup(led: Ledger) -> None:
    _run(led, "r1", "2026-03-10T18:00", 6, [1, 1, 1, 0, 0, 0])
    morning = (ts("2026-03-10"), ts("2026-03-10T21:00"))
    evening = (ts("2026-03-10T21:00"), ts("2026-03-11"))
    before = (_cost(led, FLAT, window=morning), _cost(led, FLAT, window=evening))
    materialise_rollups(led)
    assert before == ("7.50", "0.00")  # 3 busy h x 2.50 before 21:00, none after
    assert (_cost(led, FLAT, window=morning), _cost(led, FLAT, window=evening)) == before


def test_a_trend_month_bills_gpus_without_busy_time_their_held_hours(led: Ledger) -> None:
    # a: 4 h at 50 % -> 2 busy h; b: 4 h on a GPU that measures no busy time -> billed held: 6 h x 2.50.
    _run(led, "a", "2026-03-10T00:00", 4, [0.5] * 4)
    _run(led, "b", "2026-03-11T00:00", 4, [None] * 4)
    materialise_rollups(led)
    assert _cost(led, FLAT) == "15.00"
    assert _trend(led, FLAT)["2026-03"] == "15.00"


def test_a_trend_month_cuts_held_time_at_a_price_change_exactly(led: Ledger) -> None:
    # Allocated basis, 4.00 until noon then 1.00: r1 00:00-06:00 (24.00) and r2 13:00-19:00 (6.00).
    c = price_change("A100-40GB-SXM", "2026-03-10T12:00:00", "4.00", "1.00", basis="allocated")
    _run(led, "r1", "2026-03-10T00:00", 6, [0.5] * 6)
    _run(led, "r2", "2026-03-10T13:00", 6, [0.5] * 6)
    materialise_rollups(led)
    assert _cost(led, c) == "30.00"
    assert _trend(led, c)["2026-03"] == "30.00"


def test_grouping_by_status_works_with_trend_months(led: Ledger) -> None:
    _run(led, "r1", "2026-03-10T00:00", 4, [0.5] * 4)
    materialise_rollups(led)
    assert _trend(led, FLAT, by=("status",))["2026-03"] == "5.00"


def test_the_capacity_reports_team_bills_match_the_chargeback_on_a_price_change_day(led: Ledger) -> None:
    # `report capacity --share-idle` shares the fleet's unbilled cost by what each team was billed:
    # the same 9.00 the chargeback bills for a rolled-up run busy only before a change at 21:00.
    c = price_change("A100-40GB-SXM", "2026-03-10T21:00:00", "3.00", "1.00")
    _run(led, "r1", "2026-03-10T18:00", 6, [1, 1, 1, 0, 0, 0])
    materialise_rollups(led)
    start, end = month_window("2026-03")
    bills = led.read(lambda conn: team_bills(conn, c, start, end, None))
    assert [(b.team, b.billed) for b in bills] == [("vision", 9 * 10**21)]
    assert _cost(led, c) == "9.00"


def test_a_run_day_with_a_measured_and_an_unmeasured_gpu_of_one_model_bills_the_same_after_rollup(
    led: Ledger,
) -> None:
    # Two A100s of one run, 4 h: GPU 0 is 50 % busy (2 busy h), GPU 1 measures no busy time and is
    # billed its 4 held hours: 6 h x 2.50. A rollup row of both once hid GPU 1's held hours (5.00).
    t0 = ts("2026-03-10T00:00")
    run = RunRecord(id="r", command=["train"], user="ana", host="h", cwd="/", started_at=t0, status="succeeded",
                    ended_at=t0 + 4 * H, labels={"team": "vision", "project": "det"})  # fmt: skip
    led.create_run(run)
    led.add_devices("r", [GpuIdentity(0, "GPU-m", A100), GpuIdentity(1, "GPU-u", A100)])
    led.append("r", gpu=[
        GpuInterval(uuid, i, t0 + i * H, t0 + (i + 1) * H, busy_s=busy, energy_j=300.0 * H)
        for i in range(4) for uuid, busy in (("GPU-m", 0.5 * H), ("GPU-u", None))
    ])  # fmt: skip
    before = (_cost(led, FLAT), run_costs(led, ["r"], scope=None, card=FLAT)["total"]["cost"])
    materialise_rollups(led)
    assert before == ("15.00", "15.00")
    assert (_cost(led, FLAT), run_costs(led, ["r"], scope=None, card=FLAT)["total"]["cost"]) == before
    assert _trend(led, FLAT)["2026-03"] == "15.00"
