"""Busy time of one GPU from NVML's utilisation sample buffer, read tick after tick.

The integration rule is core/metering/busy.py's (a sample covers at most one sample period before its
timestamp; unsampled time is idle when nothing was lost, unknown when samples may be lost). This
module keeps the per-device state that decides which case a read is in:

* **cursor** — the newest NVML timestamp seen; each read asks for the samples after it. A first
  read that fails leaves the cursor *closed*: the next successful read opens it at the newest
  sample without integrating the buffer (it holds time from before the run, and other tenants'
  work), and that tick's busy time comes from the instant reading.
* **accounted** — the time classified so far. While the buffer has nothing new (the driver stops
  or slows sampling on an idle GPU, answering NotFound), time up to ``now - period`` (1 s, the
  longest documented period, until the period is learned) is counted idle tick by tick, so each
  interval records its own idle time. That needs "now" on the clock NVML stamps samples with.
* **the samples' clock** — NVML documents the timestamp as "CPU timestamp in microseconds", no
  epoch. Most drivers use the Unix epoch (the host's wall clock); some use the time since boot
  (CLOCK_BOOTTIME). The first samples tell which: within a day of the wall clock, or not after
  the host's boot clock (read where the host has not been suspended since boot, so that a driver
  counting CLOCK_MONOTONIC reads the same). On any other clock "now" is not known: a gap is
  classified when the sample after it arrives, and the first one after the start counts from the
  start at the latest (newest sample − time since the start), never from before the run.
* **lost samples** — the ring buffer holds on the order of 100 samples (~16 s at 6 per second). A
  read after a stall longer than ``STALL_S`` that comes back (nearly) full may have lost the oldest
  samples: the gap before them is unknown, not idle.
* **wall-clock steps** — the timestamps are wall-clock microseconds. A step is seen as a change of
  (wall − monotonic) between reads. Forward: the cursor moves with the clock (no phantom gap).
  Backward: new samples are older than the cursor and NVML answers NotFound until the clock has
  caught up; that time is unknown.

* **the run's end** — the time after the newest sample is left to the next read's samples; the
  run's last read (``settle``) has none to wait for, so that time is unknown.

Unknown time is measured by the instantaneous reading (``nvmlDeviceGetUtilizationRates``) × its
length, capped at the time that really elapsed, and the tick's method then includes "instant";
without that reading it is recorded as unmeasured (``util_unknown_s``) and never charged as busy.
"""

from __future__ import annotations

import bisect
import math
import operator
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from gpuledger.collect.nvml_query import MEMBER_OF, NOTHING_NEW, UINT_TYPE
from gpuledger.core.metering.busy import PERIOD_MAX_S, SamplePeriod, busy_from_samples
from gpuledger.core.model import UTIL_INSTANT, UTIL_SAMPLES

STALL_S = 8.0  # a read this late may find the ring buffer wrapped (100 samples at 1/6 s: ~16 s)
STEP_S = 0.5  # a change of (wall - monotonic) beyond this between reads is a clock step
_FULL = 0.9  # a read returning this share of the deepest buffer seen counts as full
_WALL_DOMAIN_S = 86_400.0  # NVML timestamps within a day of the host clock: the wall clock
_BOOT_SLACK_S = 0.5  # a sample stamped on the boot clock is never later than it (plus rounding)
_SUSPENDED_S = 1.0  # boot clock ahead of the monotonic one by more: the host was suspended
# The clock NVML stamps samples with (None: not known yet, no sample seen)
WALL, BOOT, OTHER = "wall", "boot", "other"
_US = 1_000_000
_TIME = operator.itemgetter(0)
# value type -> (timeStamp, sampleValue.<member>) of one nvmlSample_t; unknown types read uiVal
_PAIR_OF = {vtype: operator.attrgetter("timeStamp", f"sampleValue.{m}") for vtype, m in MEMBER_OF.items()}
_PAIR_UINT = operator.attrgetter("timeStamp", "sampleValue.uiVal")


