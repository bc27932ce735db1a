"""Downsampling: the SQL buckets equal the pure reference, totals survive, a 1-second spike survives."""

from __future__ import annotations

import math

import pytest

from diag_support import T0, device, gpu_intervals, host_intervals
from gpuledger.core.metering import series
from gpuledger.core.model import RunRecord
from gpuledger.store import Ledger, series_queries

RUN = "0190bbbb-0000-7000-8000-00000000000a"
N = 3000  # 1-second intervals: more than MAX_POINTS, so the run is downsampled
SPIKE = 1234


def _spiky(i: int) -> float:
    return 1.0 if i == SPIKE else 0.02


def _dip(i: int) -> float:
    return 5.0 if i == 2000 else 40.0  # one interval where memory dropped


@pytest.fixture
def ledger(ledger_url: str):
    with Ledger(ledger_url) as led:
        led.create_run(
            RunRecord(
                id=RUN, command=["x"], user="u", host="h", cwd="/", started_at=T0, status="succeeded", ended_at=T0 + N
            )
        )
        devs = [device(0), device(1)]
        led.add_devices(RUN, devs)
        throttle = lambda i: {"power": 0.5, "thermal": 0.25} if i % 7 == 0 else ({} if i % 11 else None)  # noqa: E731
        led.append(RUN, gpu=gpu_intervals(devs[0].uuid, N, step=1.0, util=_spiky, mem_gib=_dip, throttle=throttle))
        led.append(RUN, gpu=gpu_intervals(devs[1].uuid, N, step=1.0, util=lambda i: 0.5 + (i % 3) * 0.1))
        led.append(RUN, host=host_intervals(N, step=1.0, cores=lambda i: 1.0 + (i % 5) * 0.1))
        yield led


def test_sql_buckets_equal_the_pure_reference(ledger: Ledger) -> None:
    plan = series.plan(T0, T0 + N, N, max_points=100)
    assert plan.width_s is not None
    fast = series_queries.bucketed_gpu(ledger, RUN, plan)
    ref = series.bucket_gpu(ledger.gpu_intervals(RUN), plan)
    assert fast.keys() == ref.keys()
    for uuid in ref:
        assert [b.key for b in fast[uuid]] == [b.key for b in ref[uuid]]
        for a, b in zip(fast[uuid], ref[uuid], strict=True):
            assert (a.n, a.util_min, a.util_max, a.mem_min_b, a.sm_clock_min_mhz, a.throttled) == pytest.approx(
                (b.n, b.util_min, b.util_max, b.mem_min_b, b.sm_clock_min_mhz, b.throttled)
            )
            assert a.covered_s == pytest.approx(b.covered_s)
            # the SQL twin's bucket spans are the plan's edges, clipped to the stream
            assert fast[uuid][0].merged.t0 == pytest.approx(ref[uuid][0].merged.t0)
            assert fast[uuid][-1].merged.t1 == pytest.approx(ref[uuid][-1].merged.t1)
            for name in (
                "busy_s",
                "energy_j",
                "power_max_w",
                "mem_used_max_b",
                "proc_mem_max_b",
                "temp_max_c",
                "sm_clock_avg_mhz",
                "util_max_pct",
                "util_method",
                "energy_method",
            ):
                assert getattr(a.merged, name) == pytest.approx(getattr(b.merged, name)), name
            assert a.merged.throttle_s == pytest.approx(b.merged.throttle_s)
    host_fast = series_queries.bucketed_host(ledger, RUN, plan)
    host_ref = series.bucket_host(ledger.host_intervals(RUN), plan)
    for a, b in zip(host_fast, host_ref, strict=True):
        assert (a.key, a.n, a.cpu_rate_min, a.cpu_rate_max, a.rss_min_b) == pytest.approx(
            (b.key, b.n, b.cpu_rate_min, b.cpu_rate_max, b.rss_min_b)
        )
        for name in ("cpu_s", "rss_max_b", "read_b", "sys_cpu_util_avg_pct", "iowait_s", "procs_max"):
            assert getattr(a.merged, name) == pytest.approx(getattr(b.merged, name)), name


def test_totals_over_buckets_equal_totals_over_intervals(ledger: Ledger) -> None:
    plan = series.plan(T0, T0 + N, N, max_points=64)
    buckets = series_queries.bucketed_gpu(ledger, RUN, plan)
    totals = ledger.gpu_totals(RUN)
    for uuid, bs in buckets.items():
        assert sum(b.merged.busy_s for b in bs) == pytest.approx(totals[uuid]["busy_s"])
        assert sum(b.merged.energy_j for b in bs) == pytest.approx(totals[uuid]["energy_j"])
        assert max(b.merged.mem_used_max_b for b in bs) == totals[uuid]["mem_used_max_b"]


