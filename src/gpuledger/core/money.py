"""Exact units for cost arithmetic: integer quantities and integer money, Decimal at the edges.

Why integers: a bill must add up. Hours are counted in micro-GPU-hours (1 µh = 3.6 ms) and
energy in milliwatt-hours (1 mWh = 10^-6 kWh = 3.6 J), both exact decimal fractions of the
units prices are quoted in, so ``quantity x price`` is an exact decimal. Money is summed as an
integer count of 10^-21 currency units, which makes every total exactly the sum of its parts
(groups of a chargeback, a run split at a month boundary, attempts of one logical run).
Decimal is used where money enters (rate cards) and leaves (reports), never float.
"""

from __future__ import annotations

from decimal import Context, Decimal, InvalidOperation

__all__ = [
    "MONEY_SCALE",
    "PRICE_PLACES",
    "UH_PER_H",
    "decimal_places",
    "fmt_money",
    "joules_to_mwh",
    "money_decimal",
    "money_str",
    "parse_decimal",
    "price_units",
    "seconds_to_uh",
    "tidy",
]

UH_PER_H = 1_000_000  # quantities of GPU time: integer micro-GPU-hours
MWH_PER_KWH = 1_000_000  # energy: integer milliwatt-hours
PRICE_PLACES = 12  # prices are held as integer 10^-12 currency per hour / per kWh
PUE_PLACES = 3  # PUE as an integer count of thousandths
FACTOR_PLACES = 4  # A100-equivalent factors as integer ten-thousandths
MONEY_SCALE = 21  # money sums: integer 10^-21 currency (µh x 10^-12 price x 10^-3)
GPU_MONEY = 10 ** (MONEY_SCALE - 6 - PRICE_PLACES)  # µh x price units -> money units
UH_PER_S = UH_PER_H / 3600.0  # micro-GPU-hours per GPU-second
MWH_PER_J = 1 / 3.6  # milliwatt-hours per joule

# Large enough that no conversion here ever rounds (a sum of a year of money in 10^-21 units).
EXACT = Context(prec=80)


def seconds_to_uh(seconds: float) -> int:
    """Seconds of GPU time -> micro-GPU-hours (rounded to 3.6 ms, once, where measured time enters)."""
    return round(seconds * UH_PER_S)


def joules_to_mwh(joules: float) -> int:
    return round(joules * MWH_PER_J)


def decimal_places(value: Decimal) -> int:
    exponent = value.as_tuple().exponent
    return max(0, -exponent) if isinstance(exponent, int) else 0


def parse_decimal(value: object) -> Decimal:
    """A TOML value as a Decimal: a string ("2.50") or an integer exactly, a float through its
    shortest repr (2.74 -> Decimal("2.74")). ValueError for anything else or a non-finite value."""
    if isinstance(value, bool):
        raise ValueError("is a boolean, not an amount")
    if isinstance(value, int):
        return Decimal(value)
    if isinstance(value, float):
        value = repr(value)
    if not isinstance(value, str):
        raise ValueError(f'is a {type(value).__name__}, not an amount (write it like "2.50")')
    try:
        out = Decimal(value.strip().replace("_", ""))
    except InvalidOperation:
        raise ValueError(f'{value!r} is not a decimal amount (write it like "2.50")') from None
    if not out.is_finite():
        raise ValueError(f"{value!r} is not a finite amount")
    return out


def price_units(price: Decimal, places: int = PRICE_PLACES) -> int:
    """A price as an integer count of 10^-places; ValueError if that would round it."""
    scaled = price.scaleb(places, EXACT)
    if scaled != scaled.to_integral_value():
        raise ValueError(f"{price} has more than {places} decimal places")
    return int(scaled)


def gpu_money(uh: int, price_u: int) -> int:
    """Money units for ``uh`` micro-GPU-hours at ``price_u`` (10^-12 per GPU-hour)."""
    return uh * price_u * GPU_MONEY


def money_decimal(units: int) -> Decimal:
    """Money units (10^-21) -> the exact Decimal."""
    return Decimal(units).scaleb(-MONEY_SCALE, EXACT)


def tidy(value: Decimal) -> Decimal:
    """Trailing zeros dropped, at least two places kept: 2.745000 -> 2.745, 3 -> 3.00."""
    value = value.normalize(EXACT)
    if decimal_places(value) < 2:
        value = value.quantize(Decimal("0.01"), context=EXACT)
    return value


def money_str(units: int) -> str:
    """The exact amount as a plain decimal string with at least two places: "11.70", "0.0000125"."""
    return format(tidy(money_decimal(units)), "f")


def fmt_money(units: int | None, places: int = 2) -> str:
    """For people: rounded (half-even) to ``places``, thousands separated: "1,234.57"."""
    if units is None:
        return "n/a"
    value = money_decimal(units).quantize(Decimal(1).scaleb(-places), context=EXACT)
    return f"{value:,.{places}f}"
