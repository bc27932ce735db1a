"""The chargeback as FOCUS 1.0 rows: a simulated month in a real ledger, exported to CSV and Parquet,
read back and held to FOCUS 1.0's rules (tests/focus_spec_rules.py, written from the specification)
and to the chargeback of the same month, exactly. The FinOps Foundation's own validator runs on
the same files in tests/test_focus_validator.py."""

from __future__ import annotations

import datetime as dt
import json
from collections import defaultdict
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cost_sim import CARD, CHANGE_MIDDAY, MONTH
from cost_support import card, ts
from focus_spec_rules import COLUMNS as SPEC_COLUMNS
from focus_spec_rules import violations
from focus_support import CHANGE_RUN, LABELLED_RUN, month_ledger, read_csv, read_parquet
from gpuledger.core.chargeback.focus import FocusIdentity, build_focus
from gpuledger.core.chargeback.focus_columns import COLUMNS  # FOCUS 1.0, the rules this file holds them to
from gpuledger.core.money import money_decimal
from gpuledger.core.pricing.cost import Pricer, Usage, compact
from gpuledger.reports.cost.costing import chargeback
from gpuledger.reports.cost.focus import chargeback_focus
from gpuledger.reports.cost.focus_render import focus_csv, write_focus_parquet
from gpuledger.reports.cost.rollups import materialise_rollups

START, END = ts(MONTH[0]), ts(MONTH[1])
MONEY = ("BilledCost", "EffectiveCost", "ListCost", "ContractedCost", "x_IdleCost")


