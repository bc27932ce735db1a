"""The recorder's clock: wall-clock seconds that never jump.

Intervals are dated in Unix seconds, but their lengths are what is billed. If the host's wall
clock is stepped while a run records (an administrator, a VM resumed, NTP correcting a large
offset), dating ticks with ``time.time()`` would make an interval end before it starts, or span
time that never passed. ``SteadyClock`` advances with the monotonic clock and steers toward the
wall clock at most ``SLEW`` seconds per second: NTP's own gradual corrections (at most 0.5 ms/s)
are followed exactly, a step is absorbed over time (a 30 s step in about four hours) and never
shows as a jump. Readings never decrease.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

SLEW = 0.002  # s per s: faster than NTP ever slews (0.0005), so normal drift is tracked exactly


class SteadyClock:
    def __init__(self, wall: Callable[[], float] = time.time, mono: Callable[[], float] = time.monotonic) -> None:
        self._wall, self._mono = wall, mono
        self._lock = threading.Lock()
        self._t, self._m = wall(), mono()

    def __call__(self) -> float:
        with self._lock:
            m = self._mono()
            dm = m - self._m if m > self._m else 0.0
            guess = self._t + dm
            step = SLEW * dm
            offset = min(max(self._wall() - guess, -step), step)
            self._t, self._m = guess + offset, m
            return self._t
