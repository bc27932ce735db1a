"""The cost model on hand-computed cases (docs/CHARGEBACK.md)."""

from __future__ import annotations

from decimal import Decimal

import pytest

from cost_support import A100_250, H, card, ts, usage
from gpuledger.core.chargeback.report import Totals, usage_columns
from gpuledger.core.money import money_decimal, money_str
from gpuledger.core.pricing.cost import Pricer, month_bounds, month_of
from gpuledger.core.pricing.usage import held_span


def _totals(lines):  # type: ignore[no-untyped-def]
    t = Totals()
    for ln in lines:
        t.add(ln)
    return usage_columns(t)


def test_seed_case_6h_at_78_percent_on_an_a100_at_2_50() -> None:
    # The reference example: 6 h at 78 % mean utilisation on one A100 at $2.50/h -> 4.68 busy GPU-h -> $11.70.
    lines = Pricer(card(A100_250)).price(usage(ts("2026-03-10"), 6, util=0.78))
    row = _totals(lines)
    assert row["allocated_gpu_h"] == 6.0
    assert row["busy_gpu_h"] == 4.68
    assert row["idle_gpu_h"] == pytest.approx(1.32)
    assert row["cost"] == "11.70"
    assert Decimal(row["cost"]) == Decimal("11.70")
    assert row["idle_cost"] == "3.30"  # 1.32 h x 2.50, not billed on the busy basis
    assert row["mean_utilization"] == 0.78
    assert row["a100eq_h"] == pytest.approx(4.68 * 0.93)  # A100 40 GB SXM factor
    assert row["energy_kwh"] == pytest.approx(1.8)  # 300 W x 6 h


def test_allocated_basis_bills_held_hours() -> None:
    lines = Pricer(card(A100_250, basis="allocated")).price(usage(ts("2026-03-10"), 6, util=0.78))
    row = _totals(lines)
    assert row["cost"] == "15.00"
    assert row["idle_cost"] == "3.30"  # part of the 15.00
    assert row["busy_gpu_h"] == 4.68


def test_basis_override_wins_over_the_card() -> None:
    lines = Pricer(card(A100_250, basis="busy"), basis="allocated").price(usage(ts("2026-03-10"), 6, util=0.78))
    assert _totals(lines)["cost"] == "15.00"


def test_a_run_across_a_month_boundary_is_split_at_midnight_exactly() -> None:
    lines = Pricer(card(A100_250, basis="allocated")).price(usage(ts("2026-03-31T22:00"), 4, util=0.5))
    assert [ln.month for ln in lines] == ["2026-03", "2026-04"]
    assert [ln.alloc_uh for ln in lines] == [2_000_000, 2_000_000]
    assert [money_str(ln.cost) for ln in lines] == ["5.00", "5.00"]
    assert month_of(ts("2026-03-31T23:59:59")) == "2026-03"
    assert month_bounds("2026-12") == (ts("2026-12-01"), ts("2027-01-01"))


def test_a_price_change_mid_run_prices_each_part_by_its_own_rate() -> None:
    c = card(
        """
[[gpu]]
model = "A100-40GB-SXM"
price_per_hour = "2.00"
effective_to = 2026-03-15T12:00:00Z

[[gpu]]
model = "A100-40GB-SXM"
price_per_hour = "3.00"
effective_from = 2026-03-15T12:00:00Z
""",
        basis="allocated",
    )
    lines = Pricer(c).price(usage(ts("2026-03-15T10:00"), 4))
    assert [str(ln.line.rate) for ln in lines if ln.line] == ["2.00", "3.00"]
    assert money_decimal(sum(ln.cost for ln in lines)) == Decimal("10.00")  # 2 h x 2 + 2 h x 3


def test_instance_types_price_per_gpu_from_the_instance_price() -> None:
    c = card(
        """
[[instance]]
type = "p4d.24xlarge"
gpu_model = "A100-40GB-SXM"
gpus = 8
price_per_hour = "21.96"

[[instance]]
type = "a2-highgpu-1g"
gpu_model = "A100-40GB-SXM"
gpus = 1
vm_price_per_hour = "0.90"
gpu_price_per_hour = "2.90"
""",
        basis="allocated",
    )
    p4d = Pricer(c).price(usage(ts("2026-03-10"), 1, gpus=2, instance="p4d.24xlarge"))
    assert str(p4d[0].line.rate) == "2.745" and money_str(p4d[0].cost) == "5.49"
    gcp = Pricer(c).price(usage(ts("2026-03-10"), 2, instance="A2-HIGHGPU-1G"))  # types match any case
    assert money_str(gcp[0].cost) == "7.60"  # (0.90 VM + 2.90 GPU) x 2 h
    assert "VM 0.90" in gcp[0].line.derivation


