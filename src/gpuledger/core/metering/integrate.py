"""Exact integrals from cumulative counters and power readings (busy time: core/metering/busy.py).

Pure functions (stdlib only, no I/O, no clock). Each one is additive: integrating a trace
piece by piece and summing gives the same figure as integrating it whole, so ticks can be
re-aggregated into intervals and rollups with a plain sum.
"""

from __future__ import annotations


def counter_delta(prev: int | None, cur: int, width_bits: int = 64) -> int | None:
    """Increase of a cumulative counter from ``prev`` to ``cur``, handling wrap-around.

    Rule: when ``cur >= prev`` the delta is ``cur - prev``. When ``cur < prev`` the counter
    either wrapped past ``2**width_bits`` or was reset (driver reload, GPU reset). It is taken
    as a wrap when the wrapped delta is plausible — less than a quarter of the counter range —
    and as a reset otherwise. **On a reset this returns None**: the counter restarted at an
    unknown moment inside the span, so the span's true increase is unknown (``cur`` is only a
    lower bound). Callers re-base on ``cur`` and measure that one span another way (the NVML
    collector integrates power for it and records that method). ``prev=None`` (no previous
    reading) also returns None.
    """
    if prev is None:
        return None
    if cur >= prev:
        return cur - prev
    wrapped = cur + (1 << width_bits) - prev
    if wrapped < 1 << (width_bits - 2):
        return wrapped
    return None


def trapezoid_energy_j(t0: float, p0_w: float, t1: float, p1_w: float) -> float:
    """Joules between two power readings, assuming power changed linearly between them."""
    return (t1 - t0) * (p0_w + p1_w) * 0.5
