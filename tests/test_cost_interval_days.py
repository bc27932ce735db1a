"""The day sums the cost engine prices a run from (store/cost_queries.interval_days, one GROUP BY
scan, the intervals crossing a midnight split in Python) against the definition computed here
interval by interval: each interval in its day, one crossing a midnight split in proportion to
time, one crossing two or more left out (read raw), one touching a price-change day left out.

Times lie on a quarter-second grid and lengths are powers of two, so every split and every sum is
exact in floating point whatever the order of addition: the two must agree to the last bit, and
so must the money priced from them (``run_costs`` with a rate card that changes price mid-run)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cost_sim import Device, SimRun, write
from cost_support import card
from gpuledger.reports.cost.costing import run_costs
from gpuledger.store import Ledger
from gpuledger.store import cost_queries as cq

DAY = 86400
FIRST_DAY = 20_500  # 2026-02-16
RUN = "0190b0b0-0000-7000-8000-interval0days"
Interval = tuple[float, float, float | None, float | None]


def expected_days(
    intervals: list[Interval], start: float | None, end: float | None, skip: set[int]
) -> dict[tuple[str, int], dict[str, Any]]:
    """Per (device, day): the sums the docstring of interval_days defines, interval by interval."""
    out: dict[tuple[str, int], dict[str, Any]] = {}
    for uuid, (t0, t1, busy, energy) in intervals:  # type: ignore[misc]
        d0, d1 = int(t0 // DAY), int(t1 // DAY)
        if d1 > d0 + 1 or d0 in skip or d1 in skip:
            continue
        if (start is not None and t1 <= start) or (end is not None and t0 >= end):
            continue
        night = (d0 + 1) * DAY
        if t1 > night:
            first = (night - t0) / (t1 - t0)
            parts = [(d0, t0, night, first, 0), (d0 + 1, night, t1, 1.0 - first, 1)]
        else:
            parts = [(d0, t0, t1, 1.0, 1)]
        for day, a, b, share, ends in parts:
            row = out.setdefault(
                (uuid, day),
                {"t0": a, "t1": b, "busy_s": None, "busy_n": 0, "energy_j": None, "energy_n": 0, "intervals": 0},
            )
            row["t0"], row["t1"] = min(row["t0"], a), max(row["t1"], b)
            if busy is not None:
                row["busy_s"] = (row["busy_s"] or 0.0) + busy * share
                row["busy_n"] += 1
            if energy is not None:
                row["energy_j"] = (row["energy_j"] or 0.0) + energy * share
                row["energy_n"] += 1
            row["intervals"] += ends
    return out


def _got(rows: list[dict[str, Any]]) -> dict[tuple[str, int], dict[str, Any]]:
    out = {}
    for r in rows:
        assert r["run_id"] == RUN
        sums = {k: r[k] for k in ("t0", "t1", "busy_s", "energy_j")}
        out[(r["device_uuid"], int(r["day"]))] = sums | {k: int(r[k]) for k in ("busy_n", "energy_n", "intervals")}
    return out


@st.composite
def device_intervals(draw: st.DrawFn) -> list[Interval]:
    """A GPU's intervals around two midnights: in order, with gaps, some overlapping (a second
    stream crossing the same midnight), some over two midnights, busy or energy sometimes unknown."""
    out: list[Interval] = []
    t = (FIRST_DAY + 1) * DAY - draw(st.integers(0, 64)) / 4
    for _ in range(draw(st.integers(1, 24))):
        length = 2.0 ** draw(st.integers(-2, 5))
        if draw(st.integers(0, 30)) == 0:
            length = 2.0 * DAY  # crosses two midnights: left to raw_intervals
        back = draw(st.sampled_from([0, 0, 0, 0.25, length]))  # an overlap now and then
        t0 = t - back
        busy = draw(st.one_of(st.none(), st.integers(0, int(length * 4)).map(lambda q: q / 4)))
        energy = draw(st.one_of(st.none(), st.integers(0, 4000).map(lambda q: q / 4)))
        out.append((t0, t0 + length, busy, energy))
        t = t0 + length + draw(st.sampled_from([0, 0, 0.25, 3.0]))
        if draw(st.integers(0, 6)) == 0:  # jump to just before the next midnight
            t = max(t, (int(t // DAY) + 1) * DAY - draw(st.integers(1, 40)) / 4)
    return out


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def any_ledger(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ledger]:
    """One ledger for all examples (each example empties it): SQLite, and PostgreSQL, whose
    floor() and GROUP BY differ from SQLite's."""
    if request.param == "sqlite":
        with Ledger(f"sqlite:///{tmp_path_factory.mktemp('days') / 'ledger.db'}") as led:
            yield led
        return
    if os.environ.get("GPULEDGER_TEST_PG") == "0":
        pytest.skip("PostgreSQL tests disabled by GPULEDGER_TEST_PG=0")
    from conftest import _pg_schema_url

    for url in _pg_schema_url():
        with Ledger(url) as led:
            yield led


