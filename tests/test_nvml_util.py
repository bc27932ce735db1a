"""The per-device sample-buffer reader (collect/nvml_util.py) against batches a driver really hands back."""

from __future__ import annotations

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
