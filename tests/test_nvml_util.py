"""The per-device sample-buffer reader (collect/nvml_util.py) against batches a driver really hands back."""

from __future__ import annotations

import itertools
import math
from types import SimpleNamespace
from typing import Any

import pytest

from gpuledger.collect.nvml_query import NOTHING_NEW
from gpuledger.collect.nvml_util import UtilReader

UINT = 1  # NVML_VALUE_TYPE_UNSIGNED_INT: the value is in sampleValue.uiVal
P_US = 166_667
T0 = 1_700_000_000_000_000  # µs on the wall clock, as NVML stamps samples


def batch(*samples: tuple[int, int]) -> tuple[int, list[Any]]:
    return UINT, [SimpleNamespace(timeStamp=ts, sampleValue=SimpleNamespace(uiVal=v)) for ts, v in samples]


class Driver:
    """Answers nvmlDeviceGetSamples with the next scripted batch, whatever the cursor."""

    def __init__(self, *answers: Any) -> None:
        self.answers = list(answers)
        self.cursors: list[int] = []

    def __call__(self, cursor: int) -> Any:
        self.cursors.append(cursor)
        return self.answers.pop(0)


def reader(driver: Driver) -> UtilReader:
    return UtilReader(samples=driver, instant=lambda: None, note=lambda key, text: None)


def test_samples_handed_back_again_are_not_counted_twice() -> None:
    # Some drivers answer with samples at (or before) the cursor again: only the newer ones count.
    t = [T0 + k * P_US for k in range(1, 5)]
    drv = Driver(batch((t[0], 100)), batch((t[0], 100), (t[1], 100)), batch((t[0], 100), (t[1], 100), (t[2], 50)))
    r = reader(drv)
    r.prime(t[0] / 1e6, 0.0)
    first = r.read(t[1] / 1e6, P_US / 1e6, P_US / 1e6)
    second = r.read(t[2] / 1e6, 2 * P_US / 1e6, P_US / 1e6)
    assert first is not None and second is not None
    assert first.busy_s == pytest.approx(P_US / 1e6)  # t1 at 100 %, once
    assert second.busy_s == pytest.approx(0.5 * P_US / 1e6)  # only t2, at 50 %
    assert first.idle_s == second.idle_s == 0
    assert drv.cursors == [0, t[0], t[1]]


def test_a_batch_out_of_time_order_is_read_in_time_order() -> None:
    # Across a wall-clock step back the buffer is not in time order; each sample still covers its
    # own period once, so the busy time is the same as for the sorted batch.
    t = [T0 + k * P_US for k in range(1, 8)]
    learn = batch((t[1], 100), (t[2], 100), (t[3], 100))  # the reader learns the period first
    shuffled = Driver(batch((t[0], 0)), learn, batch((t[5], 30), (t[4], 60), (t[6], 90)))
    ordered = Driver(batch((t[0], 0)), learn, batch((t[4], 60), (t[5], 30), (t[6], 90)))
    got = []
    for drv in (shuffled, ordered):
        r = reader(drv)
        r.prime(t[0] / 1e6, 0.0)
        r.read(t[3] / 1e6, 3 * P_US / 1e6, 3 * P_US / 1e6)
        got.append(r.read(t[6] / 1e6, 6 * P_US / 1e6, 3 * P_US / 1e6))
    assert got[0] is not None and got[1] is not None
    assert got[0].busy_s == pytest.approx(got[1].busy_s) == pytest.approx(1.8 * P_US / 1e6)
    assert got[0].idle_s == got[1].idle_s == 0 and got[0].max_pct == 90


def test_nothing_newer_is_idle_time_not_a_failure() -> None:
    t1 = T0 + P_US
    drv = Driver(batch((t1, 100)), NOTHING_NEW)
    r = reader(drv)
    r.prime(t1 / 1e6, 0.0)
    out = r.read(t1 / 1e6 + 5, 5.0, 5.0)
    # The period is not learned yet: only time more than the longest documented period (1 s) back
    # is surely beyond any later sample's reach.
    assert out is not None and out.busy_s == 0 and out.idle_s == pytest.approx(5 - 1.0)