@pytest.fixture(scope="module")
def sqlite_ledger(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ledger]:
    with Ledger(f"sqlite:///{tmp_path_factory.mktemp('money') / 'ledger.db'}") as led:
        yield led


def _store(led: Ledger, devices: list[list[Interval]], end_at: float | None, status: str = "succeeded") -> None:
    led.database.write(lambda conn: cq_delete(conn))
    start = min(iv[0] for ivs in devices for iv in ivs)
    sim = SimRun(
        id=RUN,
        team="t",
        project="p",
        user="u",
        status=status,
        start=start,
        ended_at=end_at,
        instance=None,
        kind=0,
        devices=[
            Device(f"GPU-{n}", "NVIDIA A100-SXM4-40GB", intervals=[(a, b, busy, e, None) for a, b, busy, e in ivs])
            for n, ivs in enumerate(devices)
        ],
    )
    write(led, [sim])


def cq_delete(conn: Any) -> None:
    import sqlalchemy as sa

    from gpuledger.store import schema

    for table in (schema.gpu_intervals, schema.devices, schema.run_labels, schema.runs):
        conn.execute(sa.delete(table))


def _flat(devices: list[list[Interval]]) -> list[Any]:
    return [(f"GPU-{n}", iv) for n, ivs in enumerate(devices) for iv in ivs]


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(
    devices=st.lists(device_intervals(), min_size=1, max_size=2),
    window=st.sampled_from([(None, None), ((FIRST_DAY + 1) * DAY - 2.0, None), (None, (FIRST_DAY + 1) * DAY + 1.0)]),
    skip=st.sampled_from([set(), {FIRST_DAY + 1}, {FIRST_DAY + 2}]),
)
def test_day_sums_equal_the_interval_by_interval_definition(
    any_ledger: Ledger, devices: list[list[Interval]], window: tuple[float | None, float | None], skip: set[int]
) -> None:
    _store(any_ledger, devices, max(iv[1] for ivs in devices for iv in ivs))
    start, end = window
    got = any_ledger.read(lambda conn: cq.interval_days(conn, [RUN], start, end, sorted(skip)))
    assert _got(got) == expected_days(_flat(devices), start, end, skip)


def _reference_interval_sums(
    conn: Any, run_ids: Any, start: Any, end: Any, skip_days: Any = (), series: Any = None
) -> tuple[list, list]:
    """interval_sums computed from every interval read into Python (the straightforward way)."""
    import sqlalchemy as sa

    from gpuledger.store.schema import gpu_intervals

    g = gpu_intervals.c
    rows = conn.execute(sa.select(g.run_id, g.device_uuid, g.t0, g.t1, g.busy_s, g.energy_j)).all()
    flat = [(uuid, (t0, t1, busy, energy)) for rid, uuid, t0, t1, busy, energy in rows if rid in run_ids]
    days = expected_days(flat, start, end, set(skip_days))
    sums = [{"run_id": RUN, "device_uuid": uuid, "day": day, **row} for (uuid, day), row in days.items()]
    return sums, cq.raw_intervals(conn, run_ids, start, end, skip_days)


CHANGE_CARD = card(
    '[[gpu]]\nmodel = "A100-40GB-SXM"\nprice_per_hour = "2.74"\neffective_to = 2026-02-17T00:00:03Z\n\n'
    '[[gpu]]\nmodel = "A100-40GB-SXM"\nprice_per_hour = "2.50"\neffective_from = 2026-02-17T00:00:03Z\n'
    'power_price_per_kwh = "0.21"\npue = "1.25"\n'
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(
    devices=st.lists(device_intervals(), min_size=1, max_size=2),
    extra=st.integers(0, 40),
    status=st.sampled_from(["succeeded", "killed"]),
)
def test_the_run_is_priced_to_the_same_money_as_from_every_interval(
    sqlite_ledger: Ledger, devices: list[list[Interval]], extra: int, status: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    last_end = max(iv[1] for ivs in devices for iv in ivs)
    _store(sqlite_ledger, devices, last_end + extra / 4, status)
    for basis in ("busy", "allocated"):
        fast = run_costs(sqlite_ledger, [RUN], scope=None, card=CHANGE_CARD, basis=basis)
        with monkeypatch.context() as m:
            m.setattr(cq, "interval_sums", _reference_interval_sums)
            plain = run_costs(sqlite_ledger, [RUN], scope=None, card=CHANGE_CARD, basis=basis)
        assert fast == plain
        assert Decimal(fast["total"]["cost"]) >= 0
    if status == "killed":  # held until its last interval's end, on each GPU
        start = min(iv[0] for ivs in devices for iv in ivs)
        held_h = (last_end - start) * len(devices) / 3600
        assert fast["total"]["allocated_gpu_h"] == pytest.approx(held_h, abs=2e-6 * len(devices))
