"""The ClickHouse store's key-range reads (series/clickhouse_keyed.py) on chDB: which rows of a
batch it already holds (``held``, what live ingest leaves out, store/series_live.py), and a run's
rows in a time window (``gpu_intervals_between``, ``host_intervals_between``), which must be the
whole run's rows filtered to the window, rows reaching into it from before included."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ci_support import need_module

need_module("chdb", "pip install 'gpuledger[clickhouse]'")

from gpuledger.series.clickhouse import ClickHouseSeries  # noqa: E402
from test_series_clickhouse import _gpu, _run_id  # noqa: E402

DAY = 86400
T = (int(time.time()) // DAY - 3) * DAY  # a midnight three days ago: inside the raw window


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClickHouseSeries]:
    """One store for the module (chDB holds one folder per process); each test writes runs of its own."""
    s = ClickHouseSeries(f"chdb://{tmp_path_factory.mktemp('keyed')}/series", raw_days=60)
    s.create()
    yield s
    s.close()


def _host(seq: int, t0: float, t1: float) -> dict[str, Any]:
    return {
        "seq": seq, "t0": t0, "t1": t1, "samples": 5, "cpu_s": 1.5, "rss_max_b": 1 << 20, "read_b": 0,
        "write_b": 0, "threads_max": 4, "procs_max": 1,
    }  # fmt: skip


# -- held -------------------------------------------------------------------------------------------


def test_held_finds_the_runs_rows_not_another_runs_at_the_same_gpu_and_time(store: ClickHouseSeries) -> None:
    run, other = _run_id(), _run_id()
    gpu = [_gpu("GPU-h", s, T + 5 * s, T + 5 * s + 5) for s in range(6)]
    host = [_host(s, T + 5 * s, T + 5 * s + 5) for s in range(6)]
    store.write(run, gpu[:3], host[:2], token=f"{run}:first")
    # Another run on the same GPU at the same times (a shared GPU), and this run's other GPU.
    store.write(other, gpu, host, token=f"{other}:all")
    store.write(run, [_gpu("GPU-other", 4, T + 20, T + 25)], [], token=f"{run}:other-gpu")

    batch = [*gpu, _gpu("GPU-other", 3, T + 15, T + 20), _gpu("GPU-other", 4, T + 20, T + 25)]
    gpu_held, host_held = store.held(run, batch, host)
    assert gpu_held == {("GPU-h", 0), ("GPU-h", 1), ("GPU-h", 2), ("GPU-other", 4)}
    assert host_held == {0, 1}
    # Rows this run holds on another GPU than the batch's: not counted.
    assert store.held(run, [_gpu("GPU-third", 4, T + 20, T + 25)], []) == (set(), set())
    assert store.held(_run_id(), batch, host) == (set(), set())  # a run with nothing stored
    assert store.held(run, [], []) == (set(), set())


def test_held_reads_only_the_batchs_time_range(store: ClickHouseSeries) -> None:
    """A row of the run at the same seq but outside the batch's t0 range is not read (by key)."""
    run = _run_id()
    store.write(run, [_gpu("GPU-r", 7, T + 500, T + 505)], [_host(7, T + 500, T + 505)], token=f"{run}:late")
    assert store.held(run, [_gpu("GPU-r", 7, T, T + 5)], [_host(7, T, T + 5)]) == (set(), set())
    assert store.held(run, [_gpu("GPU-r", 7, T + 500, T + 505)], [_host(7, T + 500, T + 505)]) == (
        {("GPU-r", 7)},
        {7},
    )


# -- window reads -----------------------------------------------------------------------------------

_MS_TIMES = st.integers(min_value=0, max_value=40 * DAY * 1000)  # ms after T - 20 days
_DURS = st.one_of(st.integers(0, 10_000), st.integers(0, 30 * DAY * 1000))  # mostly short, some of days
_INTERVALS = st.lists(st.tuples(st.sampled_from(["GPU-a", "GPU-b"]), _MS_TIMES, _DURS), min_size=1, max_size=25)
_EDGE = st.one_of(_MS_TIMES.map(lambda ms: T - 20 * DAY + ms / 1000), st.floats(T - 60 * DAY, T + 60 * DAY))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(intervals=_INTERVALS, windows=st.lists(st.tuples(_EDGE, _EDGE), min_size=1, max_size=4))
def test_a_window_read_is_the_whole_read_filtered_to_the_window(
    store: ClickHouseSeries, intervals: list[tuple[str, int, int]], windows: list[tuple[float, float]]
) -> None:
    """Rows of any length, crossing midnights, of no length, at a window's edges; another run on the
    same GPUs and times: the window read is exactly the rows of the whole read with t1 > t_from and
    t0 < t_to, in the same order."""
    run, other = _run_id(), _run_id()
    base = T - 20 * DAY
    gpu = [_gpu(d, i, base + a / 1000, base + (a + dur) / 1000) for i, (d, a, dur) in enumerate(intervals)]
    host = [_host(i, base + a / 1000, base + (a + dur) / 1000) for i, (_, a, dur) in enumerate(intervals)]
    store.write(run, gpu, host, token=f"{run}:all")
    store.write(other, gpu, host, token=f"{other}:all")
    whole_gpu, whole_host = store.gpu_intervals(run), store.host_intervals(run)
    assert len(whole_gpu) == len(whole_host) == len(intervals)
    # the edges of the rows themselves too: where a wrong comparison would show
    edges = [(r["t0"], r["t1"]) for r in whole_gpu[:2]] + [(r["t1"], r["t1"] + 1) for r in whole_gpu[:2]]
    for t_from, t_to in [*windows, *edges]:
        assert store.gpu_intervals_between(run, t_from, t_to) == [
            r for r in whole_gpu if r["t1"] > t_from and r["t0"] < t_to
        ], (t_from, t_to)
        assert store.host_intervals_between(run, t_from, t_to) == [
            r for r in whole_host if r["t1"] > t_from and r["t0"] < t_to
        ], (t_from, t_to)


def test_a_window_of_a_run_the_store_does_not_hold_is_empty(store: ClickHouseSeries) -> None:
    assert store.gpu_intervals_between(_run_id(), T, T + DAY) == []
    assert store.host_intervals_between(_run_id(), T, T + DAY) == []


def test_a_window_needs_finite_bounds(store: ClickHouseSeries) -> None:
    with pytest.raises(ValueError, match="finite"):
        store.gpu_intervals_between("r", float("-inf"), T)
    with pytest.raises(ValueError, match="finite"):
        store.host_intervals_between("r", T, float("nan"))