@pytest.fixture(scope="module")
def month(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The month exported from the runs' intervals, then again after ``report rollup``."""
    root = tmp_path_factory.mktemp("focus")
    led = month_ledger(root / "month.db")
    out: dict[str, Any] = {"root": root}
    for source in ("intervals", "rollups"):
        if source == "rollups":
            assert materialise_rollups(led)["runs"] > 0
        export = chargeback_focus(led, scope=None, card=CARD, start=START, end=END)
        cb = chargeback(led, scope=None, card=CARD, start=START, end=END, by=("gpu_model",), trend_months=0)
        csv_path, parquet_path = root / f"{source}.csv", root / f"{source}.parquet"
        csv_path.write_text(focus_csv(export, COLUMNS))
        write_focus_parquet(export, str(parquet_path), COLUMNS)
        out[source] = {"export": export, "chargeback": cb, "csv": csv_path, "parquet": parquet_path}
    led.close()
    return out


def _sum(rows: list[dict[str, Any]], column: str, **where: str) -> Decimal:
    return sum(
        (
            Decimal(str(r[column]))
            for r in rows
            if r[column] not in (None, "") and all(r[k] == v for k, v in where.items())
        ),
        Decimal(0),
    )


@pytest.mark.parametrize("source", ["intervals", "rollups"])
def test_focus_totals_equal_the_chargeback_exactly(month: dict[str, Any], source: str) -> None:
    part = month[source]
    cb, export = part["chargeback"], part["export"]
    _, rows = read_csv(part["csv"].read_text())
    # Money: to the last of the ledger's 21 decimal places, not only to the cent.
    exact_total = money_decimal(cb.total_units.cost)
    assert _sum(rows, "BilledCost") == exact_total == Decimal(cb.total["cost"])
    for column in ("EffectiveCost", "ListCost", "ContractedCost"):
        assert _sum(rows, column) == exact_total, column
    assert _sum(rows, "x_IdleCost") == Decimal(cb.total["idle_cost"])
    assert _sum(rows, "BilledCost", x_CostKind="energy") == Decimal(cb.total["energy_cost"]) > 0
    # Hours, A100-equivalent hours and energy, per GPU model, for every model the card prices.
    groups = {g["gpu_model"]: g for g in cb.groups}
    priced = [m for m, g in groups.items() if g["unpriced_gpu_h"] == 0]
    assert len(priced) >= 6
    for model in priced:
        g = groups[model]
        for column, figure in (
            ("x_AllocatedGpuHours", "allocated_gpu_h"),
            ("x_BusyGpuHours", "busy_gpu_h"),
            ("x_IdleGpuHours", "idle_gpu_h"),
            ("x_UnmeasuredGpuHours", "unmeasured_gpu_h"),
            ("x_A100EquivalentHours", "a100eq_h"),
            ("x_EnergyKwh", "energy_kwh"),
        ):
            assert float(_sum(rows, column, x_GpuModel=model)) == pytest.approx(g[figure], abs=1e-9), (model, column)
        assert _sum(rows, "BilledCost", x_GpuModel=model) == Decimal(g["cost"]), model
    # The hours no rate card line prices are not in the rows, and the export says so.
    unpriced = groups["RTX-4090"]["unpriced_gpu_h"]
    assert unpriced > 0 and not any(r["x_GpuModel"] == "RTX-4090" for r in rows)
    assert any(note.startswith(f"{unpriced} GPU-hours of RTX-4090 have no rate") for note in export.notes)


@pytest.mark.parametrize("source", ["intervals", "rollups"])
@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_every_row_keeps_focus_1_0_rules(month: dict[str, Any], source: str, fmt: str) -> None:
    part = month[source]
    if fmt == "csv":
        columns, rows = read_csv(part["csv"].read_text())
    else:
        columns, rows, _ = read_parquet(part["parquet"])
    assert len(rows) > 300
    assert violations(columns, rows, from_csv=fmt == "csv") == []


def test_custom_columns_start_with_x_in_both_files(month: dict[str, Any]) -> None:
    csv_columns, _ = read_csv(month["intervals"]["csv"].read_text())
    parquet_columns, _, _ = read_parquet(month["intervals"]["parquet"])
    assert csv_columns == parquet_columns
    custom = [c for c in csv_columns if c not in SPEC_COLUMNS]
    assert custom and all(c.startswith("x_") for c in custom), custom
    assert set(SPEC_COLUMNS) <= set(csv_columns)
    for wanted in ("x_BusyGpuHours", "x_A100EquivalentHours", "x_Team", "x_Project", "x_ModelVersion", "x_GpuModel"):
        assert wanted in custom


def test_parquet_holds_the_csv_values_exactly_as_decimal128(month: dict[str, Any]) -> None:
    part = month["intervals"]
    _, csv_rows = read_csv(part["csv"].read_text())
    columns, parquet_rows, schema = read_parquet(part["parquet"])
    for name in (*MONEY, "PricingQuantity", "ListUnitPrice", "x_BusyGpuHours", "x_A100EquivalentHours"):
        assert str(schema.field(name).type).startswith("decimal128(38,"), name
    for name in ("ChargePeriodStart", "ChargePeriodEnd", "BillingPeriodStart", "BillingPeriodEnd"):
        assert schema.field(name).type.tz == "UTC", name  # Parquet keeps seconds as milliseconds
    assert len(csv_rows) == len(parquet_rows)
    long_money = 0
    for text_row, typed_row in zip(csv_rows, parquet_rows, strict=True):
        for name in columns:
            text, typed = text_row[name], typed_row[name]
            if isinstance(typed, Decimal):
                assert Decimal(text) == typed, name
            elif isinstance(typed, dt.datetime):
                assert text == typed.strftime("%Y-%m-%dT%H:%M:%SZ"), name
            else:
                assert text == ("" if typed is None else typed), name
        long_money += len(text_row["BilledCost"].split(".")[1]) > 2  # exact, so not rounded to cents
    assert long_money > 100


def test_rows_per_utc_day_split_at_the_mid_day_price_change(month: dict[str, Any]) -> None:
    _, rows = read_csv(month["intervals"]["csv"].read_text())
    mine = [r for r in rows if r["ResourceId"] == CHANGE_RUN]
    change = dt.datetime.fromtimestamp(CHANGE_MIDDAY, tz=dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert [(r["ChargePeriodStart"], r["ChargePeriodEnd"], r["SkuPriceId"]) for r in mine] == [
        ("2026-03-20T00:00:00Z", change, "instance:p4d.24xlarge@start"),
        (change, "2026-03-21T00:00:00Z", f"instance:p4d.24xlarge@{change}"),
    ]
    # 2 GPUs x 2h07m30s at 21.96/8, then 2 x 2h52m30s at 19.20/8; busy basis, 60 % busy.
    before, after = mine
    assert Decimal(before["ListUnitPrice"]) == Decimal("2.745") and Decimal(after["ListUnitPrice"]) == Decimal("2.4")
    assert Decimal(before["ConsumedQuantity"]) == Decimal("4.25") and Decimal(after["ConsumedQuantity"]) == Decimal(
        "5.75"
    )
    assert Decimal(before["PricingQuantity"]) == Decimal("2.55") and Decimal(after["PricingQuantity"]) == Decimal(
        "3.45"
    )
    assert Decimal(before["BilledCost"]) == Decimal("2.55") * Decimal("2.745")
    assert {r["x_InstanceType"] for r in mine} == {"p4d.24xlarge"} and {r["x_PriceModel"] for r in mine} == {
        "cloud instance"
    }
    # A run crossing midnight: one row per UTC day, each ending at the next midnight.
    days = [r for r in rows if r["ResourceId"] == LABELLED_RUN]
    assert [(r["ChargePeriodStart"], r["ChargePeriodEnd"]) for r in days] == [
        ("2026-03-08T00:00:00Z", "2026-03-09T00:00:00Z"),
        ("2026-03-09T00:00:00Z", "2026-03-10T00:00:00Z"),
    ]
    assert [Decimal(r["ConsumedQuantity"]) for r in days] == [Decimal(2), Decimal(2)]


def test_labels_are_tags_and_custom_columns(month: dict[str, Any]) -> None:
    _, rows = read_csv(month["intervals"]["csv"].read_text())
    row = next(r for r in rows if r["ResourceId"] == LABELLED_RUN)
    assert row["Tags"] == '{"dataset": "coco", "model_version": "yolov8m-3", "project": "det", "team": "vision"}'
    assert (row["x_ModelVersion"], row["x_Team"], row["x_Project"], row["x_User"]) == (
        "yolov8m-3",
        "vision",
        "det",
        "ana",
    )
    assert (row["ResourceName"], row["x_LogicalRunId"], row["x_RunStatus"]) == (
        "yolo-v8m-3 training",
        LABELLED_RUN,
        "succeeded",
    )
    assert row["x_GpuModel"] == "H100-SXM" and Decimal(row["ListUnitPrice"]) == Decimal("6.88")
    # Attempts of a resumed training carry their logical run; partial runs their status.
    resumed = [r for r in rows if r["ResourceId"].endswith("-b")]
    assert resumed and all(r["x_LogicalRunId"] == r["ResourceId"][:-2] for r in resumed)
    assert {"killed", "lost", "failed"} <= {r["x_RunStatus"] for r in rows}
    assert any("shared:sm" in r["x_Flags"] for r in rows) and any("mig" in r["x_Flags"].split(";") for r in rows)


def test_on_prem_line_bills_amortised_gpu_hours_and_energy_in_rows_of_their_own(month: dict[str, Any]) -> None:
    _, rows = read_csv(month["intervals"]["csv"].read_text())
    v100 = [r for r in rows if r["x_GpuModel"] == "V100"]
    gpu = [r for r in v100 if r["x_CostKind"] == "GPU time"]
    energy = [r for r in v100 if r["x_CostKind"] == "energy"]
    assert gpu and len(energy) == len(gpu)
    assert {(r["x_PriceModel"], r["ListUnitPrice"], r["PricingUnit"], r["SkuId"]) for r in gpu} == {
        ("on-prem amortised", "0.570776", "GPU-Hours", "gpu:V100")
    }
    assert {(r["ListUnitPrice"], r["PricingUnit"], r["ServiceName"], r["SkuId"]) for r in energy} == {
        ("0.21", "Kilowatt-Hours", "GPU Energy", "energy:gpu:V100")
    }
    for g, e in zip(gpu, energy, strict=True):  # the energy row is the GPU row's day and run
        assert (g["ResourceId"], g["ChargePeriodStart"]) == (e["ResourceId"], e["ChargePeriodStart"])
        assert Decimal(e["PricingQuantity"]) == Decimal(g["x_EnergyKwh"]) and e["x_EnergyKwh"] == ""
        assert e["x_AllocatedGpuHours"] == "" and Decimal(e["BilledCost"]) == Decimal("0.21") * Decimal(
            e["PricingQuantity"]
        )
    assert "9000 / (3 y x 8760 h x 0.6)" in gpu[0]["ChargeDescription"]


# -- arithmetic, for any use ---------------------------------------------------------------------------

_CARD = card(
    """
[[gpu]]
model = "A100-40GB-SXM"
price_per_hour = "2.74"
effective_to = 2026-03-16T09:30:00Z

[[gpu]]
model = "A100-40GB-SXM"
price_per_hour = "2.5"
effective_from = 2026-03-16T09:30:00Z

[[gpu]]
model = "V100"
purchase_price = "9000"
lifetime_years = 3
expected_utilisation = "0.7"
power_price_per_kwh = "0.173"
pue = "1.37"
"""
)
_NAMES = ("NVIDIA A100-SXM4-40GB", "Tesla V100-SXM2-16GB", "NVIDIA GeForce RTX 4090")

usages = st.lists(
    st.tuples(
        st.sampled_from(_NAMES),
        st.integers(0, 5 * 24 * 3600),  # start, seconds after 2026-03-14
        st.integers(1, 30 * 3600),  # length
        st.floats(0, 1),  # utilisation
        st.one_of(st.none(), st.floats(0, 700)),  # watts
        st.integers(1, 8),  # GPUs
        st.sampled_from(["r1", "r2", "r3"]),
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=60, deadline=None)
@given(usages, st.sampled_from(["busy", "allocated"]), st.integers(0, 3 * 24 * 3600), st.integers(3600, 4 * 24 * 3600))
def test_rows_add_up_to_the_priced_pieces_exactly(raw, basis, window_at, window_len) -> None:  # type: ignore[no-untyped-def]
    base = ts("2026-03-14")
    start, end = base + window_at, base + window_at + window_len
    pricer = Pricer(_CARD, basis, start, end)
    pieces = []
    for name, at, length, util, watts, gpus, run in raw:
        t0 = base + at
        held = length * gpus
        energy = None if watts is None else watts * held
        pieces += [
            compact(p)
            for p in pricer.price(Usage(run, name, None, None, t0, t0 + length, held, held * util, energy, gpus))
        ]
    export = build_focus(
        pieces, {}, {}, card=_CARD, basis=basis, start=start, end=end, identity=FocusIdentity("Cluster")
    )
    priced = [v for _, model, _, _, _, v, _ in pieces if model != "RTX-4090"]
    assert sum((r["BilledCost"] for r in export.rows), Decimal(0)) == money_decimal(sum(v[5] for v in priced))
    assert (
        sum((r["x_AllocatedGpuHours"] or 0 for r in export.rows), Decimal(0))
        == Decimal(sum(v[0] for v in priced)) / 10**6
    )
    assert sum((r["x_IdleCost"] or 0 for r in export.rows), Decimal(0)) == money_decimal(sum(v[6] for v in priced))
    per_key: dict[tuple[Any, ...], int] = defaultdict(int)
    for r in export.rows:
        assert r["ListUnitPrice"] * r["PricingQuantity"] == r["ListCost"] == r["BilledCost"]
        assert start <= r["ChargePeriodStart"].timestamp() < r["ChargePeriodEnd"].timestamp() <= end
        day = r["ChargePeriodStart"].date()
        assert (r["ChargePeriodEnd"] - dt.timedelta(seconds=1)).date() == day  # inside one UTC day
        per_key[(r["ResourceId"], r["ChargePeriodStart"], r["SkuPriceId"])] += 1
    assert set(per_key.values()) <= {1}
    assert all(r["x_GpuModel"] != "RTX-4090" for r in export.rows)


def test_the_export_reads_the_same_on_sqlite_and_postgresql(ledger_url: str) -> None:
    from focus_support import add_run
    from gpuledger.store import Ledger

    led = Ledger(ledger_url)
    labels = {"team": "nlp", "project": "llm", "model_version": "v7", "owner note": 'a, b "c"'}
    add_run(led, "pg-a", "2026-03-10T20:00", 6, gpu_name="NVIDIA H100 80GB HBM3", labels=labels, gpus=2)
    add_run(led, "pg-b", "2026-03-11T01:00", 2, gpu_name="Tesla V100-SXM2-16GB", labels={})
    export = chargeback_focus(led, scope=None, card=CARD, start=START, end=END)
    cb = chargeback(led, scope=None, card=CARD, start=START, end=END, by=("team",), trend_months=0)
    led.close()
    assert sum((r["BilledCost"] for r in export.rows), Decimal(0)) == Decimal(cb.total["cost"])
    tags = {r["ResourceId"]: r["Tags"] for r in export.rows}
    assert tags == {"pg-a": json.dumps(labels, sort_keys=True), "pg-b": None}
    assert [(r["ResourceId"], r["ChargePeriodStart"].day, r["x_CostKind"]) for r in export.rows] == [
        ("pg-a", 10, "GPU time"), ("pg-a", 11, "GPU time"), ("pg-b", 11, "GPU time"), ("pg-b", 11, "energy"),
    ]  # fmt: skip
