"""The compact PostgreSQL series store (series/postgres.py) on the real PostgreSQL server, each test
in a schema of its own, dropped after: a realistic run reads back as quantum.quantize_gpu of what
was written, a resent batch stores nothing, day sums equal an independent sum (intervals crossing
midnights included), old days go as whole partitions, two writers get one key per GPU, a run is
read through its key index. The codec's round trip of any row is checked without a database.
"""

from __future__ import annotations

import importlib.util
import math
import os
import re
import threading
import uuid
from collections.abc import Iterator
from datetime import date, timedelta
from fractions import Fraction
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuledger.series import quantum
from gpuledger.series.postgres import PostgresSeries, gpu_run_query, gpu_window_query, host_window_query, window_params
from gpuledger.series.postgres_codec import THROTTLE_REASONS, decode_gpu, encode_gpu, reserved_extra
from gpuledger.store.partitions import day_name

PG_URL = os.environ.get("GPULEDGER_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
DAY = 86400
T = 20_000 * DAY  # 2024-10-04 00:00 UTC, a midnight
ROOT = Path(__file__).resolve().parent.parent


def _connect() -> psycopg.Connection:
    return psycopg.connect(PG_URL, autocommit=True)


@pytest.fixture
def schema() -> Iterator[str]:
    if os.environ.get("GPULEDGER_TEST_PG") == "0":
        pytest.skip("PostgreSQL tests disabled by GPULEDGER_TEST_PG=0")
    name = f"series_t_{uuid.uuid4().hex[:12]}"
    yield name
    with _connect() as conn:
        conn.execute("SET lock_timeout = '30s'")
        conn.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")


@pytest.fixture
def store(schema: str) -> Iterator[PostgresSeries]:
    s = PostgresSeries(PG_URL, schema)
    s.create()
    yield s
    s.close()


def row(uuid_: str, seq: int, t0: float, dur: float = 5.0, **over: Any) -> dict[str, Any]:
    r: dict[str, Any] = {
        "device_uuid": uuid_, "seq": seq, "t0": t0, "t1": t0 + dur, "samples": 30, "busy_s": 2.125,
        "util_method": "samples", "util_max_pct": 97.0, "util_idle_s": 1.5, "util_unknown_s": 0.0,
        "util_unmeasured_s": 0.0, "energy_j": 1234.567, "energy_method": "counter", "power_max_w": 301.234,
        "mem_used_max_b": 40 << 30, "mem_used_last_b": 40 << 30, "mem_reserved_b": 553648128,
        "proc_mem_max_b": 39 << 30, "proc_sm_util_avg_pct": 88.5, "proc_method": "pid", "temp_max_c": 61.0,
        "sm_clock_avg_mhz": 1410.0, "mem_clock_max_mhz": 1593.0, "throttle_s": {"power": 0.25, "thermal": 0.0},
    }  # fmt: skip
    r.update(over)
    return r


def host_row(seq: int, t0: float, **over: Any) -> dict[str, Any]:
    r: dict[str, Any] = {
        "seq": seq, "t0": t0, "t1": t0 + 5.0, "samples": 5, "cpu_s": 9.8765, "rss_max_b": 3 << 30, "read_b": 10 * seq,
        "write_b": 7, "threads_max": 40, "procs_max": 5, "sys_cpu_util_avg_pct": 55.55, "iowait_s": None,
        "sys_mem_used_max_b": 100 << 30, "disk_read_b": None, "disk_write_b": 1, "net_rx_b": 2, "net_tx_b": None,
    }  # fmt: skip
    r.update(over)
    return r


def realistic_rows(gpus: int, hours: float) -> dict[str, list[dict[str, Any]]]:
    """Run id -> GPU rows from benchmarks/scale_storage.py's telemetry (the shipped GPU traces cut
    into jobs with idle gaps and sensor noise), as the ledger's rows."""
    spec = importlib.util.spec_from_file_location("scale_storage", ROOT / "benchmarks" / "scale_storage.py")
    assert spec and spec.loader
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    runs: dict[str, list[dict[str, Any]]] = {}
    for run_id, r in bench.ledger_rows(bench.intervals(gpus, hours, 5, seed=3)):
        runs.setdefault(run_id, []).append(r)
    return runs


def stored_rows(schema: str) -> int:
    with _connect() as conn:
        return int(conn.execute(f"SELECT count(*) FROM {schema}.gpu_iv").fetchone()[0])  # type: ignore[index]


@pytest.mark.postgres
def test_realistic_run_reads_back_as_quantized_input(store: PostgresSeries) -> None:
    runs = realistic_rows(gpus=3, hours=3)
    for run_id, rows in runs.items():
        for i in range(0, len(rows), 50):
            store.write(run_id, rows[i : i + 50], [], f"{run_id}:{i}")
    # The values a compact column cannot hold: memory not in whole MiB, a GDDR memory clock past
    # int2, a throttle reason nobody listed, another reserved size, unmeasured values, a midnight.
    odd = [
        row("GPU-odd", 0, T - 2.5, mem_used_max_b=(40 << 30) + 4097, mem_used_last_b=0, mem_clock_max_mhz=10501.0),
        row("GPU-odd", 1, T + 2.5, throttle_s={"power": 1.0, "new_reason": 0.5}, mem_reserved_b=1 << 29),
        row("GPU-odd", 2, T + 7.5, busy_s=None, util_method=None, energy_j=None, throttle_s=None, samples=40000),
        row("GPU-odd", 3, T + 12.5, temp_max_c=-3.5, sm_clock_avg_mhz=3500.25, proc_mem_max_b=None, throttle_s={}),
    ]
    hosts = [host_row(0, T - 2.5), host_row(1, T + 2.5, iowait_s=0.004, cpu_s=0.0)]
    assert store.write("run-odd", odd, hosts, "odd") == len(odd) + len(hosts)
    for run_id, rows in runs.items():
        assert store.gpu_intervals(run_id) == [quantum.quantize_gpu(r) for r in rows]
    assert store.gpu_intervals("run-odd") == [quantum.quantize_gpu(r) for r in odd]
    assert store.gpu_intervals("run-odd", "GPU-odd")[1]["throttle_s"] == {"power": 1.0, "new_reason": 0.5}
    assert store.gpu_intervals("run-odd", "GPU-other") == []
    assert store.host_intervals("run-odd") == [quantum.quantize_host(h) for h in hosts]
    assert store.gpu_intervals("no-such-run") == [] and store.host_intervals("no-such-run") == []


MEASURED = st.one_of(st.none(), st.floats(0, 5e6, allow_nan=False), st.integers(0, 5000).map(float))
MEM = st.one_of(st.none(), st.integers(0, 2**24).map(lambda m: m << 20), st.integers(0, 2**42))
METHOD = st.one_of(st.none(), st.sampled_from(["samples", "instant", "samples,instant", "counter", "pid", ""]))
THROTTLE = st.one_of(
    st.none(),
    st.dictionaries(st.sampled_from([*THROTTLE_REASONS, "new_reason", "x"]), st.floats(0, 5e6, allow_nan=False)),
)


@st.composite
def any_row(draw: st.DrawFn) -> dict[str, Any]:
    t0 = draw(st.floats(1.5e9, 2.5e9, allow_nan=False))
    return {
        "device_uuid": "GPU-h", "seq": draw(st.integers(0, 2**31 - 1)), "t0": t0,
        "t1": t0 + draw(st.floats(0, 2e6, allow_nan=False)), "samples": draw(st.integers(0, 10**6)),
        "busy_s": draw(MEASURED), "util_method": draw(METHOD), "util_max_pct": draw(MEASURED),
        "util_idle_s": draw(MEASURED), "util_unknown_s": draw(MEASURED), "util_unmeasured_s": draw(MEASURED),
        "energy_j": draw(MEASURED), "energy_method": draw(METHOD), "power_max_w": draw(MEASURED),
        "mem_used_max_b": draw(MEM), "mem_used_last_b": draw(MEM), "mem_reserved_b": draw(MEM),
        "proc_mem_max_b": draw(MEM), "proc_sm_util_avg_pct": draw(MEASURED), "proc_method": draw(METHOD),
        "temp_max_c": draw(st.one_of(MEASURED, st.floats(-60, 0))), "sm_clock_avg_mhz": draw(MEASURED),
        "mem_clock_max_mhz": draw(MEASURED), "throttle_s": draw(THROTTLE),
    }  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(any_row(), MEM)
def test_codec_round_trip_of_any_row(r: dict[str, Any], stream_reserved: int | None) -> None:
    """Without a database: every value survives its compact column, its default or ``extra``."""
    enc = encode_gpu(r)
    values = reserved_extra(enc, stream_reserved)
    assert decode_gpu(values, enc.shape, r["device_uuid"], stream_reserved) == quantum.quantize_gpu(r)


@pytest.mark.postgres
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(any_row(), min_size=1, max_size=6, unique_by=lambda r: r["seq"]))
def test_any_rows_read_back_through_the_database(store: PostgresSeries, rows: list[dict[str, Any]]) -> None:
    """The same through PostgreSQL (``extra`` as jsonb, the shapes table, NULL and empty throttles),
    read by another store, as another server process would, which knows no key or shape yet."""
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    assert store.write(run_id, rows, [], run_id) == len(rows)
    reader = PostgresSeries(PG_URL, store.schema)
    try:
        got = reader.gpu_intervals(run_id)
    finally:
        reader.close()
    assert got == sorted((quantum.quantize_gpu(r) for r in rows), key=lambda r: r["seq"])