def test_a_read_between_a_slow_products_samples_calls_no_busy_time_idle() -> None:
    # A 1 s-period product (Volta, Turing) samples every second, idle or not; the GPU is busy
    # from second 1. A read between two samples, before the period is learned, must leave the
    # time the next sample covers unclassified, or that sample finds its second already "idle".
    s = 1_000_000
    drv = Driver(batch((T0, 0)), batch((T0 + s, 0), (T0 + 2 * s, 100)), NOTHING_NEW, batch((T0 + 3 * s, 100)))
    r = reader(drv)
    r.prime(T0 / 1e6 + 0.05, 0.0)
    r.read(T0 / 1e6 + 2.05, 2.0, 2.0)
    between = r.read(T0 / 1e6 + 2.9, 2.85, 0.85)
    after = r.read(T0 / 1e6 + 3.05, 3.0, 0.15)
    assert between is not None and between.idle_s == 0 and between.busy_s == 0
    assert after is not None and after.busy_s == pytest.approx(1.0)  # second 2-3, whole


def test_samples_that_become_visible_late_lose_no_busy_time() -> None:
    # How soon a sample is visible after its timestamp is not documented. While samples keep
    # coming, the time after the newest one is left to the next read (not called idle at now -
    # period): a driver that publishes half a second late must not lose busy time at every tick,
    # and the samples dated before the start that it hands over after it are not the run's.
    lag_us = 500_000
    grid = [T0 + k * P_US for k in range(1, 60)]
    reads = [T0 + s * 1_000_000 for s in range(1, 9)]
    batches = [
        batch(*((ts, 100) for ts in grid if prev - lag_us < ts <= now - lag_us))
        for prev, now in itertools.pairwise([0, *reads])
    ]
    r = reader(Driver(*batches))
    r.prime(reads[0] / 1e6, 0.0)
    got = [r.read(now / 1e6, (now - reads[0]) / 1e6, 1.0) for now in reads[1:]]
    assert all(x is not None for x in got)
    newest = max(ts for ts in grid if ts <= reads[-1] - lag_us)
    assert math.fsum(x.busy_s for x in got) == pytest.approx((newest - reads[0]) / 1e6, abs=1e-6)
    assert all(x.idle_s == 0 for x in got)


