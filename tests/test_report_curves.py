"""A big run's report curves equal curves made from every interval in Python.

The report buckets a big run in the database (store/series_queries.py: on SQLite seq range by
seq range, falling back to a GROUP BY for a stream out of time order or with a hole in its
seqs; on PostgreSQL a GROUP BY). Here the buckets are computed again from every interval read
into Python, written out plainly, and both go through the same chart code: every curve, band
and x position must be equal. Figures sit on a binary grid (quarter seconds, eighths of a
second busy, whole watts), so every sum is exact in any order and equality is exact.
"""

from __future__ import annotations

import math
import uuid as uuidlib
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from diag_support import T0, device
from gpuledger.core.metering import series
from gpuledger.core.model import GpuInterval, HostInterval, RunRecord
from gpuledger.reports.run import charts
from gpuledger.reports.run import data as rundata
from gpuledger.store import Ledger, series_queries

GIB = 2**30
REASONS = ({}, {"power": 0.25}, {"thermal": 0.5, "sync_boost": 0.25}, {"power": 0.5, "hw_slowdown": 0.125})


@st.composite
def gpu_rows(draw: st.DrawFn) -> dict[str, Any]:
    span = draw(st.sampled_from([0.25, 0.5, 1.0, 1.0, 1.0, 2.0, 0.0]))
    busy = draw(st.one_of(st.none(), st.integers(0, 8)))
    return {
        "gap": draw(st.sampled_from([0.0, 0.0, 0.0, 0.25, 6.0, 40.0])),
        "span": span,
        "busy_s": None if busy is None else span * busy / 8,
        "util_max_pct": None if busy is None else busy * 12.5,
        "energy_j": draw(st.one_of(st.none(), st.integers(0, 800).map(lambda j: j / 2))),
        "power_max_w": draw(st.one_of(st.none(), st.integers(60, 700).map(float))),
        "mem_used_max_b": draw(st.one_of(st.none(), st.integers(0, 80 * 4).map(lambda q: q * GIB // 4))),
        "proc_mem_max_b": draw(st.one_of(st.none(), st.integers(0, 80).map(lambda g: g * GIB))),
        "temp_max_c": draw(st.one_of(st.none(), st.integers(30, 90).map(float))),
        "sm_clock_avg_mhz": draw(st.one_of(st.none(), st.integers(200, 1980).map(float))),
        "util_unmeasured_s": draw(st.sampled_from([None, 0.0, span / 4])),
        "reasons": draw(st.integers(0, len(REASONS) - 1)),
    }


@st.composite
def streams(draw: st.DrawFn) -> dict[str, Any]:
    rows = draw(st.lists(gpu_rows(), min_size=1, max_size=70))
    return {
        "rows": rows,
        "throttle": draw(st.sampled_from(["none", "dicts"])),  # a stream records throttling or never
        # one pair of neighbours swapped in time (their seqs kept), one interval moved back to the
        # stream's start (far from its seq's neighbours), and a seq skipped
        "swap": draw(st.one_of(st.none(), st.integers(0, max(0, len(rows) - 2)))),
        "stray": draw(st.one_of(st.none(), st.integers(1, max(1, len(rows) - 1)))),
        "hole": draw(st.one_of(st.none(), st.integers(1, max(1, len(rows) - 1)))),
    }


def _gpu(uuid: str, spec: dict[str, Any], start: float) -> list[GpuInterval]:
    out, t, seq = [], start, 0
    for i, r in enumerate(spec["rows"]):
        t += r["gap"]
        if spec["hole"] == i:
            seq += 1
        throttle = None if spec["throttle"] == "none" else {k: v * r["span"] for k, v in REASONS[r["reasons"]].items()}
        fields = {k: v for k, v in r.items() if k not in ("gap", "span", "reasons")}
        out.append(GpuInterval(device_uuid=uuid, seq=seq, t0=t, t1=t + r["span"], throttle_s=throttle, **fields))
        t, seq = t + r["span"], seq + 1
    if spec["swap"] is not None and spec["swap"] + 1 < len(out):
        a, b = out[spec["swap"]], out[spec["swap"] + 1]
        (a.t0, a.t1), (b.t0, b.t1) = (b.t0, b.t1), (a.t0, a.t1)
    if spec["stray"] is not None and spec["stray"] < len(out):
        iv = out[spec["stray"]]
        iv.t0, iv.t1 = start, start + (iv.t1 - iv.t0)
    return out


def _host(n: int, start: float, step: float) -> list[HostInterval]:
    return [
        HostInterval(
            seq=i,
            t0=start + i * step,
            t1=start + (i + 1) * step,
            cpu_s=(i % 7) * step / 4,
            rss_max_b=(4 + i % 5) * GIB,
            read_b=(i % 3) * 2**20,
            write_b=2**20,
            procs_max=3 + i % 4,
            sys_cpu_util_avg_pct=None if i % 9 == 4 else float(i % 50),
            iowait_s=None if i % 5 == 1 else (i % 2) * step / 8,
            sys_mem_used_max_b=(40 + i % 3) * GIB,
            disk_read_b=(i % 4) * 2**20,
            disk_write_b=2**19,
            net_rx_b=None if i % 6 == 0 else 2**18,
            net_tx_b=2**16,
        )
        for i in range(n)
    ]


# -- the reference: every interval in Python, written out plainly ----------------------------------


def _known(values: list[Any]) -> list[Any]:
    return [v for v in values if v is not None]


def _top(values: list[Any], pick: Any = max) -> Any:
    known = _known(values)
    return pick(known) if known else None


def _total(values: list[Any]) -> Any:
    known = _known(values)
    return sum(known) if known else None


def _by_bucket(ivs: list[Any], plan: series.Plan) -> dict[int, list[Any]]:
    out: dict[int, list[Any]] = {}
    for iv in ivs:
        out.setdefault(plan.key(iv.t0), []).append(iv)
    return dict(sorted(out.items()))


def reference_gpu(ivs: list[GpuInterval], plan: series.Plan) -> list[series.GpuBucket]:
    # Throttling is known for the whole stream (the recorder reads it or never does).
    known = any(iv.throttle_s is not None for iv in ivs)
    out = []
    for key, part in _by_bucket(ivs, plan).items():
        utils = [
            min(1.0, max(0.0, iv.busy_s / (iv.t1 - iv.t0))) for iv in part if iv.busy_s is not None and iv.t1 > iv.t0
        ]
        clocks = _known([iv.sm_clock_avg_mhz for iv in part])
        throttled = [iv.throttle_s for iv in part if iv.throttle_s]
        reasons = {r for t in throttled for r in t}
        merged = GpuInterval(
            device_uuid=part[0].device_uuid,
            seq=key,
            t0=part[0].t0,
            t1=part[-1].t1,
            busy_s=_total([iv.busy_s for iv in part]),
            energy_j=_total([iv.energy_j for iv in part]),
            power_max_w=_top([iv.power_max_w for iv in part]),
            mem_used_max_b=_top([iv.mem_used_max_b for iv in part]),
            proc_mem_max_b=_top([iv.proc_mem_max_b for iv in part]),
            temp_max_c=_top([iv.temp_max_c for iv in part]),
            sm_clock_avg_mhz=sum(clocks) / len(clocks) if clocks else None,  # per interval, as documented
            throttle_s={r: sum(t.get(r, 0.0) for t in throttled if r in t) for r in reasons} if known else None,
        )
        out.append(
            series.GpuBucket(
                key=key,
                merged=merged,
                n=len(part),
                covered_s=sum(iv.t1 - iv.t0 for iv in part),
                util_min=min(utils) if utils else None,
                util_max=max(utils) if utils else None,
                mem_min_b=_top([iv.mem_used_max_b for iv in part], min),
                sm_clock_min_mhz=min(clocks) if clocks else None,
                throttled=len(throttled),
            )
        )
    return out


def reference_host(ivs: list[HostInterval], plan: series.Plan) -> list[series.HostBucket]:
    out = []
    for key, part in _by_bucket(ivs, plan).items():
        rates = [iv.cpu_s / (iv.t1 - iv.t0) for iv in part if iv.t1 > iv.t0]
        weighed = [(iv.sys_cpu_util_avg_pct, iv.t1 - iv.t0) for iv in part if iv.sys_cpu_util_avg_pct is not None]
        weight = sum(w for _, w in weighed)
        sys_cpu = sum(v * w for v, w in weighed) / weight if weight else _top([v for v, _ in weighed], _mean)
        merged = HostInterval(
            seq=key,
            t0=min(iv.t0 for iv in part),
            t1=max(iv.t1 for iv in part),
            cpu_s=sum(iv.cpu_s for iv in part),
            rss_max_b=max(iv.rss_max_b for iv in part),
            read_b=sum(iv.read_b for iv in part),
            write_b=sum(iv.write_b for iv in part),
            procs_max=max(iv.procs_max for iv in part),
            sys_cpu_util_avg_pct=sys_cpu,
            iowait_s=_total([iv.iowait_s for iv in part]),
            sys_mem_used_max_b=_top([iv.sys_mem_used_max_b for iv in part]),
            disk_read_b=_total([iv.disk_read_b for iv in part]),
            disk_write_b=_total([iv.disk_write_b for iv in part]),
            net_rx_b=_total([iv.net_rx_b for iv in part]),
            net_tx_b=_total([iv.net_tx_b for iv in part]),
        )
        out.append(
            series.HostBucket(
                key=key,
                merged=merged,
                n=len(part),
                covered_s=sum(iv.t1 - iv.t0 for iv in part),
                cpu_rate_min=min(rates) if rates else None,
                cpu_rate_max=max(rates) if rates else None,
                rss_min_b=min(iv.rss_max_b for iv in part),
            )
        )
    return out


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def curves(data: rundata.RunData, cores: int | None) -> list[Any]:
    return [
        (c["id"], c["x"], [(s["label"], s["values"], s.get("lo"), s.get("hi")) for s in c["series"]])
        for c in charts.gpu_charts(data) + charts.host_charts(data, cores)
    ]


# -- the property ---------------------------------------------------------------------------------


def _store(led: Ledger, specs: list[dict[str, Any]], host_step: float) -> tuple[RunRecord, list[Any], list[Any]]:
    run_id = str(uuidlib.uuid4())
    devs = [device(i) for i in range(len(specs))]
    gpu = [iv for d, spec in zip(devs, specs, strict=True) for iv in _gpu(d.uuid, spec, T0)]
    end = max(iv.t1 for iv in gpu)
    host = _host(max(1, math.ceil((end - T0) / host_step)), T0, host_step)
    run = RunRecord(
        id=run_id, command=["x"], user="u", host="h", cwd="/", started_at=T0, status="succeeded", ended_at=end
    )
    led.create_run(run)
    led.add_devices(run_id, devs)
    led.append(run_id, gpu=gpu, host=host)
    return run, gpu, host


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    specs=st.lists(streams(), min_size=1, max_size=3),
    points=st.integers(2, 12),
    host_step=st.sampled_from([0.5, 1.0, 3.0]),
    cores=st.sampled_from([None, 4]),
)
def test_the_reports_curves_equal_curves_from_every_interval(
    ledger_url: str, specs: list[dict[str, Any]], points: int, host_step: float, cores: int | None
) -> None:
    with Ledger(ledger_url) as led:
        run, gpu, host = _store(led, specs, host_step)
        data = rundata.load(led, run, max_points=points)
        assume(data.downsampled)
        ref = rundata.RunData(
            run,
            data.devices,
            data.plan,
            {
                u: reference_gpu([iv for iv in gpu if iv.device_uuid == u], data.plan)
                for u in {iv.device_uuid for iv in gpu}
            },
            reference_host(host, data.plan),
            [],
            [],
            data.counts,
            data.end,
            data.now,
        )
        assert curves(data, cores) == curves(ref, cores)
        assert data.summary["busy_gpu_hours"] == pytest.approx(
            _total([iv.busy_s for iv in gpu]) / 3600 if any(iv.busy_s is not None for iv in gpu) else None
        )


def test_a_stream_in_time_order_is_summed_by_seq_ranges_and_one_out_of_order_is_grouped(tmp_path: Any) -> None:
    # The fast path must be the one taken for what the recorder writes (a pause and a change of
    # pace included: a bucket holding many more intervals than the last one), and must refuse what
    # it cannot prove (the property above checks that both paths draw the right curves).
    def rows(spans: list[float]) -> list[dict[str, Any]]:
        return [{"gap": 0.0, "span": s, "busy_s": s / 2, "reasons": 0} for s in spans]

    in_order = {"rows": rows([1.0] * 50), "throttle": "dicts", "swap": None, "stray": None, "hole": None}
    paused = {**in_order, "rows": [*rows([1.0] * 20), {**rows([1.0])[0], "gap": 15.0}, *rows([1.0] * 29)]}
    faster = {**in_order, "rows": rows([4.0] * 10 + [0.25] * 40)}
    with Ledger(f"sqlite:///{tmp_path}/l.db") as led:
        # 7 buckets of 50/7 s: seqs 21 and 22 lie in two buckets (swapped inside one, they may stay)
        odd = ({**in_order, "swap": 21}, {**in_order, "stray": 40}, {**in_order, "hole": 30})
        for spec, fast in ((in_order, True), (paused, True), (faster, True), *((o, False) for o in odd)):
            run, gpu, _ = _store(led, [spec], 1.0)
            plan = series.plan(T0, T0 + 50, 50, max_points=7)
            found = led.read(lambda c: series_queries._device_by_ranges(c, run.id, gpu[0].device_uuid, plan))  # noqa: B023
            assert (found is not None) == fast
            if fast:
                assert found is not None
                assert [r["n"] for r in found[0]] == [b.n for b in reference_gpu(gpu, plan)]


MIDNIGHT = 1_760_054_400.0  # 2025-10-10 00:00 UTC, 54,400 s after T0


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    specs=st.lists(streams(), min_size=1, max_size=2),
    before=st.sampled_from([0.0, 3.0, 30.0]),
    long=st.sampled_from([None, 0.5, 2 * 86400.0]),  # one interval across midnight, or two
    points=st.integers(2, 9),
)
def test_the_run_is_priced_from_the_series_pass_as_from_its_intervals(
    ledger_url: str, specs: list[dict[str, Any]], before: float, long: float | None, points: int
) -> None:
    # The report prices the run from day sums its series pass made (cost_queries.summed_streams):
    # they must be the sums the cost engine reads from the intervals, midnights included.
    from gpuledger.reports.cost.costing import load_rate_card, run_costs
    from gpuledger.store import cost_queries as cq

    if long is not None:
        specs = [
            {**s, "rows": [*s["rows"], {**s["rows"][0], "gap": 0.0, "span": long, "busy_s": long / 2}]} for s in specs
        ]
    with Ledger(ledger_url) as led:
        run_id = str(uuidlib.uuid4())
        devs = [device(i) for i in range(len(specs))]
        start = MIDNIGHT - before - sum(r["gap"] + r["span"] for r in specs[0]["rows"]) / 2
        gpu = [iv for d, spec in zip(devs, specs, strict=True) for iv in _gpu(d.uuid, spec, start)]
        end = max(iv.t1 for iv in gpu)
        run = RunRecord(id=run_id, command=["x"], user="u", host="h", cwd="/", started_at=start,
                        status="succeeded", ended_at=end)  # fmt: skip
        led.create_run(run)
        led.add_devices(run_id, devs)
        led.append(run_id, gpu=gpu)
        data = rundata.load(led, run, max_points=points, days=True)
        assume(data.downsampled)
        if led.dialect == "sqlite" and all(s["swap"] is s["stray"] is s["hole"] is None for s in specs):
            assert set(data.day_sums) == {(run_id, d.uuid) for d in devs}  # the fast path summed them
        plain = led.read(lambda c: cq.interval_sums(c, [run_id], None, None))
        with cq.summed_streams(data.day_sums):
            given_sums = led.read(lambda c: cq.interval_sums(c, [run_id], None, None))
        key = lambda r: (r["device_uuid"], r.get("day"), r["t0"])  # noqa: E731
        assert sorted(given_sums[0], key=key) == sorted(plain[0], key=key)
        assert sorted(given_sums[1], key=key) == sorted(plain[1], key=key)
        card = load_rate_card(None)
        with cq.summed_streams(data.day_sums):
            priced = run_costs(led, [run_id], scope=None, card=card)
        assert priced == run_costs(led, [run_id], scope=None, card=card)


def test_an_empty_interval_at_midnight_is_priced_on_the_day_it_starts(tmp_path: Any) -> None:
    # Every later interval in its bucket ends after midnight, which tells the bucket is not one
    # day's; an interval of no length starting at midnight is told only by its start.
    from gpuledger.store import cost_queries as cq

    rows = [{"gap": 0.0, "span": 1.0, "busy_s": 0.5, "reasons": 0} for _ in range(10)]
    spec = {"rows": [*rows, {**rows[0], "span": 0.0, "busy_s": 0.0}], "throttle": "none", "swap": None}
    spec.update(stray=None, hole=None)
    with Ledger(f"sqlite:///{tmp_path}/l.db") as led:
        run_id, dev = str(uuidlib.uuid4()), device(0)
        gpu = _gpu(dev.uuid, spec, MIDNIGHT - 10)
        run = RunRecord(id=run_id, command=["x"], user="u", host="h", cwd="/", started_at=MIDNIGHT - 10,
                        status="succeeded", ended_at=MIDNIGHT)  # fmt: skip
        led.create_run(run)
        led.add_devices(run_id, [dev])
        led.append(run_id, gpu=gpu)
        data = rundata.load(led, run, max_points=3, days=True)
        assert data.day_sums
        with cq.summed_streams(data.day_sums):
            days = {r["day"]: r["intervals"] for r in led.read(lambda c: cq.interval_days(c, [run_id], None, None))}
        assert days == {int(MIDNIGHT // 86400) - 1: 10, int(MIDNIGHT // 86400): 1}
        # ... and the sums given are the ones used: no read of the intervals behind them
        doctored = {k: ([{**r, "intervals": 7} for r in rows], raw) for k, (rows, raw) in data.day_sums.items()}
        with cq.summed_streams(doctored):
            assert {r["intervals"] for r in led.read(lambda c: cq.interval_days(c, [run_id], None, None))} == {7}