@pytest.mark.postgres
def test_bad_rows_are_refused_whole(store: PostgresSeries, schema: str) -> None:
    good = [row("GPU-a", 0, T)]
    bad_rows = [
        ({k: v for k, v in row("GPU-a", 1, T + 5).items() if k != "energy_j"}, "missing \\['energy_j'\\]"),
        (row("GPU-a", 1, T + 5, busy_s=math.nan), "busy_s=nan: not a finite number"),
        (row("GPU-a", 1, T + 5, dur=-1.0), "t1 - t0 = -1000 ms"),
        (row("GPU-a", 1, T + 5, samples=None), "samples may not be None"),
    ]
    for bad, message in bad_rows:
        with pytest.raises(ValueError, match=message):
            store.write("run-bad", [*good, bad], [], f"bad:{message}")
    assert stored_rows(schema) == 0 and store.gpu_intervals("run-bad") == []


@pytest.mark.postgres
def test_rows_on_days_no_partition_can_name_are_refused_clearly_and_the_batch_kept(
    store: PostgresSeries, schema: str
) -> None:
    """A day partition is FOR VALUES FROM (day) TO (day + 1) in int2: the first day and the day
    before the last are stored; a row before or after them (the last int2 day too, whose upper bound
    overflows) is a ValueError naming the row and the days, before anything of its batch is stored;
    the same token then stores the batch without it."""
    first, last = date(1880, 4, 14), date(2059, 9, 17)
    fit = [_epoch(first) + 1.0, _epoch(last) + DAY - 10.0]
    refused = [_epoch(first) - 10.0, _epoch(last) + DAY, _epoch(date(2100, 1, 1))]
    for i, t0 in enumerate(fit + refused):
        for kind, what in (("gpu", "GPU interval GPU-a seq=1"), ("host", "host interval seq=1")):
            run_id, token = f"run-edge-{i}-{kind}", f"edge-{i}-{kind}"
            good = ([row("GPU-a", 0, T)], [host_row(0, T)])
            edge = ([row("GPU-a", 1, t0)], []) if kind == "gpu" else ([], [host_row(1, t0)])
            batch = ([*good[0], *edge[0]], [*good[1], *edge[1]])
            if t0 in fit:
                assert store.write(run_id, *batch, token) == 3
                read = store.gpu_intervals(run_id) if kind == "gpu" else store.host_intervals(run_id)
                assert [r["t0"] for r in read] == [T, t0]
                continue
            with pytest.raises(ValueError, match=f"{what}: t0 = .* outside the days a partition can name"):
                store.write(run_id, *batch, token)
            assert store.gpu_intervals(run_id) == [] and store.host_intervals(run_id) == []
            assert store.write(run_id, *good, token) == 2  # the token was not spent


