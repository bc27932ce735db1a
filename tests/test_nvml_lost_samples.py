"""Samples lost from NVML's ring buffer while the reader stalled (collect/nvml_util.py).

``nvmlDeviceGetSamples(device, type, lastSeenTimeStamp)`` returns the samples the driver keeps in
a buffer of limited depth that are newer than ``lastSeenTimeStamp`` (0: all it keeps). A reader
that stalls longer than the buffer holds finds it full on its return: the oldest samples of the
stall were overwritten, and the time they covered is *unknown*, never idle (docs/METERING.md). A
reader that stalls while the driver had nothing to sample (an idle GPU) finds few samples: nothing
was lost, and the gap is idle.

The driver here is a ring buffer written by this test (``Ring``): a device sampling on its own
schedule, the reader seeing only the last ``depth`` samples at the time it reads.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from gpuledger.collect.nvml_query import NOTHING_NEW
from gpuledger.collect.nvml_util import STALL_S, UtilReader

UINT = 1  # NVML_VALUE_TYPE_UNSIGNED_INT
P_US = 166_667  # 1/6 s: the device samples six times a second while busy
DEPTH = 100  # samples the buffer keeps (~16.7 s at six a second)
T0_US = 1_700_000_000_000_000  # the device's first sample, µs on the wall clock (as NVML stamps them)


class Ring:
    """The driver's sample buffer: every sample the device took (its schedule), of which a read at
    ``now_us`` sees the last ``depth`` taken by then that are newer than the cursor."""

    def __init__(self, times_us: list[int], value: Callable[[int], int], depth: int = DEPTH) -> None:
        self.times_us, self.value, self.depth = sorted(times_us), value, depth
        self.now_us = 0

    def taken(self) -> list[int]:
        return [t for t in self.times_us if t <= self.now_us][-self.depth :]

    def __call__(self, cursor_us: int) -> Any:
        fresh = [t for t in self.taken() if t > cursor_us]
        if not fresh:
            return NOTHING_NEW
        return UINT, [SimpleNamespace(timeStamp=t, sampleValue=SimpleNamespace(uiVal=self.value(t))) for t in fresh]


class Run:
    """A UtilReader reading ``ring`` at the instants the test names (seconds after T0)."""

    def __init__(self, ring: Ring, instant: float | None) -> None:
        self.ring, self.notes = ring, []
        self.reader = UtilReader(ring, lambda: instant, lambda key, text: self.notes.append(key))
        self.at_s: float | None = None
        self.reads: list[Any] = []

    def _clock(self, at_s: float) -> tuple[float, float]:
        self.ring.now_us = T0_US + round(at_s * 1_000_000)
        return T0_US / 1e6 + at_s, 1000.0 + at_s  # wall and monotonic: no clock step between reads

    def prime(self, at_s: float) -> None:
        self.reader.prime(*self._clock(at_s))
        self.at_s = at_s

    def read(self, at_s: float) -> Any:
        assert self.at_s is not None
        now, mono = self._clock(at_s)
        out = self.reader.read(now, mono, at_s - self.at_s)
        assert out is not None
        self.at_s = at_s
        self.reads.append(out)
        return out


def every_period(start_s: float, end_s: float) -> list[int]:
    """The sample times of a device sampling every period over [start_s, end_s) after T0."""
    first, last = round(start_s * 1e6 / P_US), round(end_s * 1e6 / P_US)
    return [T0_US + k * P_US for k in range(first, last)]


def test_samples_lost_in_a_stall_are_unknown_not_idle() -> None:
    # Busy at 100 % the whole time, sampled every period; the run starts a minute in (the buffer is
    # full of samples from before it), reads every second, then stalls 20 s: longer than the
    # buffer's 16.7 s, so its oldest samples of the stall are gone when the reader comes back.
    ring = Ring(every_period(0, 120), lambda t: 100)
    run = Run(ring, instant=None)
    run.prime(60.0)
    for s in range(61, 66):
        run.read(float(s))
    cursor = run.reader.cursor_us
    assert cursor is not None
    back = run.read(65.0 + 20.0)
    assert STALL_S < 20.0  # a stall, as the reader counts them
    oldest_kept = ring.taken()[0]
    lost_s = (oldest_kept - P_US - cursor) / 1e6  # time no kept sample covers: computed from the ring
    assert lost_s > 3.0
    assert back.unknown_s == pytest.approx(lost_s, abs=P_US / 1e6)
    assert back.idle_s == pytest.approx(0.0, abs=1e-6)  # the GPU was never idle
    assert back.busy_s == pytest.approx(20.0 - lost_s, abs=P_US / 1e6)  # the samples that survived
    assert "buffer_overrun" in run.notes


def test_the_instant_reading_measures_what_was_lost_every_time() -> None:
    # The same stall twice: each time the buffer comes back full (as deep as any read ever was),
    # and the instant reading (100 %) measures the lost span, so the run's busy time is its
    # whole span, as the ring's schedule says.
    ring = Ring(every_period(0, 200), lambda t: 100)
    run = Run(ring, instant=100.0)
    run.prime(60.0)
    start = run.reader.cursor_us
    assert start is not None
    for at in (61.0, 62.0, 82.0, 83.0, 84.0, 105.0, 106.0):
        run.read(at)
    end = run.reader.cursor_us
    assert end is not None
    truth_s = (end - start) / 1e6  # busy from the first sample after the start to the last read
    assert sum(r.busy_s for r in run.reads) == pytest.approx(truth_s, abs=2 * P_US / 1e6)
    assert [r.method for r in run.reads].count("instant,samples") == 2  # the two stalls
    assert sum(r.idle_s for r in run.reads) == pytest.approx(0.0, abs=1e-6)


def test_a_stall_while_the_driver_had_nothing_to_sample_is_idle() -> None:
    # Busy 5 s, idle 20 s without a sample (the driver stops sampling an idle GPU), busy 3 s. The
    # reader stalls across the idle span and comes back to 18 samples, far from a full buffer:
    # nothing was lost, so the gap is idle.
    ring = Ring(every_period(0, 65) + every_period(85, 88), lambda t: 100)
    run = Run(ring, instant=None)
    run.prime(60.0)
    for s in range(61, 66):
        run.read(float(s))
    back = run.read(88.5)
    assert back.unknown_s == 0
    assert back.busy_s == pytest.approx(3.0, abs=P_US / 1e6)
    assert back.idle_s == pytest.approx(20.0, abs=2 * P_US / 1e6)
    assert "buffer_overrun" not in run.notes
