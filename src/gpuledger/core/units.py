"""Unit conversions and the one policy for showing numbers to people.

Machines get exact values (JSON, CSV, Parquet); people get these strings, the same in every
table, summary and report:

- Quantities (GPU-hours, kWh, seconds, MB/s ...): three significant digits, ``4.68``, ``12.3``,
  ``0.0123``, ``0.0000783``; from 1,000 up the whole integer part with separators (``12,346``).
  Never scientific notation: at most eight decimals, and a non-zero value below 0.00000001 is
  ``<0.00000001``, never ``0``.
- Readings a sensor gives in whole units: watts and °C, no decimals.
- Shares in percent: whole numbers from 10 % up, one decimal below (``4.5%``), ``<0.1%`` for a
  non-zero share that would round to nothing.
- Changes in percent: signed, one decimal below 100 % (``+25.0%``), whole above (``+232%``);
  a change from zero has no percentage: ``n/a``.
- Money: rounded to cents (``1,234.56 USD``; ``<0.01 USD`` for a non-zero amount under a cent);
  JSON and CSV keep the exact decimal string.
- Durations: under a minute in seconds with three significant digits (``0.412 s``), then
  ``h:mm:ss`` (hours keep counting past 24).
- GPU time summed over GPUs (it can exceed the wall time, so never a clock time): ``540 GPU-s``,
  from an hour ``1.50 GPU-h``.
- Bytes: binary units, three significant digits (``1.50 GiB``).
- Counts carry their noun in the right number: ``1 run``, ``2 runs``.
- Absent (None, NaN, infinity) is ``n/a``: never shown as 0.
"""

from __future__ import annotations

import math
from datetime import datetime, timezone
from decimal import ROUND_HALF_EVEN, ROUND_HALF_UP, Decimal, InvalidOperation

__all__ = [
    "J_PER_KWH",
    "NA",
    "S_PER_H",
    "change_pct",
    "fmt_bytes",
    "fmt_celsius",
    "fmt_change",
    "fmt_count",
    "fmt_duration",
    "fmt_gpu_seconds",
    "fmt_hours",
    "fmt_kwh",
    "fmt_money",
    "fmt_number",
    "fmt_pct",
    "fmt_percent",
    "fmt_seconds",
    "fmt_watts",
    "iso_utc",
    "joules_to_kwh",
    "seconds_to_hours",
]

NA = "n/a"
S_PER_H = 3600.0
J_PER_KWH = 3.6e6
SIGNIFICANT = 3
MAX_DECIMALS = 8
CENT = Decimal("0.01")

_BINARY_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")


def seconds_to_hours(seconds: float | None) -> float | None:
    return None if seconds is None else seconds / S_PER_H


def joules_to_kwh(joules: float | None) -> float | None:
    return None if joules is None else joules / J_PER_KWH


def iso_utc(epoch: float | None) -> str | None:
    """Epoch seconds -> "2024-05-01T10:00:00.000Z" (UTC, milliseconds)."""
    if epoch is None:
        return None
    stamp = datetime.fromtimestamp(epoch, tz=timezone.utc).isoformat(timespec="milliseconds")
    return stamp.replace("+00:00", "Z")


def _absent(value: object) -> bool:
    if value is None:
        return True
    try:
        return not math.isfinite(float(value))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return True


def fmt_number(value: float | None, sig: int = SIGNIFICANT) -> str:
    """A quantity with ``sig`` significant digits, plain decimal notation (see the module policy)."""
    if _absent(value):
        return NA
    v = float(value)  # type: ignore[arg-type]
    if v == 0:
        return "0"
    mag = abs(v)
    if mag < 10**-MAX_DECIMALS:
        tiny = f"{10**-MAX_DECIMALS:.{MAX_DECIMALS}f}"
        return f"<{tiny}" if v > 0 else f">-{tiny}"
    decimals = 0 if mag >= 10 ** max(sig, 3) else min(MAX_DECIMALS, max(0, sig - 1 - math.floor(math.log10(mag))))
    # 9.996 rounds to 10.0, not 10.00; an exact power of ten (a float 10**-2 is a hair above 0.01)
    if decimals and _half_up(mag, decimals) >= Decimal(10) ** (sig - decimals):
        decimals -= 1
    return f"{_half_up(v, decimals):,f}"


def _half_up(value: float, decimals: int) -> Decimal:
    """Rounded as people round (2.675 -> 2.68, 1234.5 -> 1235), from the shortest decimal form."""
    return Decimal(repr(value)).quantize(Decimal(1).scaleb(-decimals), rounding=ROUND_HALF_UP)


