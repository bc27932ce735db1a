"""The FOCUS rows of a day on which the price changes: one row per span of the day at one price,
whose charge period is that span, in time order, however the priced pieces reach the exporter.

``build_focus`` takes cost.Pricer's pieces in any order (its contract names no order; the property
test in tests/test_focus.py hands it several uses of a run as they come). The capacity export's
rows follow the same spans. A row's charge period is where its price was in force that day, never
the rate card line's whole span: an instance price that ends at noon falls back to the GPU model's
price for the afternoon only, and a price in force for two hours of a day splits the other price's
day in two rows.
"""

from __future__ import annotations

import datetime as dt
import itertools
from decimal import Decimal
from typing import Any

from cost_support import card, ts, usage
from gpuledger.core.capacity.focus import capacity_rows
from gpuledger.core.capacity.model import DAY_MS, FleetGpu, ms
from gpuledger.core.capacity.pools import Pools
from gpuledger.core.capacity.report import build_capacity
from gpuledger.core.chargeback.focus import FocusIdentity, build_focus
from gpuledger.core.pricing.cost import Compact, Pricer, compact

# The 3.00 line is listed first: the card's own order must not decide the rows' order either.
CARD = card(
    """
[[gpu]]
model = "A100-40GB-SXM"
price_per_hour = "3.00"
effective_from = 2026-03-16T12:00:00Z

[[gpu]]
model = "A100-40GB-SXM"
price_per_hour = "2.00"
effective_to = 2026-03-16T12:00:00Z
""",
    basis="allocated",
)
START, END = ts("2026-03-01"), ts("2026-04-01")
UTC = dt.timezone.utc
MIDNIGHT, NOON, NEXT = (dt.datetime(2026, 3, d, h, tzinfo=UTC) for d, h in ((16, 0), (16, 12), (17, 0)))


def _pieces(run_id: str, morning_h: float, afternoon_h: float) -> tuple[list[Compact], list[Compact]]:
    """A run's two GPUs that day, priced one use each as the usage reader hands them over: one held
    from 08:00 (before the change), one from 14:00 (after it)."""
    pricer = Pricer(CARD, None, START, END)
    morning = usage(ts("2026-03-16T08:00"), morning_h, run_id=run_id)
    afternoon = usage(ts("2026-03-16T14:00"), afternoon_h, run_id=run_id)
    return [compact(p) for p in pricer.price(morning)], [compact(p) for p in pricer.price(afternoon)]


def _export(items: list[Compact]) -> list[dict[str, Any]]:
    return build_focus(
        items, {}, {}, card=CARD, basis="allocated", start=START, end=END, identity=FocusIdentity("Cluster")
    ).rows


def test_the_morning_price_comes_first_even_when_the_afternoon_piece_arrives_first() -> None:
    morning, afternoon = _pieces("r1", 3, 2)
    rows = _export([*afternoon, *morning])
    # What a reader of the file sees for the day: 00:00-12:00 at the old price, then 12:00-24:00 at the new.
    assert [
        (r["ChargePeriodStart"], r["ChargePeriodEnd"], r["ListUnitPrice"], r["PricingQuantity"], r["SkuPriceId"])
        for r in rows
    ] == [
        (MIDNIGHT, NOON, Decimal("2"), Decimal(3), "gpu:A100-40GB-SXM@start"),
        (NOON, NEXT, Decimal("3"), Decimal(2), "gpu:A100-40GB-SXM@2026-03-16T12:00:00Z"),
    ]


def test_the_file_is_the_same_whatever_order_the_pieces_arrive_in() -> None:
    # Two runs on the same day, each with a GPU before and one after the change.
    pieces = [p for run_id in ("r1", "r2") for part in _pieces(run_id, 3, 2) for p in part]
    assert len(pieces) == 4
    expected = _export(pieces)  # the pieces in time order, run by run
    assert [(r["ResourceId"], r["ChargePeriodStart"], r["ListUnitPrice"]) for r in expected] == [
        ("r1", MIDNIGHT, Decimal("2")),
        ("r1", NOON, Decimal("3")),
        ("r2", MIDNIGHT, Decimal("2")),
        ("r2", NOON, Decimal("3")),
    ]
    for order in itertools.permutations(pieces):
        assert _export(list(order)) == expected, [f"{p[0]} {dt.datetime.fromtimestamp(p[4], UTC):%H:%M}" for p in order]


# The instance's own price holds from 08:00 to 12:00 only; the rest of the day is the model's.
WINDOW = card(
    """
[[gpu]]
model = "A100-40GB-SXM"
price_per_hour = "2.00"

[[instance]]
type = "p4d.24xlarge"
gpu_model = "A100-40GB-SXM"
gpus = 8
price_per_hour = "40.00"
effective_from = 2026-03-16T08:00:00Z
effective_to = 2026-03-16T12:00:00Z
""",
    basis="allocated",
)
EIGHT = dt.datetime(2026, 3, 16, 8, tzinfo=UTC)


def _spans(rows: list[dict[str, Any]]) -> list[tuple[dt.datetime, dt.datetime, Decimal]]:
    return [(r["ChargePeriodStart"], r["ChargePeriodEnd"], r["ListUnitPrice"]) for r in rows]


def test_a_price_in_force_for_part_of_a_day_gives_rows_that_never_overlap() -> None:
    pricer = Pricer(WINDOW, None, START, END)
    whole_day = usage(ts("2026-03-16"), 24, run_id="r1", instance="p4d.24xlarge")
    rows = build_focus([compact(p) for p in pricer.price(whole_day)], {}, {}, card=WINDOW, basis="allocated",
                       start=START, end=END, identity=FocusIdentity("Cluster")).rows  # fmt: skip
    assert _spans(rows) == [(MIDNIGHT, EIGHT, Decimal(2)), (EIGHT, NOON, Decimal(5)), (NOON, NEXT, Decimal(2))]
    assert [r["PricingQuantity"] for r in rows] == [Decimal(8), Decimal(4), Decimal(12)]


def test_the_capacity_export_splits_a_gpu_day_at_the_same_spans() -> None:
    day = ts("2026-03-16")
    gpu = FleetGpu("g", "NVIDIA A100-SXM4-40GB", "n1", day, day + 86400, instance_type="p4d.24xlarge")
    row = ("g", ms(day) // DAY_MS, "n1", ms(day), ms(day) + DAY_MS, DAY_MS, 0, 0, 0, 0, None)
    pieces: list[tuple[Any, ...]] = []
    build_capacity(gpus=[gpu], day_rows=[row], card=WINDOW, pools=Pools(), start=day, end=day + 86400,
                   on_piece=pieces.append)  # fmt: skip
    rows = capacity_rows(reversed(pieces), {"g": gpu}, card=WINDOW, start=day, end=day + 86400,
                         identity=FocusIdentity("Cluster")).rows  # fmt: skip
    assert _spans(rows) == [(MIDNIGHT, EIGHT, Decimal(2)), (EIGHT, NOON, Decimal(5)), (NOON, NEXT, Decimal(2))]
    assert [r["PricingQuantity"] for r in rows] == [Decimal(8), Decimal(4), Decimal(12)]
