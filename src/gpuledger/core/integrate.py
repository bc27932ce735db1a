"""Exact integrals from driver sample buffers, cumulative counters and power readings.

Pure functions (stdlib only, no I/O, no clock). Each one is additive: integrating a trace
piece by piece and summing gives the same figure as integrating it whole, so ticks can be
re-aggregated into intervals and rollups with a plain sum (DESIGN §2.2).
"""

from __future__ import annotations

from collections.abc import Iterable

_US = 1_000_000


def busy_seconds_from_samples(
    samples: Iterable[tuple[int, float]],
    t0_us: int,
    t1_us: int,
    period_hint_s: float,
    prev_ts_us: int | None = None,
) -> float:
    """Busy-seconds in the window (t0_us, t1_us] from utilisation samples.

    ``samples`` are ``(timestamp_us, percent)`` pairs sorted by timestamp, as NVML's
    ``nvmlDeviceGetSamples(..., NVML_GPU_UTILIZATION_SAMPLES, cursor)`` returns them. A sample
    reports the share of time a kernel ran since the *previous* sample, so sample ``i`` covers
    ``(ts[i-1], ts[i]]``; the first covers ``(prev_ts_us, ts[0]]`` when the caller knows the
    timestamp before it (the cursor), else ``(ts[0] - period_hint_s, ts[0]]``. Each span is
    clipped to the window, so the result is exact for any split of the window. Percentages
    outside 0-100 are clamped: a bad driver value must not inflate busy time.
    """
    hint_us = period_hint_s * _US
    prev: float | None = prev_ts_us
    busy_pct_us = 0.0
    for ts, pct in samples:
        start = ts - hint_us if prev is None else prev
        prev = ts
        lo = start if start > t0_us else t0_us
        hi = ts if ts < t1_us else t1_us
        if hi > lo:
            busy_pct_us += (100.0 if pct > 100.0 else 0.0 if pct < 0.0 else pct) * (hi - lo)
    return busy_pct_us / (100.0 * _US)


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
