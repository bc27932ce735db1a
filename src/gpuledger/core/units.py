"""Unit conversions and human formatting. Every formatter shows an absent value (None) as "n/a",
never as 0 (DESIGN §2.3)."""

from __future__ import annotations

import math
from datetime import datetime, timezone

__all__ = [
    "J_PER_KWH",
    "NA",
    "S_PER_H",
    "fmt_bytes",
    "fmt_celsius",
    "fmt_duration",
    "fmt_hours",
    "fmt_kwh",
    "fmt_pct",
    "fmt_seconds",
    "fmt_watts",
    "iso_utc",
    "joules_to_kwh",
    "seconds_to_hours",
]

NA = "n/a"
S_PER_H = 3600.0
J_PER_KWH = 3.6e6

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


def _absent(value: float | None) -> bool:
    return value is None or (isinstance(value, float) and not math.isfinite(value))


def fmt_bytes(n: float | None) -> str:
    """1536 -> "1.5 KiB"; binary units, 3 significant digits, plain bytes below 1 KiB."""
    if _absent(n):
        return NA
    assert n is not None
    size, unit = float(n), 0
    while abs(size) >= 1024 and unit < len(_BINARY_UNITS) - 1:
        size /= 1024
        unit += 1
    if unit == 0:
        return f"{int(n)} B"
    digits = 2 if abs(size) < 10 else 1 if abs(size) < 100 else 0
    return f"{size:.{digits}f} {_BINARY_UNITS[unit]}"


def fmt_duration(seconds: float | None) -> str:
    """Seconds -> "h:mm:ss" (hours keep counting past 24: "26:03:07")."""
    if _absent(seconds):
        return NA
    assert seconds is not None
    sign = "-" if seconds < 0 else ""
    total = round(abs(seconds))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{sign}{hours}:{minutes:02d}:{secs:02d}"


def fmt_seconds(seconds: float | None) -> str:
    """CPU-seconds and the like: "12,345.6 s"."""
    return NA if _absent(seconds) else f"{seconds:,.1f} s"


def fmt_hours(hours: float | None, digits: int = 2) -> str:
    """GPU-hours: "4.68"; small values keep precision ("0.0042")."""
    if _absent(hours):
        return NA
    assert hours is not None
    if hours != 0 and abs(hours) < 10**-digits:
        return f"{hours:.2g}"
    return f"{hours:,.{digits}f}"


def fmt_kwh(kwh: float | None) -> str:
    if _absent(kwh):
        return NA
    assert kwh is not None
    # Small runs keep two significant digits instead of rounding to "0.00".
    return f"{kwh:.2g} kWh" if kwh != 0 and abs(kwh) < 0.01 else f"{kwh:,.2f} kWh"


def fmt_pct(ratio: float | None, digits: int = 0) -> str:
    """A 0-1 ratio -> "78%"."""
    return NA if _absent(ratio) else f"{ratio * 100:.{digits}f}%"


def fmt_watts(watts: float | None) -> str:
    return NA if _absent(watts) else f"{watts:,.0f} W"


def fmt_celsius(celsius: float | None) -> str:
    return NA if _absent(celsius) else f"{celsius:.0f} °C"
