"""The number policy of core/units.py: what people read is plain, rounded the same way everywhere,
and never turns a measurement into a fake zero."""

from __future__ import annotations

import math
import re
from decimal import Decimal

from hypothesis import given
from hypothesis import strategies as st

from gpuledger.core.units import (
    change_pct,
    fmt_bytes,
    fmt_change,
    fmt_count,
    fmt_duration,
    fmt_hours,
    fmt_kwh,
    fmt_money,
    fmt_number,
    fmt_pct,
    fmt_percent,
    fmt_seconds,
)

PLAIN = re.compile(r"^-?[0-9]{1,3}(,[0-9]{3})*(\.[0-9]+)?$")
quantities = st.floats(min_value=1e-8, max_value=1e15, allow_nan=False, allow_infinity=False)


def _parse(text: str) -> float:
    return float(text.replace(",", ""))


def _significant(text: str) -> int:
    digits = text.replace(",", "").replace("-", "").replace(".", "").lstrip("0")
    return len(digits)


@given(quantities, st.booleans())
def test_quantities_are_plain_decimals_with_three_significant_digits(value: float, negative: bool) -> None:
    v = -value if negative else value
    text = fmt_number(v)
    assert PLAIN.match(text), text  # no exponent, grouped thousands
    assert text.lstrip("-") != "0"  # a measured non-zero value never reads as zero
    if abs(v) >= 1e-5:
        assert math.isclose(_parse(text), v, rel_tol=0.0051)  # within half a unit of the third digit
    else:  # eight decimals at most: fewer digits, still within half the last one
        assert math.isclose(_parse(text), v, abs_tol=5.01e-9)
    if 1e-5 <= abs(v) < 1000:
        assert _significant(text) == 3, text


def test_examples_from_the_issue_read_plainly() -> None:
    assert fmt_kwh(7.6e-05) == "0.0000760 kWh"  # was "7.6e-05 kWh"
    # One line, one rule: no more "allocated 0.02 busy 0.01 idle 0.0051".
    assert [fmt_hours(h) for h in (0.0171, 0.0120, 0.0051)] == ["0.0171", "0.0120", "0.00510"]
    assert fmt_number(1234.5) == "1,235" and fmt_number(2.675) == "2.68"  # half up, as people round
    assert fmt_number(9.996) == "10.0" and fmt_number(99.96) == "100"  # rounding up keeps 3 digits
    assert fmt_number(1e-9) == "<0.00000001" and fmt_number(0.0) == "0"
    assert fmt_seconds(12345.6) == "12,346 s" and fmt_seconds(0.0304) == "0.0304 s"


@given(st.decimals(min_value=Decimal("-1e9"), max_value=Decimal("1e9"), allow_nan=False, allow_infinity=False,
                   places=8))  # fmt: skip
def test_money_is_cents_for_people_and_never_a_fake_zero(amount: Decimal) -> None:
    text = fmt_money(amount, "USD")
    assert text.endswith(" USD")
    shown = text.removesuffix(" USD")
    if amount == 0:
        assert shown == "0.00"
    elif abs(amount) < Decimal("0.005"):
        assert shown in ("<0.01", ">-0.01")  # less than a cent, but not nothing
    else:
        assert re.match(r"^-?[0-9]{1,3}(,[0-9]{3})*\.[0-9]{2}$", shown), shown
        assert abs(Decimal(shown.replace(",", "")) - amount) <= Decimal("0.005")


def test_money_examples() -> None:
    assert fmt_money("0.03974341", "USD") == "0.04 USD"  # was "0.03974341 USD"
    assert fmt_money("1234.565") == "1,234.56"  # banker's rounding of the exact decimal
    assert fmt_money(None) == "n/a" and fmt_money("NaN") == "n/a"


@given(st.floats(allow_nan=False, allow_infinity=False, min_value=-1e6, max_value=1e6),
       st.floats(allow_nan=False, allow_infinity=False, min_value=-1e6, max_value=1e6))  # fmt: skip
def test_a_change_from_zero_has_no_percentage(value: float, base: float) -> None:
    pct = change_pct(value, base)
    if base == 0:
        assert pct is None and fmt_change(pct) == "n/a"
    elif pct is None:  # a base so small the change overflows: no percentage either
        assert abs(base) < 1e-300 and fmt_change(pct) == "n/a"
    else:
        assert pct is not None and math.isclose(pct, (value - base) / abs(base) * 100, rel_tol=1e-9, abs_tol=1e-9)
        assert re.match(r"^[+-][0-9,]+(\.[0-9])?%$", fmt_change(pct)), fmt_change(pct)


def test_change_examples() -> None:
    assert fmt_change(change_pct(125, 100)) == "+25.0%"
    assert fmt_change(change_pct(101, 0.25)) == "+40,300%"  # whole percent once it is that large
    assert fmt_change(change_pct(12.5, 0)) == "n/a"  # was "+35835.2 %" of a zero


def test_percent_shares() -> None:
    assert [fmt_pct(r) for r in (0.625, 0.045, 0.0004, 0.0, None)] == ["62%", "4.5%", "<0.1%", "0%", "n/a"]
    assert fmt_percent(100.0) == "100%"


def test_counted_nouns_agree() -> None:
    assert [fmt_count(n, "run") for n in (0, 1, 2, 1000)] == ["0 runs", "1 run", "2 runs", "1,000 runs"]
    assert fmt_count(1, "row") == "1 row" and fmt_count(3, "query", "queries") == "3 queries"


@given(st.floats(min_value=0.0001, max_value=59.9, allow_nan=False))
def test_durations_under_a_minute_are_seconds_never_zero(seconds: float) -> None:
    text = fmt_duration(seconds)
    assert text.endswith(" s") and _parse(text.removesuffix(" s")) > 0  # a sub-second epoch is not "0:00:00"


def test_bytes_round_first_then_pick_the_unit() -> None:
    # Each was one unit too small or one digit too many: "1024 KiB", "10.00 KiB", "100.0 GiB", "1024 GiB".
    assert fmt_bytes(2**20 - 1) == "1.00 MiB"
    assert fmt_bytes(10 * 1024 - 1) == "10.0 KiB"
    assert fmt_bytes(100 * 2**30 - 2**20) == "100 GiB"
    assert fmt_bytes(2**40 - 2**28) == "1.00 TiB"
    assert fmt_bytes(1023.6) == "1.00 KiB" and fmt_bytes(1023) == "1023 B"


@given(st.integers(min_value=1024, max_value=2**60))
def test_bytes_have_three_significant_digits_below_1024_of_their_unit(n: int) -> None:
    value, unit = fmt_bytes(n).split()
    assert unit != "B" and 1.0 <= float(value) < 1024 and _significant(value) == (3 if float(value) < 1000 else 4)