def _epoch(day: date) -> float:
    return (day - date(1970, 1, 1)).days * DAY


@pytest.mark.postgres
def test_a_resent_batch_stores_nothing(store: PostgresSeries, schema: str) -> None:
    rows = [row(f"GPU-{d}", i, T + 5 * i) for d in range(2) for i in range(100)]
    hosts = [host_row(i, T + 5 * i) for i in range(100)]
    assert store.write("run-1", rows, hosts, "run-1:0-99") == 300
    assert store.write("run-1", rows, hosts, "run-1:0-99") == 0  # the same token
    assert store.write("run-1", rows, hosts, "retried under another token") == 0  # the same rows
    more = [row("GPU-0", i, T + 5 * i) for i in range(90, 110)]  # 10 old, 10 new
    assert store.write("run-1", more, [], "run-1:0-99") == 0  # a token seen: nothing, new rows or not
    assert store.write("run-1", more, [], "run-1:90-109") == 10
    assert stored_rows(schema) == 210
    assert len(store.host_intervals("run-1")) == 100
    got = store.gpu_intervals("run-1", "GPU-0")
    assert [r["seq"] for r in got] == list(range(110))
    # Another store (another server process) sees the token too.
    other = PostgresSeries(PG_URL, schema)
    try:
        assert other.write("run-1", rows, hosts, "run-1:0-99") == 0
    finally:
        other.close()