def test_a_one_second_spike_and_a_one_second_drop_survive_downsampling(ledger: Ledger) -> None:
    from gpuledger.reports.run import charts
    from gpuledger.reports.run import data as rundata

    data = rundata.load(ledger, ledger.get_run(RUN), max_points=50)
    assert data.downsampled and data.plan.width_s == pytest.approx(N / 50, rel=1e-6)
    util = next(c for c in charts.gpu_charts(data) if c["id"] == "gpu_util")
    gpu0 = util["series"][0]
    assert len(gpu0["values"]) == 50
    assert max(gpu0["hi"]) == 100.0  # the spike, in its bucket's envelope
    assert max(gpu0["values"]) < 5.0  # ... although the bucket mean barely moves
    spike_bucket = int(SPIKE // data.plan.width_s)
    assert gpu0["hi"][spike_bucket] == 100.0
    vram = next(c for c in charts.gpu_charts(data) if c["id"] == "vram")
    assert min(v for v in vram["series"][0]["lo"] if v is not None) == pytest.approx(5.0)


def test_minmax_points_keeps_extremes_in_time_order() -> None:
    pts = [(float(t), 1.0) for t in range(10_000)]
    pts[4321] = (4321.0, 99.0)
    pts[777] = (777.0, -5.0)
    thin = series.minmax_points(pts, 100)
    assert len(thin) <= 200
    assert (4321.0, 99.0) in thin and (777.0, -5.0) in thin
    assert thin == sorted(thin)


def test_small_runs_are_not_downsampled() -> None:
    assert series.plan(T0, T0 + 100, 100).width_s is None
    assert series.plan(T0, T0 + 100, series.MAX_POINTS + 1).width_s is not None


LOST = range(1000, 1200)  # samples lost, no instant reading: 0.6 s of each second unmeasured
BY_INSTANT = range(1500, 1600)  # samples lost, measured by the instant reading


def test_a_big_runs_report_does_not_count_unmeasured_time_as_idle(ledger_url: str) -> None:
    # Over MAX_POINTS intervals the report buckets in SQL; it must say what `show` says (the
    # summary over every interval): unmeasured time is neither busy nor idle.
    from gpuledger.core.metering.busy import unmeasured_seconds
    from gpuledger.core.metering.summary import summarize
    from gpuledger.reports.run import data as rundata

    with Ledger(ledger_url) as led:
        run = RunRecord(id=RUN, command=["x"], user="u", host="h", cwd="/", started_at=T0, status="succeeded",
                        ended_at=T0 + N)  # fmt: skip
        led.create_run(run)
        dev = device(0)
        led.add_devices(RUN, [dev])
        ivs = gpu_intervals(dev.uuid, N, step=1.0, util=lambda i: 0.3 if i in LOST else 0.5)
        for i in [*LOST, *BY_INSTANT]:
            ivs[i].util_unknown_s = 0.6
            ivs[i].util_method = "instant,samples" if i in BY_INSTANT else "samples"
        led.append(RUN, gpu=ivs)
        raw = led.gpu_intervals(RUN)
        assert math.fsum(map(unmeasured_seconds, raw)) == pytest.approx(120.0)

        plan = series.plan(T0, T0 + N, N, max_points=100)
        fast = series_queries.bucketed_gpu(led, RUN, plan)[dev.uuid]
        ref = series.bucket_gpu(raw, plan)[dev.uuid]
        per_bucket = [unmeasured_seconds(b.merged) for b in ref]
        assert [unmeasured_seconds(b.merged) for b in fast] == pytest.approx(per_bucket)
        assert math.fsum(unmeasured_seconds(b.merged) for b in fast) == pytest.approx(120.0)

        report = rundata.load(led, led.get_run(RUN)).summary["gpus"][0]
        show = summarize(run, [dev], raw, [], now=T0 + N)["gpus"][0]
        for key in ("unmeasured_seconds", "idle_seconds", "mean_utilization", "busy_seconds"):
            assert report[key] == pytest.approx(show[key]), key
        assert report["unmeasured_seconds"] == pytest.approx(120.0)


def test_a_bucket_mixing_measured_and_unmeasured_lost_samples_keeps_each_apart() -> None:
    # Merged, the method says "instant,samples" for both intervals: only the bucket's own sum can
    # tell that the first interval's lost second was measured by nobody.
    from gpuledger.core.metering.busy import unmeasured_seconds

    a, b = gpu_intervals("GPU-x", 2, step=1.0)
    a.util_unknown_s, a.util_method = 0.75, "samples"
    b.util_unknown_s, b.util_method = 0.5, "instant,samples"
    (bucket,) = series.bucket_gpu([a, b], series.plan(T0, T0 + 2, 2, max_points=1))["GPU-x"]
    assert bucket.merged.util_method == "instant,samples"
    assert unmeasured_seconds(bucket.merged) == pytest.approx(0.75)