def test_a_batch_dated_wholly_before_the_classified_time_is_as_nothing_new() -> None:
    # Samples handed over after the start but dated before it: no busy time, the cursor moves past
    # them (not asked again), and the time since the start is idle, tick by tick, as when nothing came.
    s = 1_000_000
    stale = batch((T0 + s // 2, 100), (T0 + s, 100))
    drv = Driver(batch((T0, 100)), stale, NOTHING_NEW)
    r = reader(drv)
    r.prime(T0 / 1e6 + 2, 0.0)  # the run starts 2 s after the newest buffered sample
    first = r.read(T0 / 1e6 + 5, 3.0, 3.0)
    second = r.read(T0 / 1e6 + 6, 4.0, 1.0)
    assert first is not None and first.busy_s == 0
    # The period is not learned: only time more than the longest documented one (1 s) back is idle.
    assert first.idle_s == pytest.approx(2.0) and second is not None and second.idle_s == pytest.approx(1.0)
    assert drv.cursors == [0, T0, T0 + s]


def test_a_shorter_spacing_seen_later_lowers_the_learned_period() -> None:
    # The first busy spacing seen is a slow one (1 s); later the driver samples every 1/6 s. The
    # period must come down (reads skip learning only when a batch cannot lower it), and the batch
    # that lowers it is integrated with the lowered period: an isolated busy sample after an idle
    # gap then covers ~1/6 s, not 1.1 s.
    s = 1_000_000
    t = T0 + s
    fast = [(t + 2 * s + k * P_US, 100) for k in range(1, 7)]
    lone = T0 + 10 * s
    drv = Driver(batch((t, 100)), batch((t + s, 100)), batch(*fast), batch((lone, 100)))
    r = reader(drv)
    r.prime(t / 1e6, 0.0)
    slow = r.read((t + s) / 1e6, 1.0, 1.0)
    assert slow is not None and r.period.seconds == pytest.approx(1.1)
    quick = r.read(fast[-1][0] / 1e6, 3.0, 2.0)
    assert r.period.seconds == pytest.approx(1.1 * P_US / 1e6)
    # Each fast sample covers one (lowered) period; the gap before them is idle.
    assert quick is not None and quick.busy_s == pytest.approx(6 * P_US / 1e6, rel=0.1)
    after = r.read(lone / 1e6, 9.0, 6.0)
    assert after is not None and after.busy_s == pytest.approx(1.1 * P_US / 1e6, rel=0.01)


def test_the_period_is_learned_from_the_first_busy_batch() -> None:
    # Real spacings run a microsecond or more over the 1/6 s assumed until the period is learned:
    # the first batch of busy samples must still teach it. Otherwise the first spacing learned is
    # the one across the driver's stop before the next burst, and a lone sample after the stop
    # covers the longest documented period (1.1 s at 33 %) instead of one real one.
    t = T0 + 1_000_000
    burst = [(t + k * P_US, 12) for k in range(1, 5)] + [(t + 5 * P_US, 2)]
    lone = t + 10_000_000
    r = reader(Driver(batch(), batch(*burst), batch((lone, 33))))  # an empty buffer at the start
    r.prime(t / 1e6, 0.0)
    r.read(burst[-1][0] / 1e6 + 0.1, 1.0, 1.0)
    assert r.period.learned and r.period.seconds == pytest.approx(1.1 * P_US / 1e6)
    after = r.read(lone / 1e6, 10.0, 9.0)
    assert after is not None and after.busy_s == pytest.approx(0.33 * 1.1 * P_US / 1e6, rel=0.01)


# -- the clock NVML stamps samples with ----------------------------------------------------------
# NVML documents nvmlSample_t.timeStamp as "CPU timestamp in microseconds", no epoch: most drivers
# stamp the Unix epoch, some the time since boot (CLOCK_BOOTTIME; a public agent found its
# samples dated February 1970 on a host up 58 days).
BOOT0 = 5_011_200.0  # the host's boot clock at monotonic 0 (58 days up)
WALL0 = T0 / 1e6  # the wall clock at monotonic 0


def boot_reader(driver: Driver, boot: Any, notes: list[str] | None = None) -> UtilReader:
    said = notes if notes is not None else []
    return UtilReader(samples=driver, instant=lambda: None, note=lambda key, text: said.append(key), boot=boot)


def test_boot_clock_stamps_count_idle_time_tick_by_tick_as_wall_clock_ones_do() -> None:
    # The GPU ran until 10 s before the start; the driver stopped sampling when it went idle. Each
    # idle tick records its own idle time (not all of it when work resumes), and nothing from
    # before the start is counted.
    mono = {"t": 0.0}
    old = round((BOOT0 - 10) * 1e6)
    fresh = round((BOOT0 + 5) * 1e6)
    drv = Driver(batch((old - P_US, 100), (old, 100)), NOTHING_NEW, NOTHING_NEW, batch((fresh, 100)))
    r = boot_reader(drv, lambda: BOOT0 + mono["t"])
    r.prime(WALL0, 0.0)
    reads = []
    for t in (2.0, 4.0, 5.05):
        mono["t"] = t
        reads.append(r.read(WALL0 + t, t, 2.0 if t < 5 else 1.05))
    period = r.period.seconds  # learned from the two samples before the start
    assert [x.idle_s for x in reads] == pytest.approx([2 - period, 2.0, 1.0], abs=1e-6)
    assert reads[2].busy_s == pytest.approx(period, abs=1e-6)  # one sample: one period


@pytest.mark.parametrize("boot", [None, lambda: 60.0], ids=["no-boot-clock", "boot-clock-disagrees"])
def test_on_an_unknown_clock_no_time_before_the_start_is_counted(boot: Any) -> None:
    # Stamps on a clock gpuledger cannot read (or cannot trust): gaps are classified when the next
    # sample arrives, but the first one after the start counts from the start, not from the
    # newest sample in the buffer (taken 10 minutes before the run).
    old = round((BOOT0 - 600) * 1e6)
    fresh = round((BOOT0 + 5) * 1e6)
    notes: list[str] = []
    drv = Driver(batch((old - P_US, 100), (old, 100)), NOTHING_NEW, batch((fresh, 100)))
    r = boot_reader(drv, boot, notes)
    r.prime(WALL0, 0.0)
    first = r.read(WALL0 + 2.0, 2.0, 2.0)
    second = r.read(WALL0 + 5.05, 5.05, 3.05)
    assert first is not None and second is not None
    period = r.period.seconds
    # 5 s since the start, less what the sample covers; the first sample after the start is
    # fresh, so the start is placed within 0.05 s (the time since that sample) of the truth
    assert first.idle_s + second.idle_s == pytest.approx(5.0 - period, abs=0.06)  # not ~605 s
    assert second.busy_s == pytest.approx(period, abs=1e-6)
    assert notes == ["sample_clock"]


def test_a_wall_clock_step_does_not_move_boot_clock_stamps() -> None:
    # NTP steps the wall clock 30 s forward between two reads; the boot clock does not step, and
    # neither do the samples stamped with it: no step is corrected and no time is unknown.
    mono = {"t": 0.0}
    t = [round((BOOT0 + k / 6) * 1e6) for k in range(0, 19)]
    drv = Driver(batch((t[0], 100)), batch(*((ts, 100) for ts in t[1:7])), batch(*((ts, 100) for ts in t[7:19])))
    notes: list[str] = []
    r = boot_reader(drv, lambda: BOOT0 + mono["t"], notes)
    r.prime(WALL0, 0.0)
    mono["t"] = 1.0
    a = r.read(WALL0 + 1.0, 1.0, 1.0)
    mono["t"] = 3.0
    b = r.read(WALL0 + 30 + 3.0, 3.0, 2.0)
    assert a is not None and b is not None
    assert a.busy_s + b.busy_s == pytest.approx(3.0, abs=1e-6)
    assert a.unknown_s == b.unknown_s == 0
    assert notes == ["sample_clock_boot"]  # which clock, said once; no step noted


def test_samples_later_than_the_boot_clock_are_not_on_it() -> None:
    # The first fresh sample agreed with the boot clock; a later one is 100 s ahead of it (the
    # driver's clock is some other one): from then on gaps wait for the next sample, with a note.
    mono = {"t": 0.0}
    notes: list[str] = []
    drv = Driver(batch((round(BOOT0 * 1e6), 100)), batch((round((BOOT0 + 101) * 1e6), 100)), NOTHING_NEW)
    r = boot_reader(drv, lambda: BOOT0 + mono["t"], notes)
    r.prime(WALL0, 0.0)
    mono["t"] = 1.0
    r.read(WALL0 + 1.0, 1.0, 1.0)
    mono["t"] = 9.0
    idle = r.read(WALL0 + 9.0, 9.0, 8.0)
    assert notes == ["sample_clock_boot", "sample_clock"]
    assert idle is not None and idle.idle_s == 0  # "now" on the driver's clock is not known


@pytest.mark.parametrize("nothing", [NOTHING_NEW, batch()], ids=["not-found", "empty-list"])
def test_an_empty_answer_is_nothing_new_as_not_found_is(nothing: Any) -> None:
    # While the GPU idles, drivers answer "not found" or success with no sample (a public agent
    # saw both): either way the time is idle, counted tick by tick, and the cursor stays.
    t1 = T0 + P_US
    drv = Driver(batch((t1 - P_US, 100), (t1, 100)), nothing, nothing)
    r = reader(drv)
    r.prime(t1 / 1e6, 0.0)
    a = r.read(t1 / 1e6 + 1, 1.0, 1.0)
    b = r.read(t1 / 1e6 + 2, 2.0, 1.0)
    assert a is not None and b is not None
    assert a.idle_s + b.idle_s == pytest.approx(2 - r.period.seconds, abs=1e-6) and a.busy_s == b.busy_s == 0
    assert drv.cursors == [0, t1, t1]
