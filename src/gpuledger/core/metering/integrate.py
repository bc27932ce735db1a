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


# An energy counter delta is judged against what a GPU can draw. Over a span of at least
# STUCK_MIN_S the counter (which moves every 20-100 ms) must move while both power readings say the
# GPU draws power; and no span can hold more than MAX_DRAW_X the enforced power limit (or
# MAX_DRAW_W without one) over the span plus SPIKE_SLACK_S (the counter's steps, a reading taken
# just before an update). Only plainly broken readings fail: the counter stays the figure otherwise.
STUCK_MIN_S = 1.0
STUCK_POWER_W = 1.0
MAX_DRAW_X = 2.0
MAX_DRAW_W = 5000.0
SPIKE_SLACK_S = 1.0


def implausible_counter(
    joules: float, seconds: float, p0_w: float | None, p1_w: float | None, limit_w: float | None
) -> str | None:
    """Why an energy counter's increase over a span cannot be right ("stuck", "spike"), or None."""
    drawing = p0_w is not None and p1_w is not None and min(p0_w, p1_w) >= STUCK_POWER_W
    if joules == 0 and seconds >= STUCK_MIN_S and drawing:
        return "stuck"
    if joules > _most_w(limit_w) * (max(seconds, 0.0) + SPIKE_SLACK_S):
        return "spike"
    return None


def surely_plausible_mj(limit_w: float | None) -> float:
    """A positive counter increase up to this many millijoules passes ``implausible_counter`` over
    any span (the caller's fast path: it runs for every GPU at every tick)."""
    return _most_w(limit_w) * SPIKE_SLACK_S * 1000


def _most_w(limit_w: float | None) -> float:
    return MAX_DRAW_X * limit_w if limit_w else MAX_DRAW_W