def test_an_instance_without_its_own_price_falls_back_to_the_gpu_model() -> None:
    c = card(
        A100_250 + '\n[[instance]]\ntype = "p4d.24xlarge"\ngpu_model = "A100-40GB-SXM"\ngpus = 8\n', basis="allocated"
    )
    lines = Pricer(c).price(usage(ts("2026-03-10"), 1, instance="p4d.24xlarge"))
    assert money_str(lines[0].cost) == "2.50"
    unknown = Pricer(c).price(usage(ts("2026-03-10"), 1, instance="x9.mega"))
    assert "unknown_instance" in unknown[0].flags and money_str(unknown[0].cost) == "2.50"


def test_on_prem_rate_from_purchase_price_plus_energy_with_pue() -> None:
    c = card(
        """
[defaults]
power_price_per_kwh = "0.20"
pue = "1.5"

[[gpu]]
model = "H100-SXM"
purchase_price = "20000"
lifetime_years = 4
expected_utilisation = "0.5"
""",
        basis="busy",
    )
    lines = Pricer(c).price(usage(ts("2026-03-10"), 10, util=1.0, name="NVIDIA H100 80GB HBM3", watts=100))
    line = lines[0].line
    assert line is not None and str(line.rate) == "1.141553"  # 20000 / (4 x 8760 x 0.5), 6 places
    row = _totals(lines)
    assert row["energy_kwh"] == pytest.approx(1.5)  # 1 kWh at the GPU x PUE 1.5
    assert row["energy_cost"] == "0.30"
    assert Decimal(row["cost"]) == Decimal("11.41553") + Decimal("0.30")
    assert row["a100eq_h"] == pytest.approx(17.5)  # 10 busy h x 1.75


def test_mig_slice_is_priced_as_its_fraction_of_the_parent() -> None:
    c = card('[[gpu]]\nmodel = "A100-80GB-SXM"\nprice_per_hour = "3.43"\n', basis="allocated")
    lines = Pricer(c).price(usage(ts("2026-03-10"), 7, name="NVIDIA A100-SXM4-80GB", profile="3g.40gb", watts=None))
    assert lines[0].alloc_uh == 3_000_000  # 7 h x 3/7
    assert money_str(lines[0].cost) == "10.29"
    assert "mig" in lines[0].flags


def test_unknown_prices_and_unmeasured_busy_are_flagged_not_hidden() -> None:
    lines = Pricer(card(A100_250)).price(usage(ts("2026-03-10"), 2, name="NVIDIA GeForce RTX 4090"))
    assert lines[0].cost == 0 and lines[0].unpriced_uh == 2_000_000 and "unpriced" in lines[0].flags
    lines = Pricer(card(A100_250)).price(usage(ts("2026-03-10"), 2, util=None))
    assert "busy_unmeasured" in lines[0].flags
    assert money_str(lines[0].cost) == "5.00"  # busy basis, nothing measured: billed as held
    row = _totals(lines)
    assert row["unmeasured_gpu_h"] == 2.0 and row["idle_gpu_h"] == 0.0 and row["mean_utilization"] is None


def test_window_clips_a_run_exactly() -> None:
    start, end = month_bounds("2026-03")
    lines = Pricer(card(A100_250, basis="allocated"), start=start, end=end).price(usage(ts("2026-02-28T20:00"), 10))
    assert [ln.month for ln in lines] == ["2026-03"]
    assert lines[0].alloc_uh == 6_000_000


@pytest.mark.parametrize(
    ("status", "ended", "last", "expected_end"),
    [
        ("succeeded", 100.0, 90.0, 100.0),  # a finished run held its GPUs to its end
        ("killed", 100.0, 90.0, 90.0),  # priced up to its last recorded interval
        ("lost", None, 70.0, 70.0),
        ("failed", 100.0, None, 10.0),  # nothing recorded: nothing priced
        ("running", None, 50.0, 50.0),
    ],
)
def test_held_span(status: str, ended: float | None, last: float | None, expected_end: float) -> None:
    assert held_span(status, 10.0, ended, last) == (10.0, expected_end)


def test_money_strings_are_exact_with_two_places_at_least() -> None:
    lines = Pricer(card('[[gpu]]\nmodel = "A100-40GB-SXM"\nprice_per_hour = "2.745"\n', basis="allocated")).price(
        usage(ts("2026-03-10"), 1.234567)
    )
    assert money_str(lines[0].cost) == "3.388886415"  # 1.234567 h x 2.745, exact
    assert H == 3600.0