def _half_up(x: Fraction) -> int:
    return math.floor(x + Fraction(1, 2))


def _part(v: int, a0: int, dur: int, pa: int, pb: int) -> int:
    """The part of ``v`` in [pa, pb) of an interval starting at a0 and lasting dur (ms)."""
    if dur == 0:
        return v
    return _half_up(Fraction(v * (pb - a0), dur)) - _half_up(Fraction(v * (pa - a0), dur))


def expected_days(rows: list[dict[str, Any]], lo: int, hi: int) -> dict[tuple[str, int], dict[str, Any]]:
    """The day sums worked out here: each quantized interval cut at every midnight, a value's part
    up to x being round-half-up(v (x - t0) / dur) in its integer units, the count on the day the
    interval ends, a value None on a day no interval measured it."""
    out: dict[tuple[str, int], dict[str, Any]] = {}
    names = {"busy_s": "busy_s", "util_idle_s": "idle_s", "util_unknown_s": "unknown_s",
             "util_unmeasured_s": "unmeasured_s", "energy_j": "energy_j"}  # fmt: skip
    for r in rows:
        q = quantum.quantize_gpu(r)
        a0, a1 = round(q["t0"] * 1000), round(q["t1"] * 1000)
        dur = a1 - a0
        last = (a1 - 1) // (DAY * 1000) if dur else a0 // (DAY * 1000)
        for day in range(a0 // (DAY * 1000), last + 1):
            if not lo <= day <= hi:
                continue
            pa, pb = max(a0, day * DAY * 1000), min(a1, (day + 1) * DAY * 1000)
            span = (a0, dur, pa, pb)
            d = out.setdefault((r["device_uuid"], day), {"intervals": 0, "samples": 0, "allocated_ms": 0,
                                                         **{n: None for n in names.values()}})  # fmt: skip
            d["intervals"] += int(day == last)
            d["samples"] += _part(r["samples"], *span)
            d["allocated_ms"] += pb - pa
            for key, name in names.items():
                if q[key] is not None:
                    d[name] = (d[name] or 0) + _part(round(q[key] * 1000), *span)
    return out


@st.composite
def day_runs(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Two GPUs' intervals around a few midnights: most inside a day, some across one or several
    midnights, some of no length, some not measured."""
    rows = []
    for gpu in ("GPU-0", "GPU-1"):
        t = T - draw(st.integers(0, 2 * DAY))
        for seq in range(draw(st.integers(1, 25))):
            dur = draw(st.sampled_from([0.0, 5.0, 60.0, 3600.5, 40000.0, 2.5 * DAY]))
            busy = draw(st.one_of(st.none(), st.floats(0, 1e5, allow_nan=False)))
            energy = draw(st.one_of(st.none(), st.floats(0, 2e6, allow_nan=False)))
            rows.append(row(gpu, seq, t + draw(st.floats(0, 1, allow_nan=False)), dur, busy_s=busy,
                            energy_j=energy, samples=draw(st.integers(0, 70000)), util_unknown_s=0.125))  # fmt: skip
            t += dur + draw(st.sampled_from([0.0, 1.0, 7 * 3600.0]))
    return rows


@pytest.mark.postgres
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=day_runs(), window=st.tuples(st.integers(-3, 2), st.integers(1, 4)))
def test_day_sums_equal_an_independent_sum(store: PostgresSeries, rows: list[dict[str, Any]], window: Any) -> None:
    run_id = f"run-{uuid.uuid4().hex[:8]}"  # one schema for all examples: a run each
    assert store.write(run_id, rows, [], run_id) == len(rows)
    t_from = T + window[0] * DAY + 3600.0  # a window starting inside a day takes the whole day
    t_to = t_from + window[1] * DAY
    lo, hi = math.floor(t_from / DAY), math.ceil(t_to / DAY) - 1
    got = {
        (r.device_uuid, (r.day - date(1970, 1, 1)).days): r
        for r in store.day_rollups(t_from, t_to)
        if r.run_id == run_id
    }
    want = expected_days(rows, lo, hi)
    assert set(got) == set(want)
    for key, w in want.items():
        g = got[key]
        counts = (g.intervals, g.samples, round(g.allocated_s * 1000))
        assert counts == (w["intervals"], w["samples"], w["allocated_ms"])
        for name in ("busy_s", "idle_s", "unknown_s", "unmeasured_s", "energy_j"):
            v = getattr(g, name)
            assert (None if v is None else round(v * 1000)) == w[name], (key, name)


@pytest.mark.postgres
def test_day_sums_match_the_ledgers_float_split(store: PostgresSeries) -> None:
    """The ledger splits a crossing interval in float proportion (store/cost_queries.py); the
    integer parts here differ from it by less than a unit (1 ms, 1 mJ) per part."""
    rows = [row("GPU-0", 0, T - 1.25, busy_s=3.001, energy_j=77.777), row("GPU-0", 1, T + 3.75)]
    store.write("run-x", rows, [], "x")
    before, after = store.day_rollups(T - DAY, T + DAY)
    share = 1.25 / 5.0
    assert before.day == date(2024, 10, 3) and after.day == date(2024, 10, 4)
    assert (before.intervals, after.intervals) == (0, 2)  # the crossing one counts where it ends
    assert before.busy_s == pytest.approx(3.001 * share, abs=0.001)
    assert after.busy_s == pytest.approx(3.001 * (1 - share) + 2.125, abs=0.001)
    assert before.energy_j + after.energy_j == pytest.approx(77.777 + 1234.567, abs=1e-9)  # parts add up
    assert (before.allocated_s, after.allocated_s) == (1.25, 8.75)


def partitions(schema: str, table: str) -> list[str]:
    q = "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = to_regclass(%s)"
    with _connect() as conn:
        return sorted(n for (n,) in conn.execute(q, (f"{schema}.{table}",)))


@pytest.mark.postgres
def test_old_days_are_dropped_as_whole_partitions(store: PostgresSeries, schema: str) -> None:
    for k in range(4):  # a batch a day, 2024-10-04 .. 10-07
        rows = [row("GPU-0", k * 10 + i, T + k * DAY + 60 * i) for i in range(10)]
        store.write("run-1", rows, [host_row(k, T + k * DAY)], f"day{k}")
    assert "gpu_iv_p20241004" in partitions(schema, "gpu_iv")
    assert store.drop_days_before(date(2024, 10, 6)) == 2
    for table in ("gpu_iv", "host_iv"):
        names = partitions(schema, table)
        assert f"{table}_p20241004" not in names and f"{table}_p20241005" not in names
        assert f"{table}_p20241006" in names and f"{table}_p20241007" in names
    assert [r["seq"] for r in store.gpu_intervals("run-1")] == list(range(20, 40))
    assert [r["seq"] for r in store.host_intervals("run-1")] == [2, 3]
    # A late resend of a dropped day does not bring it back.
    late = [row("GPU-0", i, T + 60 * i) for i in range(10)]
    assert store.write("run-1", late, [], "day0-resent") == 0
    assert "gpu_iv_p20241004" not in partitions(schema, "gpu_iv")
    assert store.drop_days_before(date(2024, 10, 6)) == 0


@pytest.mark.postgres
def test_two_writers_allocating_at_once_get_one_key_per_gpu(schema: str) -> None:
    stores = [PostgresSeries(PG_URL, schema) for _ in range(2)]
    stores[0].create()
    uuids = [f"GPU-{i:04d}" for i in range(300)]
    got: list[dict[str, int]] = []
    barrier = threading.Barrier(2)

    def allocate(s: PostgresSeries, order: list[str]) -> None:
        barrier.wait()
        keys = {}
        for i in range(0, len(order), 10):  # many small allocations, so the two interleave
            keys.update(s.keys.gpu_keys(order[i : i + 10]))
        got.append(keys)

    threads = [
        threading.Thread(target=allocate, args=(s, o)) for s, o in zip(stores, (uuids, uuids[::-1]), strict=True)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    try:
        assert len(got) == 2 and got[0] == got[1]
        assert len(set(got[0].values())) == len(uuids)
        with _connect() as conn:
            keys = conn.execute(f"SELECT count(*), count(DISTINCT uuid) FROM {schema}.gpu_keys").fetchone()
            assert keys == (300, 300)
        # Whole writes of one run from both at once: one run key, one stream per GPU, nothing doubled.
        rows = [row(u, i, T + 5 * i) for u in uuids[:4] for i in range(20)]
        done: list[int] = []
        barrier.reset()

        def write(s: PostgresSeries, token: str) -> None:
            barrier.wait()
            done.append(s.write("run-both", rows, [], token))

        threads = [threading.Thread(target=write, args=(s, f"t{i}")) for i, s in enumerate(stores)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert sorted(done) == [0, 80]
        with _connect() as conn:
            assert conn.execute(f"SELECT count(*) FROM {schema}.run_keys").fetchone() == (1,)
            assert conn.execute(f"SELECT count(*) FROM {schema}.streams").fetchone() == (4,)
        assert len(stores[1].gpu_intervals("run-both")) == 80
    finally:
        for s in stores:
            s.close()


@pytest.mark.postgres
def test_a_run_is_read_through_its_key_index(store: PostgresSeries, schema: str) -> None:
    for r in range(40):
        rows = [row(f"GPU-{r % 8}", i, T + 5 * i) for i in range(250)]
        store.write(f"run-{r}", rows, [host_row(i, T + 5 * i) for i in range(50)], f"run-{r}")
    store.maintain(now=T + 3 * DAY)  # the day ended: its key index is rebuilt full
    with _connect() as conn:
        conn.execute(f"ANALYZE {schema}.gpu_iv")
        conn.execute(f"ANALYZE {schema}.host_iv")
        streams = [k for (k,) in conn.execute(f"SELECT key FROM {schema}.streams WHERE run = 7")]
        plan = "\n".join(p for (p,) in conn.execute("EXPLAIN " + gpu_run_query(schema), (streams,)))
        host_plan = "\n".join(p for (p,) in conn.execute(f"EXPLAIN SELECT * FROM {schema}.host_iv WHERE run = 7"))
    # The day with rows is read through its key (empty days may be planned as a scan of nothing).
    assert "Seq Scan on gpu_iv_p20241004" not in plan and "gpu_iv_p20241004_key" in plan, plan
    assert "Seq Scan on host_iv_p20241004" not in host_plan and "host_iv_p20241004_key" in host_plan, host_plan
    assert len(store.gpu_intervals("run-7")) == 250


@pytest.mark.postgres
def test_a_closed_days_index_is_rebuilt_full_once(store: PostgresSeries, schema: str) -> None:
    for w in range(30):  # 20 streams appending in turn, as many agents' pushes do
        for r in range(20):
            rows = [row("GPU-0", w * 12 + i, T + 60 * (w * 12 + i)) for i in range(12)]
            store.write(f"run-{r}", rows, [], f"run-{r}:{w}")
    index = f"{schema}.gpu_iv_p20241004_key"

    def index_bytes() -> int:
        with _connect() as conn:
            return int(conn.execute("SELECT pg_relation_size(%s)", (index,)).fetchone()[0])  # type: ignore[index]

    before = index_bytes()
    assert "gpu_iv_p20241004_key" not in store.maintain(now=T + DAY - 1)  # the day is still being written
    assert "gpu_iv_p20241004_key" in store.maintain(now=T + DAY + 3600)  # it ended an hour ago
    assert "gpu_iv_p20241004_key" not in store.maintain(now=T + DAY + 7200)  # once
    assert index_bytes() < 0.8 * before
    assert len(store.gpu_intervals("run-3")) == 360
    assert store.write("run-late", [row("GPU-9", 0, T + 10)], [], "late") == 1  # a late row still lands


def test_schema_names_are_checked() -> None:
    with pytest.raises(ValueError, match="series schema"):
        PostgresSeries(PG_URL, "series; DROP TABLE x")
    with pytest.raises(ValueError, match="expected postgresql://"):
        PostgresSeries("sqlite:///x.db")


def test_window_of_days() -> None:
    from gpuledger.series.postgres_days import day_range

    assert day_range(T, T + DAY) == (T // DAY, T // DAY)
    assert day_range(T + 1, T + DAY + 1) == (T // DAY, T // DAY + 1)
    assert day_range(T, T) is None
    assert date(1970, 1, 1) + timedelta(days=T // DAY) == date(2024, 10, 4)


@st.composite
def window_run(draw: st.DrawFn) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[tuple[float, float]]]:
    """Rows of two GPUs and the host over a few days, some lasting days (crossing midnights), some
    of no length, some on a midnight; and windows [t_from, t_to) over and around them."""
    grid = st.integers(-2 * DAY * 1000, 6 * DAY * 1000).map(lambda ms: T + ms / 1000)
    dur = st.one_of(st.sampled_from([0.0, 5.0, DAY, 3.5 * DAY]), st.floats(0, 24.8 * DAY, allow_nan=False))
    starts = st.one_of(grid, st.sampled_from([T, T + DAY, T + DAY - 0.001]))
    gpu, host = [], []
    for i, (t0, d) in enumerate(draw(st.lists(st.tuples(starts, dur), min_size=1, max_size=12))):
        gpu.append(row(f"GPU-{i % 2}", i, t0, d))
        host.append(host_row(i, t0, t1=t0 + d))
    windows = draw(st.lists(st.tuples(grid, st.floats(0, 4 * DAY, allow_nan=False)), min_size=1, max_size=4))
    return gpu, host, [(a, a + w) for a, w in windows]


@pytest.mark.postgres
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(window_run())
def test_a_time_window_reads_the_rows_a_filter_of_the_whole_run_gives(
    store: PostgresSeries, drawn: tuple[list[dict[str, Any]], list[dict[str, Any]], list[tuple[float, float]]]
) -> None:
    """``gpu_intervals_between`` / ``host_intervals_between``: the rows with t1 > t_from and t0 < t_to,
    those of earlier days reaching into the window too (up to the longest interval the store keeps)."""
    gpu, host, windows = drawn
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    store.write(run_id, gpu, host, run_id)
    whole_gpu, whole_host = store.gpu_intervals(run_id), store.host_intervals(run_id)
    assert len(whole_gpu) == len(whole_host) == len(gpu)
    for t_from, t_to in windows:
        assert store.gpu_intervals_between(run_id, t_from, t_to) == _inside(whole_gpu, t_from, t_to)
        assert store.host_intervals_between(run_id, t_from, t_to) == _inside(whole_host, t_from, t_to)
    assert store.gpu_intervals_between("no-such-run", T, T + DAY) == []
    assert store.host_intervals_between("no-such-run", T, T + DAY) == []


def _inside(rows: list[dict[str, Any]], t_from: float, t_to: float) -> list[dict[str, Any]]:
    return [r for r in rows if r["t1"] > t_from and r["t0"] < t_to]


@pytest.mark.postgres
def test_a_time_window_scans_only_its_days_and_the_odd_rows_before(store: PostgresSeries, schema: str) -> None:
    """The plan of a window read: the window's day partitions, and the days before it only through
    their partial index of odd rows (those crossing a midnight); no day after it."""
    store.write("run-w", [row("GPU-a", i, T + i * DAY / 4) for i in range(40)], [], "w")  # 10 days
    store.write("run-w", [], [host_row(i, T + i * DAY / 4) for i in range(40)], "w-host")
    lo = T + 5 * DAY + 100
    assert [r["seq"] for r in store.gpu_intervals_between("run-w", lo, lo + DAY / 4)] == [21]
    assert [r["seq"] for r in store.host_intervals_between("run-w", lo, lo + DAY / 4)] == [21]
    day = int(lo // DAY)
    run = store.keys.run_key("run-w", create=False)
    stream = store.keys.run_streams(run)[0][0]  # type: ignore[arg-type]
    own, before = window_params(lo, lo + DAY / 4)
    for table, q, key in (("gpu_iv", gpu_window_query(schema), [stream]), ("host_iv", host_window_query(schema), run)):
        with _connect() as conn:
            plan = [r[0] for r in conn.execute(f"EXPLAIN {q}", [key, *own, key, *before])]
        scans = [line for line in plan if f"{table}_p" in line]
        assert {m for line in scans for m in re.findall(rf"{table}_p\d+", line)} == {
            day_name(table, d) for d in range(day - 5, day + 1)
        }, plan  # the 5 earlier days and the window's, not the 4 after
        earlier = [line for line in scans if day_name(table, day) not in line]
        assert not any("Seq Scan" in line for line in earlier), plan  # by index, on tables of 4 rows too
        assert all("_odd" in line for line in earlier if "Index" in line), plan
        assert len([line for line in earlier if "Index" in line]) == 5, plan
