"""The capacity report's rules in isolation: the unbilled cost split exactly (property tests), pools
resolved and refused as documented, fleet statuses, and a price change inside a day."""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cost_support import card, price_change, ts
from gpuledger.core.capacity.fleet import SILENT_AFTER_S, fleet_rows
from gpuledger.core.capacity.model import DAY_MS, FleetGpu, HostStay, ms
from gpuledger.core.capacity.pools import Pools, PoolsError, parse_pools
from gpuledger.core.capacity.report import TeamBill, build_capacity, share_pool


@given(st.integers(-(10**30), 10**30), st.lists(st.integers(0, 10**13), min_size=1, max_size=12))
def test_the_unbilled_cost_is_split_exactly_by_weight(pool: int, weights: list[int]) -> None:
    parts = share_pool(pool, weights)
    if not any(weights):
        assert parts == [0] * len(weights)  # nobody to share with: nothing is handed out
        return
    assert sum(parts) == pool
    whole = sum(weights)
    for part, w in zip(parts, weights, strict=True):
        assert abs(Fraction(part) - Fraction(pool * w, whole)) < 1


def test_pools_take_the_first_matching_pattern_and_default_to_instance_type_or_model() -> None:
    pools = parse_pools('[[pool]]\nname = "a"\nhosts = ["gpu-*"]\n\n[[pool]]\nname = "b"\nhosts = "gpu-7"\n')
    assert pools.name("gpu-7", None, "H100-SXM") == "a"
    assert pools.name("cpu-1", "p5.48xlarge", "H100-SXM") == "p5.48xlarge"
    assert Pools().name("cpu-1", None, "H100-SXM") == "H100-SXM"
    assert pools.instance_type("gpu-1", "g6.xlarge") == "g6.xlarge"  # the agent's own word, without a pool's


def test_a_broken_pools_file_names_every_problem_with_its_line() -> None:
    text = (
        '[pools]\nx = 1\n\n[[pool]]\nname = "a"\nhosts = ["x"]\ncolour = "red"\n\n[[pool]]\nname = "a"\nhosts = ["y"]\n'
    )
    with pytest.raises(PoolsError) as err:
        parse_pools(text, "p.toml")
    assert err.value.problems == [
        "p.toml: file pools: unknown table (a pools file holds [[pool]] entries only)",
        "p.toml:7: [[pool]] #1 colour: unknown key (expected one of: description, hosts, instance_type, name)",
        "p.toml:10: [[pool]] #2 name: 'a' is the name of an earlier pool",
    ]
    with pytest.raises(PoolsError, match=r"p\.toml"):
        parse_pools("[[pool]\n", "p.toml")  # a TOML syntax error, with the file's name


def _gpu(uuid: str, host: str, last: float, source: str = "agent") -> FleetGpu:
    return FleetGpu(uuid, "NVIDIA L4", host, 0.0, last, (HostStay(host, 0.0, last),), source=source)


def test_fleet_status_says_present_missing_silent() -> None:
    now = 1_000_000.0
    gpus = [_gpu("a", "n1", now - 30), _gpu("b", "n1", now - 3600), _gpu("c", "n2", now - 2 * SILENT_AFTER_S),
            _gpu("d", "ws", now, source="runs")]  # fmt: skip
    rows = {r["gpu"]: r["status"] for r in fleet_rows(gpus, card=card(""), pools=Pools(), now=now)}
    assert rows == {"a": "present", "b": "missing", "c": "silent", "d": "in use"}