def host_boot_time() -> float | None:
    """Seconds since the host booted (CLOCK_BOOTTIME), or None where that clock does not exist or
    the host has been suspended since boot (a driver counting CLOCK_MONOTONIC would then differ)."""
    boot = getattr(time, "CLOCK_BOOTTIME", None)
    if boot is None:
        return None
    now = time.clock_gettime(boot)
    return now if now - time.clock_gettime(time.CLOCK_MONOTONIC) < _SUSPENDED_S else None


class UtilRead(NamedTuple):  # a NamedTuple: made for every GPU at every tick, so cheap to build
    """Busy time for one tick, and how it was measured (in GpuTick's order: busy_s, util_method,
    util_max_pct, util_idle_s, util_unknown_s)."""

    busy_s: float
    method: str
    max_pct: float | None
    idle_s: float  # unsampled time taken as idle (the driver had nothing to sample)
    unknown_s: float  # time the samples could not cover (lost, clock step, first read)


class UtilReader:
    """Per-device sample-buffer state; NVML is reached through the three callables.

    ``samples(cursor_us)`` returns ``(value_type, samples)``, ``NOTHING_NEW`` or None (failed or
    unsupported); ``instant()`` the instantaneous utilisation percent or None; ``note(key, text)``
    records a one-time event; ``boot()`` the host's seconds since boot or None (host_boot_time).
    """

    __slots__ = (
        "_accounted_us",
        "_blind_until_us",
        "_boot",
        "_clock_of",
        "_depth",
        "_idle_before_s",
        "_instant",
        "_last",
        "_last_ok_mono",
        "_note",
        "_offset",
        "_open_mono",
        "cursor_us",
        "period",
        "samples",
    )

    def __init__(
        self,
        samples: Callable[[int], Any],
        instant: Callable[[], float | None],
        note: Callable[[str, str], None],
        boot: Callable[[], float | None] | None = None,
    ) -> None:
        self.samples, self._instant, self._note, self._boot = samples, instant, note, boot
        self.period = SamplePeriod()
        self.cursor_us: int | None = None  # None: closed (no trustworthy read yet)
        self._accounted_us: float | None = None
        self._clock_of: str | None = None  # WALL, BOOT or OTHER: NVML's timestamps; None: not known yet
        self._open_mono: float | None = None  # when the cursor was opened (monotonic)
        self._idle_before_s = 0.0  # idle counted since then while NVML's clock was not known
        self._last: tuple[int, float] | None = None  # newest sample seen
        self._depth = 0  # the most samples one read returned
        self._offset: float | None = None  # wall - monotonic at the last read
        self._last_ok_mono: float | None = None
        self._blind_until_us: int | None = None  # after a backward step: samples resume past this

    # -- start ---------------------------------------------------------------------------------
    def prime(self, now: float, mono: float) -> None:
        """Open the cursor at the newest buffered sample: nothing before the run is counted."""
        self._offset, self._open_mono = now - mono, mono
        res = self.samples(0)
        if res is None:
            self.cursor_us = None  # closed: the next read opens it without integrating
            return
        pairs = self._pairs(res)
        self._open(pairs, now)
        self._last_ok_mono = mono

    # -- every tick ----------------------------------------------------------------------------
    def read(self, now: float, mono: float, elapsed_s: float) -> UtilRead | None:
        """Busy time since the previous read; None when the buffer could not be read this time."""
        offset, last_offset = now - mono, self._offset
        self._offset = offset
        if last_offset is not None and abs(offset - last_offset) > STEP_S and self._clock_of is WALL:
            self._stepped(offset - last_offset)
        if self.cursor_us is None:
            return self._open_late(now, mono, elapsed_s)
        res = self.samples(self.cursor_us)
        if res is None:
            return None  # a passing failure: the cursor stays, the next read covers this span
        stalled = self._last_ok_mono is not None and mono - self._last_ok_mono > STALL_S
        self._last_ok_mono = mono
        pairs = self._pairs(res, self.cursor_us)
        if not pairs:
            return self._nothing_new(now, mono, elapsed_s)
        self._blind_until_us = None
        if self._clock_of is None or self._clock_of is BOOT:
            self._check_clock(pairs[-1][0], now, elapsed_s)
        # Comparisons inline rather than min()/max(): builtins that parse their arguments by keyword
        # at every call in Python 3.11, and this runs for every GPU at every tick.
        n = len(pairs)
        full = n >= _FULL * self._depth
        if n > self._depth:
            self._depth = n
        start = self._accounted_us
        start = int(self._first_start(pairs[-1][0], now, mono) if start is None else start)
        if pairs[0][0] <= start:  # rare: samples that became visible late, dated before the run or
            fresh = [p for p in pairs if p[0] > start]  # before time already classified
            if not fresh:  # nothing newer than what is classified: as if nothing new came
                self.cursor_us, self._last = pairs[-1][0], pairs[-1]
                return self._nothing_new(now, mono, elapsed_s)
            pairs = fresh
        period, last = self.period, self._last
        period_s = period.seconds
        r = busy_from_samples(pairs, start, period_s, first_gap_unknown=stalled and full)
        # The period is learned from the same spacings; at steady state they cannot lower it, and
        # the batch is integrated once. When they do, it is integrated again with the new period.
        least = r.least_gap_us
        if last is not None and pairs[0][0] - last[0] < least:
            least = pairs[0][0] - last[0]
        # Until learned, any spacing can teach it (the batch's are seldom within the assumed
        # 1/6 s: real ones run a microsecond or more longer), so every batch is looked at.
        if least < period.useful_us or not period.learned:
            period.observe(pairs, last)
            if period.seconds != period_s:
                period_s = period.seconds
                r = busy_from_samples(pairs, start, period_s, first_gap_unknown=stalled and full)
        if stalled and full:
            self._note("buffer_overrun", "the utilisation sample buffer wrapped while the reader was stalled; "
                       "the lost span is measured by the instant reading")  # fmt: skip
        self.cursor_us = r.last_us
        self._accounted_us = r.last_us
        self._last = pairs[-1]
        if not r.unknown_s:  # nearly always
            return UtilRead(r.busy_s, UTIL_SAMPLES, r.max_pct, r.idle_s, 0.0)
        # Time cannot be classified beyond what really elapsed (a clock step inflates gaps).
        cap = max(0.0, elapsed_s + period_s - r.sampled_s - r.idle_s)
        out = UtilRead(r.busy_s, UTIL_SAMPLES, r.max_pct, r.idle_s, min(r.unknown_s, cap))
        return self._fill_unknown(out) if out.unknown_s else out

    def missed(self, now: float, elapsed_s: float) -> UtilRead | None:
        """The buffer could not be read this time (a passing error): the span since the last
        classified instant is unknown, measured by the instant reading or unmeasured, and the
        cursor moves to ``now``, so the next read covers its own span only. Left to the next read,
        that read would hold both spans' busy time, one tick with twice its time (and an interval
        end between them would move busy time into the wrong interval). None when NVML's
        timestamps' clock is not known (nothing to move the cursor to): the cursor stays and the
        next read covers both spans, as before."""
        if self.cursor_us is None or self._accounted_us is None:
            return None
        now_us = self._now_us(now)
        if now_us is None:
            return None
        unknown = min(max(0.0, (now_us - self._accounted_us) / _US), elapsed_s + self.period.seconds)
        self.cursor_us = max(self.cursor_us, int(now_us))
        self._accounted_us = max(self._accounted_us, now_us)
        self._last = None  # the next sample does not follow the last one seen: no spacing to learn
        return self._fill_unknown(UtilRead(0.0, UTIL_SAMPLES, None, 0.0, unknown))

    def settle(self, now: float, elapsed_s: float) -> UtilRead | None:
        """The run ends at ``now`` and no read follows: the time after the last classified instant
        (after the newest sample, which ``read`` leaves to the next read's samples: at most a period
        and the driver's delay) is classified now, as unknown: measured by the instant reading, else
        unmeasured. None when nothing is left, or where NVML's clock is not known (no "now" on it)."""
        if self.cursor_us is None or self._accounted_us is None or self._blind_until_us is not None:
            return None  # not opened, or after a backward step: the reads already covered up to now
        now_us = self._now_us(now)
        if now_us is None or now_us <= self._accounted_us:
            return None
        unknown = min((now_us - self._accounted_us) / _US, elapsed_s + self.period.seconds)
        self._accounted_us = now_us
        return self._fill_unknown(UtilRead(0.0, UTIL_SAMPLES, None, 0.0, unknown))

    # -- cases ---------------------------------------------------------------------------------
    def _open(self, pairs: list[tuple[int, float]], now: float) -> None:
        if pairs:
            self._depth = max(self._depth, len(pairs))
            self.period.observe(pairs)
            self._last = pairs[-1]
            self.cursor_us = pairs[-1][0]
            self._check_clock(pairs[-1][0], now, 0.0)
        else:
            self.cursor_us = 0  # an empty buffer: every later sample is new
        self._idle_before_s = 0.0
        # From now on time is the run's: nothing before this instant is classified (None: the
        # clock is not known yet; the first samples' read sets it, _first_start).
        self._accounted_us = self._now_us(now)

    def _check_clock(self, newest_us: int, now: float, elapsed_s: float) -> None:
        """Tell (or re-check) the clock NVML stamps samples with, from its newest sample."""
        if self._clock_of is WALL or self._clock_of is OTHER:
            return  # for good: the wall clock's steps are watched apart (_stepped)
        if self._clock_of is None and abs(now - newest_us / _US) < _WALL_DOMAIN_S:
            self._clock_of = WALL
            return
        boot = self._boot() if self._boot is not None else None
        if boot is not None and newest_us <= (boot + _BOOT_SLACK_S) * _US:
            # Any older timestamp is not after the boot clock either: only a fresh sample (taken
            # since the previous read) shows that the two clocks agree.
            if self._clock_of is None and boot - newest_us / _US <= elapsed_s + PERIOD_MAX_S + _BOOT_SLACK_S:
                self._clock_of = BOOT
                self._note("sample_clock_boot", "NVML stamps utilisation samples with the time since the host "
                           "booted, not the wall clock; idle time is counted on that clock")  # fmt: skip
            return
        # Later than the boot clock (or no boot clock): what was counted on it stays (it was
        # behind NVML's clock, so nothing was classified ahead of the samples).
        self._clock_of = OTHER
        self._note("sample_clock", "NVML stamps utilisation samples on a clock that is neither the host's "
                   "wall clock nor its boot clock: idle time is classified when the sample after it arrives, "
                   "so a tick may hold idle time of the ticks before it")  # fmt: skip

    def _now_us(self, now: float) -> float | None:
        """Now on the clock of NVML's timestamps, in µs; None where that clock is not known."""
        if self._clock_of is WALL:
            return now * _US
        if self._clock_of is BOOT:
            boot = self._boot() if self._boot is not None else None
            return None if boot is None else boot * _US
        return None

    def _first_start(self, newest_us: int, now: float, mono: float) -> float:
        """Where the first samples' read starts classifying: the start of the cursor, on NVML's
        clock (its "now" less the time since), or not before the newest sample less the time since
        the start where that clock is not known, so no time from before the run is counted."""
        since_us = 0.0 if self._open_mono is None else max(0.0, mono - self._open_mono) * _US
        now_us = self._now_us(now)
        floor = (newest_us if now_us is None else now_us) - since_us
        return max(float(self.cursor_us or 0), floor + self._idle_before_s * _US)

    def _open_late(self, now: float, mono: float, elapsed_s: float) -> UtilRead | None:
        res = self.samples(0)
        if res is None:
            return None
        self._open_mono = mono
        self._open(self._pairs(res), now)
        self._last_ok_mono = mono
        return self._fill_unknown(UtilRead(0.0, UTIL_SAMPLES, None, 0.0, elapsed_s))

    def _nothing_new(self, now: float, mono: float, elapsed_s: float) -> UtilRead:
        if self._blind_until_us is not None:  # after a backward step: samples are behind the cursor
            return self._fill_unknown(UtilRead(0.0, UTIL_SAMPLES, None, 0.0, elapsed_s))
        # A sample taken later covers at most one period before its timestamp, so time up to
        # now - period can no longer be covered: the driver had nothing to sample. Until the
        # period is learned that is the longest documented one: the shortest would call idle
        # the busy time a 1 s product's next sample is about to cover.
        period_s = self.period.seconds if self.period.learned else PERIOD_MAX_S
        idle = 0.0
        if self._accounted_us is not None:
            now_us = self._now_us(now)
            horizon = None if now_us is None else now_us - period_s * _US
            if horizon is not None and horizon > self._accounted_us:
                idle = (horizon - self._accounted_us) / _US
                self._accounted_us = horizon
        elif self._open_mono is not None:  # no sample since the start yet: counted from the start
            horizon_s = mono - self._open_mono - period_s
            if horizon_s > self._idle_before_s:
                idle, self._idle_before_s = horizon_s - self._idle_before_s, horizon_s
        return UtilRead(0.0, UTIL_SAMPLES, None, idle, 0.0)

    def _fill_unknown(self, out: UtilRead) -> UtilRead:
        if not out.unknown_s:
            return out
        pct = self._instant()
        if pct is None:
            return out
        return out._replace(
            busy_s=out.busy_s + min(max(pct, 0.0), 100.0) / 100 * out.unknown_s,
            method=f"{UTIL_INSTANT},{UTIL_SAMPLES}",
            max_pct=pct if out.max_pct is None else max(out.max_pct, pct),
        )

    def _stepped(self, step: float) -> None:
        """The wall clock stepped by ``step`` seconds between two reads (NVML stamps samples with it)."""
        step_us = round(step * _US)
        if step > 0:  # forward: move the cursor with the clock, no phantom gap
            if self.cursor_us:
                self.cursor_us += step_us
            if self._accounted_us is not None:
                self._accounted_us += step_us
        else:  # backward: samples are behind the cursor until the clock catches up
            self._blind_until_us = self.cursor_us
            self._accounted_us = self.cursor_us
        self._note(f"clock_step_{'fwd' if step > 0 else 'back'}",
                   f"the wall clock stepped {'forward' if step > 0 else 'back'} by {abs(step):.1f} s; "
                   "the time around the step is measured by the instant reading")  # fmt: skip

    @staticmethod
    def _pairs(res: Any, after: int = -1) -> list[tuple[int, float]]:
        """(timestamp µs, percent) of the samples newer than ``after``, sorted by time."""
        if res is NOTHING_NEW or not res:
            return []
        vtype, samples = res
        if vtype == UINT_TYPE:  # GPU utilisation's type: plain attribute reads, the cheapest in 3.11
            pairs = [(s.timeStamp, s.sampleValue.uiVal) for s in samples]
        else:
            pairs = list(map(_PAIR_OF.get(vtype, _PAIR_UINT), samples))
        # Buffer order is time order, except across a wall-clock step back; sorting a sorted
        # list is one pass in C, cheaper than checking the order in Python (stable: samples at
        # the same instant keep the driver's order).
        pairs.sort(key=_TIME)
        if pairs and pairs[0][0] <= after:  # some drivers hand back samples at the cursor again
            del pairs[: bisect.bisect_right(pairs, (after, math.inf))]
        return pairs
