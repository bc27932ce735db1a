"""Ticks -> intervals: sums are preserved under any grouping, peaks are kept, absent stays absent."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuledger.core.metering.intervals import (
    GpuIntervalBuilder,
    HostIntervalBuilder,
    merge_gpu_intervals,
    merge_gpu_ticks,
    merge_host_intervals,
    merge_host_ticks,
    merge_methods,
)
from gpuledger.core.model import GpuTick, HostTick

UUID = "GPU-0000"


def _opt(strategy: st.SearchStrategy) -> st.SearchStrategy:
    return st.one_of(st.none(), strategy)


_f = st.floats(min_value=0, max_value=1e6, allow_nan=False, allow_infinity=False)
_i = st.integers(min_value=0, max_value=2**50)
_reasons = st.dictionaries(st.sampled_from(["power", "thermal", "sw_power", "hw_slowdown"]), _f, max_size=3)


@st.composite
def gpu_traces(draw: st.DrawFn) -> list[GpuTick]:
    durations = draw(st.lists(st.floats(min_value=0.001, max_value=10), min_size=1, max_size=25))
    # One "presence" flag per field and trace, sometimes mixed per tick, to exercise all-None,
    # all-known and partly-known fields.
    ticks, t = [], draw(st.floats(min_value=0, max_value=2e9))
    for d in durations:
        ticks.append(
            GpuTick(
                uuid=UUID,
                t0=t,
                t1=t + d,
                busy_s=draw(_opt(st.floats(min_value=0, max_value=d))),
                util_method=draw(st.sampled_from([None, "samples", "instant"])),
                util_max_pct=draw(_opt(st.floats(min_value=0, max_value=100))),
                energy_j=draw(_opt(_f)),
                energy_method=draw(st.sampled_from([None, "counter", "power"])),
                power_w=draw(_opt(_f)),
                mem_used_b=draw(_opt(_i)),
                mem_reserved_b=draw(_opt(_i)),
                temp_c=draw(_opt(st.floats(min_value=0, max_value=120))),
                sm_clock_mhz=draw(_opt(st.floats(min_value=0, max_value=3000))),
                mem_clock_mhz=draw(_opt(st.floats(min_value=0, max_value=3000))),
                throttle_s=draw(_opt(_reasons)),
                proc_mem_b=draw(_opt(_i)),
                proc_sm_util_pct=draw(_opt(st.floats(min_value=0, max_value=100))),
            )
        )
        t += d
    return ticks


@st.composite
def host_traces(draw: st.DrawFn) -> list[HostTick]:
    durations = draw(st.lists(st.floats(min_value=0.001, max_value=10), min_size=1, max_size=25))
    ticks, t = [], draw(st.floats(min_value=0, max_value=2e9))
    for d in durations:
        ticks.append(
            HostTick(
                t0=t,
                t1=t + d,
                cpu_s=draw(st.floats(min_value=0, max_value=64 * d)),
                rss_b=draw(_i),
                read_b=draw(_i),
                write_b=draw(_i),
                threads=draw(st.integers(0, 10_000)),
                procs=draw(st.integers(0, 1000)),
                sys_cpu_util_pct=draw(_opt(st.floats(min_value=0, max_value=100))),
                iowait_s=draw(_opt(st.floats(min_value=0, max_value=d))),
                sys_mem_used_b=draw(_opt(_i)),
                disk_read_b=draw(_opt(_i)),
                disk_write_b=draw(_opt(_i)),
                net_rx_b=draw(_opt(_i)),
                net_tx_b=draw(_opt(_i)),
            )
        )
        t += d
    return ticks


def _groups(items: Sequence[Any], cuts: list[int]) -> list[list[Any]]:
    """Any split of a trace into consecutive non-empty groups."""
    points = sorted({0, len(items), *(c % len(items) for c in cuts)})
    return [list(items[a:b]) for a, b in itertools.pairwise(points) if b > a]


def _close(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)


def _known(values: Sequence[Any]) -> list[Any]:
    return [v for v in values if v is not None]


def _total(values: Sequence[Any]) -> Any:
    known = _known(values)
    return (sum(known) if all(isinstance(v, int) for v in known) else math.fsum(known)) if known else None


def _peak(values: Sequence[Any]) -> Any:
    known = _known(values)
    return max(known) if known else None


_cuts = st.lists(st.integers(min_value=0, max_value=100), max_size=10)

GPU_SUMS: dict[str, Callable[[GpuTick], Any]] = {"busy_s": lambda t: t.busy_s, "energy_j": lambda t: t.energy_j}
GPU_PEAKS: dict[str, Callable[[GpuTick], Any]] = {
    "util_max_pct": lambda t: t.util_max_pct,
    "power_max_w": lambda t: t.power_w,
    "mem_used_max_b": lambda t: t.mem_used_b,
    "proc_mem_max_b": lambda t: t.proc_mem_b,
    "temp_max_c": lambda t: t.temp_c,
    "mem_clock_max_mhz": lambda t: t.mem_clock_mhz,
}


@settings(max_examples=200, deadline=None)
@given(ticks=gpu_traces(), cuts=_cuts)
def test_gpu_sums_and_peaks_survive_any_grouping(ticks: list[GpuTick], cuts: list[int]) -> None:
    intervals = [merge_gpu_ticks(UUID, n, g) for n, g in enumerate(_groups(ticks, cuts))]
    assert sum(i.samples for i in intervals) == len(ticks)
    assert intervals[0].t0 == ticks[0].t0 and intervals[-1].t1 == ticks[-1].t1
    for a, b in itertools.pairwise(intervals):
        assert a.t1 == b.t0
    for field, read in GPU_SUMS.items():
        assert _close(_total([getattr(i, field) for i in intervals]), _total([read(t) for t in ticks])), field
    for field, read in GPU_PEAKS.items():
        assert _peak([getattr(i, field) for i in intervals]) == _peak([read(t) for t in ticks]), field
    reasons = {r for t in ticks if t.throttle_s for r in t.throttle_s}
    for reason in reasons:
        by_interval = [i.throttle_s.get(reason) for i in intervals if i.throttle_s]
        by_tick = [t.throttle_s.get(reason) for t in ticks if t.throttle_s]
        assert _close(_total(by_interval), _total(by_tick)), reason
    assert all(i.throttle_s is None for i in intervals) == all(t.throttle_s is None for t in ticks)
    mem_last = _known([i.mem_used_last_b for i in intervals])
    assert (mem_last[-1] if mem_last else None) == (_known([t.mem_used_b for t in ticks]) or [None])[-1]


@settings(max_examples=200, deadline=None)
@given(ticks=gpu_traces(), cuts=_cuts)
def test_gpu_regrouping_intervals_equals_merging_ticks(ticks: list[GpuTick], cuts: list[int]) -> None:
    direct = merge_gpu_ticks(UUID, 0, ticks)
    coarse = merge_gpu_intervals([merge_gpu_ticks(UUID, n, g) for n, g in enumerate(_groups(ticks, cuts))])
    for field in ("busy_s", "energy_j"):
        assert _close(getattr(coarse, field), getattr(direct, field)), field
    for field in (*GPU_PEAKS, "mem_used_last_b", "mem_reserved_b", "util_method", "energy_method", "samples"):
        assert getattr(coarse, field) == getattr(direct, field), field
    assert (coarse.t0, coarse.t1) == (direct.t0, direct.t1)
    # Means re-weight each interval by its span, which equals merging the ticks directly when the
    # gauge was read in every tick (intervals do not keep how much of their span had a reading).
    for field, read in (("sm_clock_avg_mhz", "sm_clock_mhz"), ("proc_sm_util_avg_pct", "proc_sm_util_pct")):
        values = [getattr(t, read) for t in ticks]
        if all(v is not None for v in values) or all(v is None for v in values):
            assert _close(getattr(coarse, field), getattr(direct, field)), field


HOST_SUMS = ("cpu_s", "read_b", "write_b", "iowait_s", "disk_read_b", "disk_write_b", "net_rx_b", "net_tx_b")
HOST_PEAKS = {
    "rss_max_b": "rss_b",
    "threads_max": "threads",
    "procs_max": "procs",
    "sys_mem_used_max_b": "sys_mem_used_b",
}


@settings(max_examples=200, deadline=None)
@given(ticks=host_traces(), cuts=_cuts)
def test_host_sums_and_peaks_survive_any_grouping(ticks: list[HostTick], cuts: list[int]) -> None:
    intervals = [merge_host_ticks(n, g) for n, g in enumerate(_groups(ticks, cuts))]
    assert sum(i.samples for i in intervals) == len(ticks)
    for field in HOST_SUMS:
        by_interval = _total([getattr(i, field) for i in intervals])
        by_tick = _total([getattr(t, field) for t in ticks])
        if isinstance(by_tick, int):
            assert by_interval == by_tick, field  # byte counts are exact
        else:
            assert _close(by_interval, by_tick), field
    for field, read in HOST_PEAKS.items():
        assert _peak([getattr(i, field) for i in intervals]) == _peak([getattr(t, read) for t in ticks]), field
    coarse = merge_host_intervals(intervals)
    direct = merge_host_ticks(0, ticks)
    assert coarse.read_b == direct.read_b and coarse.rss_max_b == direct.rss_max_b
    assert _close(coarse.cpu_s, direct.cpu_s)


@settings(max_examples=200, deadline=None)
@given(ticks=gpu_traces(), interval=st.floats(min_value=0.5, max_value=30))
def test_builder_covers_every_tick_once(ticks: list[GpuTick], interval: float) -> None:
    builder = GpuIntervalBuilder(interval_s=interval)
    intervals = [i for t in ticks for i in builder.add(t)] + builder.flush()
    assert [i.seq for i in intervals] == list(range(len(intervals)))
    assert sum(i.samples for i in intervals) == len(ticks)
    assert _close(_total([i.busy_s for i in intervals]), _total([t.busy_s for t in ticks]))
    assert _peak([i.power_max_w for i in intervals]) == _peak([t.power_w for t in ticks])


# -- hand-computed cases ------------------------------------------------------------------------


def _tick(t0: float, **kw: Any) -> GpuTick:
    return GpuTick(uuid=UUID, t0=t0, t1=t0 + kw.pop("d", 1.0), **kw)


def test_gpu_merge_by_hand() -> None:
    ticks = [
        _tick(0, busy_s=0.5, util_method="samples", energy_j=100.0, energy_method="counter", power_w=120.0,
              mem_used_b=10, mem_reserved_b=20, sm_clock_mhz=1000.0, throttle_s={"power": 0.25}),
        _tick(1, busy_s=1.0, util_method="instant", energy_j=None, power_w=300.0, mem_used_b=30,
              sm_clock_mhz=2000.0, d=3.0, throttle_s={"thermal": 1.0, "power": 0.5}),
        _tick(4, busy_s=None, util_method="samples", mem_used_b=None, temp_c=70.0, throttle_s=None),
    ]  # fmt: skip
    iv = merge_gpu_ticks(UUID, 7, ticks)
    assert (iv.seq, iv.t0, iv.t1, iv.samples) == (7, 0, 5.0, 3)
    assert iv.busy_s == 1.5  # the known parts
    assert iv.energy_j == 100.0 and iv.energy_method == "counter"
    assert iv.util_method == "instant,samples"
    assert iv.power_max_w == 300.0 and iv.temp_max_c == 70.0
    assert (iv.mem_used_max_b, iv.mem_used_last_b, iv.mem_reserved_b) == (30, 30, 20)
    assert iv.sm_clock_avg_mhz == pytest.approx((1000 * 1 + 2000 * 3) / 4)
    assert iv.throttle_s == {"power": 0.75, "thermal": 1.0}
    assert iv.util_max_pct is None and iv.proc_mem_max_b is None and iv.proc_sm_util_avg_pct is None


def test_absent_everywhere_stays_absent() -> None:
    iv = merge_gpu_ticks(UUID, 0, [_tick(0), _tick(1)])
    assert iv.busy_s is None and iv.energy_j is None and iv.throttle_s is None
    assert iv.util_method is None and iv.energy_method is None and iv.power_max_w is None
    iv = merge_gpu_ticks(UUID, 0, [_tick(0, throttle_s={}), _tick(1)])
    assert iv.throttle_s == {}  # measured, nothing throttled: not the same as unknown


def test_host_merge_by_hand() -> None:
    ticks = [
        HostTick(0, 1, cpu_s=1.5, rss_b=100, read_b=10, write_b=1, threads=4, procs=1, sys_cpu_util_pct=50.0),
        HostTick(1, 3, cpu_s=2.5, rss_b=300, read_b=20, write_b=2, threads=9, procs=3, sys_cpu_util_pct=20.0,
                 iowait_s=0.5, net_rx_b=7),
        HostTick(3, 4, cpu_s=1.0, rss_b=200, read_b=0, write_b=0, threads=2, procs=2),
    ]  # fmt: skip
    iv = merge_host_ticks(3, ticks)
    assert (iv.seq, iv.t0, iv.t1, iv.samples) == (3, 0, 4, 3)
    assert (iv.cpu_s, iv.rss_max_b, iv.read_b, iv.write_b) == (5.0, 300, 30, 3)
    assert (iv.threads_max, iv.procs_max) == (9, 3)
    assert iv.sys_cpu_util_avg_pct == pytest.approx((50 * 1 + 20 * 2) / 3)
    assert iv.iowait_s == 0.5 and iv.net_rx_b == 7
    assert iv.net_tx_b is None and iv.disk_read_b is None and iv.sys_mem_used_max_b is None


def test_merge_methods() -> None:
    assert merge_methods(["samples", "samples"]) == "samples"
    assert merge_methods(["samples", None, "instant"]) == "instant,samples"
    assert merge_methods(["instant,samples", "samples"]) == "instant,samples"
    assert merge_methods([None, None]) is None


def test_merge_refuses_nonsense() -> None:
    with pytest.raises(ValueError):
        merge_gpu_ticks(UUID, 0, [])
    with pytest.raises(ValueError):
        merge_gpu_ticks(UUID, 0, [GpuTick(uuid="GPU-other", t0=0, t1=1)])
    with pytest.raises(ValueError):
        merge_host_ticks(0, [])
    with pytest.raises(ValueError):
        GpuIntervalBuilder(interval_s=0)


def test_builder_groups_one_second_ticks_into_five_second_intervals() -> None:
    builder = GpuIntervalBuilder(interval_s=5.0)
    jitter = [0.0, 0.01, -0.02, 0.015, -0.01, 0.02, 0.0, -0.015, 0.01, 0.0, 0.02, -0.01]
    out, t = [], 100.0
    for j in jitter:
        out += builder.add(GpuTick(uuid=UUID, t0=t, t1=t + 1 + j, busy_s=0.5))
        out += builder.add(GpuTick(uuid="GPU-1", t0=t, t1=t + 1 + j, busy_s=1.0))
        t += 1 + j
    out += builder.flush()
    by_device = {u: [i for i in out if i.device_uuid == u] for u in (UUID, "GPU-1")}
    for intervals in by_device.values():
        assert [i.samples for i in intervals] == [5, 5, 2]
        assert [i.seq for i in intervals] == [0, 1, 2]
    assert sum(i.busy_s for i in by_device["GPU-1"]) == 12.0


def test_builder_closes_an_interval_at_a_gap() -> None:
    builder = HostIntervalBuilder(interval_s=5.0)
    ticks = [HostTick(t, t + 1, 1.0, 1, 0, 0, 1, 1) for t in (0, 1, 2, 10, 11, 12, 13, 14)]
    out = [i for t in ticks for i in builder.add(t)] + builder.flush()
    assert [(i.t0, i.t1, i.samples) for i in out] == [(0, 3, 3), (10, 15, 5)]
    assert [i.seq for i in out] == [0, 1]