def test_a_price_change_inside_a_day_splits_that_day_in_proportion_to_time() -> None:
    l4 = price_change("L4", "2026-03-10T06:00:00Z", "1.00", "2.00")
    day = ts("2026-03-10")
    gpu = FleetGpu("g", "NVIDIA L4", "n1", day, day + 86400)
    row = ("g", int(day * 1000) // DAY_MS, "n1", ms(day), ms(day) + DAY_MS, DAY_MS, 0, 0, 0, 0, None)
    report = build_capacity(gpus=[gpu], day_rows=[row], card=l4, pools=Pools(), start=day, end=day + 86400)
    assert report.total["asset_cost"] == "42.00"  # 6 h at 1.00 + 18 h at 2.00


@pytest.mark.parametrize("pieces", [False, True], ids=["summed", "piece by piece"])
def test_a_gpu_day_wholly_after_a_price_change_is_priced_at_the_new_price(pieces: bool) -> None:
    # The price changes at 06:00; the GPU is in the fleet from 10:00 to 12:00 only, so all of its
    # day is at the new price, not at the price the day started with.
    l4 = price_change("L4", "2026-03-10T06:00:00Z", "1.00", "2.00")
    day = ts("2026-03-10")
    gpu = FleetGpu("g", "NVIDIA L4", "n1", day + 10 * 3600, day + 12 * 3600)
    row = ("g", int(day * 1000) // DAY_MS, "n1", ms(day) + 10 * 3_600_000, ms(day) + 12 * 3_600_000,
           2 * 3_600_000, 0, 0, 0, 0, None)  # fmt: skip
    got: list[tuple[object, ...]] = []
    report = build_capacity(gpus=[gpu], day_rows=[row], card=l4, pools=Pools(), start=day, end=day + 86400,
                            on_piece=got.append if pieces else None)  # fmt: skip
    assert report.total["asset_cost"] == "4.00"  # 2 h at 2.00
    if pieces:
        assert [p[6].rate for p in got] == [Decimal("2.00")]


@pytest.mark.parametrize("pieces", [False, True], ids=["summed", "piece by piece"])
def test_a_gpu_moved_mid_day_is_priced_where_each_host_had_it(pieces: bool) -> None:
    # Observed on A 00:00-10:00, unobserved 10:00-11:00 (the move), on B 11:00-24:00; the price goes
    # from 1.00 to 2.00 at 05:00. A: 5 h x 1 + 5 h x 2; B (and the unobserved hour put on it): 14 h x 2.
    l4 = price_change("L4", "2026-03-10T05:00:00Z", "1.00", "2.00")
    day, hour = ts("2026-03-10"), 3_600_000
    d, t0 = int(day * 1000) // DAY_MS, ms(day)
    stays = (HostStay("A", day, day + 10 * 3600), HostStay("B", day + 11 * 3600, day + 86400))
    gpu = FleetGpu("g", "NVIDIA L4", "B", day, day + 86400, stays)
    rows = [("g", d, "A", t0, t0 + 10 * hour, 10 * hour, 0, 0, 0, 0, None),
            ("g", d, "B", t0 + 11 * hour, t0 + 24 * hour, 13 * hour, 0, 0, 0, 0, None)]  # fmt: skip
    got: list[tuple[object, ...]] = []
    report = build_capacity(gpus=[gpu], day_rows=rows, card=l4, pools=Pools(), start=day, end=day + 86400,
                            by=("host",), on_piece=got.append if pieces else None)  # fmt: skip
    assert {g["host"]: g["asset_cost"] for g in report.groups} == {"A": "15.00", "B": "28.00"}
    assert report.total["asset_cost"] == "43.00"


def test_unobserved_time_goes_to_the_same_host_whatever_order_the_rows_come_in() -> None:
    # Two hosts observed the GPU equally long; the two unobserved hours go to the first by name, so
    # the per-host report does not depend on the order the database hands the rows in.
    day, hour = ts("2026-03-10"), 3_600_000
    d, t0 = int(day * 1000) // DAY_MS, ms(day)
    gpu = FleetGpu("g", "NVIDIA L4", "b", day, day + 86400, (HostStay("a", day, day + 86400),))
    rows = [("g", d, "b", t0, t0 + 11 * hour, 11 * hour, 0, 0, 0, 0, None),
            ("g", d, "a", t0 + 13 * hour, t0 + 24 * hour, 11 * hour, 0, 0, 0, 0, None)]  # fmt: skip
    l4 = card('[[gpu]]\nmodel = "L4"\nprice_per_hour = "1.00"\n')
    for order in (rows, rows[::-1]):
        report = build_capacity(gpus=[gpu], day_rows=order, card=l4, pools=Pools(), start=day, end=day + 86400,
                                by=("host",))  # fmt: skip
        assert {g["host"]: g["unobserved_gpu_h"] for g in report.groups} == {"a": 2.0, "b": 0.0}


def test_shares_are_written_with_their_rule_and_add_up_to_the_fleet_cost() -> None:
    day = ts("2026-03-10")
    gpu = FleetGpu("g", "NVIDIA L4", "n1", day, day + 86400)
    row = ("g", int(day * 1000) // DAY_MS, "n1", ms(day), ms(day) + DAY_MS, DAY_MS // 2, DAY_MS // 2, 0, 0, 0, None)
    l4 = card('[[gpu]]\nmodel = "L4"\nprice_per_hour = "1.00"\n')
    bills = [TeamBill("a", 3_000_000, 1_000_000, 10**21), TeamBill(None, 1_000_000, 3_000_000, 0)]
    report = build_capacity(gpus=[gpu], day_rows=[row], card=l4, pools=Pools(), start=day, end=day + 86400,
                            share_rule="busy", bills=bills)  # fmt: skip
    shares = {r["team"]: r for r in report.shares}
    assert (shares["a"]["shared_idle_cost"], shares[None]["shared_idle_cost"]) == ("5.75", "17.25")  # 23 x 1/4, 3/4
    assert report.shares_total["total_cost"] == report.total["fleet_cost"] == "24.00"