def fmt_bytes(n: float | None) -> str:
    """1536 -> "1.50 KiB"; binary units, 3 significant digits, whole bytes below 1 KiB.

    Rounded first, then the unit picked: 1,048,575 B is "1.00 MiB" (not "1024 KiB") and
    10,239 B is "10.0 KiB" (not "10.00 KiB")."""
    if _absent(n):
        return NA
    assert n is not None
    size, unit = float(n), 0
    while True:
        digits = 0 if unit == 0 else _byte_decimals(size)
        shown = abs(float(f"{size:.{digits}f}"))
        if shown >= 1024 and unit < len(_BINARY_UNITS) - 1:
            size /= 1024
            unit += 1
            continue
        if unit == 0:
            return f"{round(size)} B"
        digits = _byte_decimals(shown)  # 9.996 shows as 10.00: three digits are 10.0
        return f"{size:.{digits}f} {_BINARY_UNITS[unit]}"


def _byte_decimals(size: float) -> int:
    return 2 if abs(size) < 10 else 1 if abs(size) < 100 else 0


def fmt_duration(seconds: float | None) -> str:
    """Under a minute: "0.412 s", "12.3 s"; then "h:mm:ss" (hours keep counting past 24: "26:03:07")."""
    if _absent(seconds):
        return NA
    assert seconds is not None
    if abs(seconds) < 59.95:
        return f"{fmt_number(seconds)} s"
    sign = "-" if seconds < 0 else ""
    total = round(abs(seconds))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{sign}{hours}:{minutes:02d}:{secs:02d}"


def fmt_gpu_seconds(seconds: float | None) -> str:
    """GPU-seconds summed over GPUs: "540 GPU-s", from an hour "1.50 GPU-h" (never h:mm:ss: eight
    GPUs busy for an hour are 8.00 GPU-h, which is no clock time)."""
    if _absent(seconds):
        return NA
    s = float(seconds)  # type: ignore[arg-type]
    return f"{fmt_number(s / S_PER_H)} GPU-h" if abs(s) >= S_PER_H else f"{fmt_number(s)} GPU-s"


def fmt_seconds(seconds: float | None) -> str:
    """CPU-seconds and the like: "12,346 s", "0.0304 s"."""
    return NA if _absent(seconds) else f"{fmt_number(seconds)} s"


def fmt_hours(hours: float | None) -> str:
    """GPU-hours: "4.68", "0.0123" (three significant digits)."""
    return fmt_number(hours)


def fmt_kwh(kwh: float | None) -> str:
    return NA if _absent(kwh) else f"{fmt_number(kwh)} kWh"


def fmt_percent(pct: float | None) -> str:
    """A value already in percent (0-100) -> "78%", "4.5%", "<0.1%"."""
    if _absent(pct):
        return NA
    p = float(pct)  # type: ignore[arg-type]
    if p == 0:
        return "0%"
    if abs(p) >= 9.95:
        return f"{p:.0f}%"
    if abs(p) < 0.05:
        return "<0.1%" if p > 0 else ">-0.1%"
    return f"{p:.1f}%"


def fmt_pct(ratio: float | None) -> str:
    """A 0-1 ratio -> "78%"."""
    return NA if _absent(ratio) else fmt_percent(float(ratio) * 100)  # type: ignore[arg-type]


def change_pct(value: float | None, base: float | None) -> float | None:
    """(value - base) / |base| in percent; None when either is absent or the base is zero (or so
    close to it that the change is not a number)."""
    if _absent(value) or _absent(base) or float(base) == 0:  # type: ignore[arg-type]
        return None
    pct = (float(value) - float(base)) / abs(float(base)) * 100  # type: ignore[arg-type]
    return pct if math.isfinite(pct) else None


def fmt_change(pct: float | None) -> str:
    """A percent change -> "+25.0%", "-3.2%", "+232%"; None (a change from zero) -> "n/a"."""
    if _absent(pct):
        return NA
    p = float(pct)  # type: ignore[arg-type]
    return f"{p:+,.0f}%" if abs(p) >= 99.95 else f"{p:+.1f}%"


def fmt_money(amount: object, currency: str | None = None) -> str:
    """An amount (Decimal, decimal string or number) rounded to cents for people: "1,234.56 USD"."""
    if amount is None or amount == "":
        return NA
    try:
        exact = amount if isinstance(amount, Decimal) else Decimal(str(amount))
    except (InvalidOperation, ValueError):
        return str(amount)
    if not exact.is_finite():
        return NA
    cents = exact.quantize(CENT, rounding=ROUND_HALF_EVEN)
    text = ("<0.01" if exact > 0 else ">-0.01") if cents == 0 and exact != 0 else f"{cents:,}"
    return f"{text} {currency}" if currency else text


def fmt_count(n: int, noun: str, plural: str | None = None) -> str:
    """3, "run" -> "3 runs"; 1 -> "1 run"."""
    return f"{n:,} {noun if n == 1 else (plural or noun + 's')}"


def fmt_watts(watts: float | None) -> str:
    return NA if _absent(watts) else f"{watts:,.0f} W"


def fmt_celsius(celsius: float | None) -> str:
    return NA if _absent(celsius) else f"{celsius:.0f} °C"
