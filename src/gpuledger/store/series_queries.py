"""Bucketed interval series computed in SQL (read-only): the fast path for big runs' reports.

Same buckets as ``core/metering/series.py`` (the reference): per device and bucket number, sums,
maxima, time-weighted means and per-interval minima/maxima. Reading 2 million intervals into
Python objects takes many seconds; letting the database aggregate them takes about one. On SQLite
each stream's buckets are summed seq range by seq range in index order (store/series_ranges.py:
a GROUP BY would sort every row first); PostgreSQL, and a SQLite stream out of time order, use
one GROUP BY per stream.
Each aggregate costs 30-60 ns per row, so only the fields the report uses are computed; the
rest of ``merged`` stays None / 0 (GPU: samples, last values, memory clock, per-process SM share;
host: samples, threads). Methods come from each device's first and last interval, and throttle
reasons other than ``core.metering.series.THROTTLE_REASONS`` are not summed. The tests check the computed
fields against the pure reference. Each GPU bucket carries its intervals' unmeasured time (each
interval's stored figure, or for rows stored before it the per-interval rule of
``core.metering.busy.unmeasured_seconds``: ``store.queries.unmeasured_sql``), so a big run's report
tells unmeasured time from idle time as ``gpuledger show`` does.

A run with raw days tiered into the ledger's series store (``Ledger.tiered``: PostgreSQL dropped
them, store/series_tier.py) is read whole through ``Ledger.gpu_intervals``/``host_intervals`` and
bucketed by the pure reference instead: SQL would miss those days. Other runs keep the SQL path.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gpuledger.core.metering.intervals import merge_methods
from gpuledger.core.metering.series import THROTTLE_REASONS, GpuBucket, HostBucket, Plan, bucket_gpu, bucket_host
from gpuledger.core.model import GpuInterval, HostInterval
from gpuledger.store import cost_queries, series_ranges
from gpuledger.store.cost_queries import StreamDays
from gpuledger.store.queries import unmeasured_sql
from gpuledger.store.schema import devices, gpu_intervals, host_intervals

if TYPE_CHECKING:
    from gpuledger.store import Ledger

__all__ = ["bucketed_gpu", "bucketed_host", "counts_of", "stream_counts"]


def counts_of(gpu: Sequence[GpuInterval], host: Sequence[HostInterval]) -> dict[str, Any]:
    """``stream_counts`` of intervals already read (a run with tiered days): each stream's count,
    and the span from each stream's first and last interval by seq."""
    streams: dict[str | None, list[Any]] = {}
    for iv in gpu:
        streams.setdefault(iv.device_uuid, []).append(iv)
    if host:
        streams[None] = list(host)
    starts = [min(ivs, key=lambda i: i.seq).t0 for ivs in streams.values()]
    ends = [max(ivs, key=lambda i: i.seq).t1 for ivs in streams.values()]
    return {
        "gpu": {uuid: len(ivs) for uuid, ivs in streams.items() if uuid is not None},
        "host": len(streams.get(None, [])),
        "t0": min(starts) if starts else None,
        "t1": max(ends) if ends else None,
    }


def stream_counts(ledger: Ledger, run_id: str) -> dict[str, Any]:
    """``gpu``: intervals per device uuid; ``host``: host intervals; ``t0``/``t1``: the span measured.

    From each stream's first and last seq (index lookups), not a count of its rows: seq numbers
    are consecutive per stream, and counting 2 million index entries costs a third of a second.
    A run with tiered days is counted from its intervals read whole (``counts_of``)."""
    if ledger.tiered(run_id):
        return counts_of(ledger.gpu_intervals(run_id), ledger.host_intervals(run_id))

    def tx(conn: Connection) -> dict[str, Any]:
        g, h, d = gpu_intervals.c, host_intervals.c, devices.c
        # The recorder lists a run's devices before it writes their intervals; a run without a
        # device list (an odd import) has its streams found the slow way.
        known = list(conn.scalars(sa.select(d.uuid).where(d.run_id == run_id)))
        if not known:
            known = list(conn.scalars(sa.select(g.device_uuid).where(g.run_id == run_id).distinct()))
        streams: list[tuple[str | None, Any, tuple[Any, ...]]] = [
            (uuid, gpu_intervals, (g.run_id == run_id, g.device_uuid == uuid)) for uuid in known
        ]
        streams.append((None, host_intervals, (h.run_id == run_id,)))
        counts: dict[str | None, int] = {}
        starts, ends = [], []
        for name, table, where in streams:
            c = table.c
            # Two queries: SQLite answers a lone min() or max() from the index, not both at once.
            lo = conn.scalar(sa.select(sa.func.min(c.seq)).where(*where))
            hi = conn.scalar(sa.select(sa.func.max(c.seq)).where(*where))
            if lo is None:
                continue
            counts[name] = hi - lo + 1
            starts.append(conn.scalar(sa.select(c.t0).where(*where, c.seq == lo)))
            ends.append(conn.scalar(sa.select(c.t1).where(*where, c.seq == hi)))
        return {
            "gpu": {uuid: n for uuid, n in counts.items() if uuid is not None},
            "host": counts.get(None, 0),
            "t0": min(starts) if starts else None,
            "t1": max(ends) if ends else None,
        }

    return ledger.read(tx)


def _key(dialect: str, col_t0: Any, seq: Any, plan: Plan) -> Any:
    if plan.width_s is None:
        return seq
    scaled = (col_t0 - sa.literal(plan.origin, sa.Double)) / sa.literal(plan.width_s, sa.Double)
    if dialect == "postgresql":
        return sa.cast(sa.func.floor(scaled), sa.BigInteger)
    return sa.cast(scaled, sa.Integer)  # SQLite truncates; t0 >= origin, so this is floor


def _per_interval(dialect: str, value: Any, span: Any) -> Any:
    if dialect == "sqlite":
        return value / span  # SQLite divides by zero into NULL: no CASE to evaluate per row
    return sa.case((span > 0, value / span))


def _wmean(value: Any, span: Any) -> Any:
    """Time-weighted mean over the intervals that have the value; plain mean when all spans are 0."""
    weight = sa.func.sum(sa.case((value.is_not(None), span)))
    return sa.func.coalesce(sa.func.sum(value * span) / sa.func.nullif(weight, 0), sa.func.avg(value))


def _sum_int(col: Any) -> Any:
    return sa.cast(sa.func.sum(col), sa.BigInteger)  # PostgreSQL sums bigint into numeric


def bucketed_gpu(
    ledger: Ledger,
    run_id: str,
    plan: Plan,
    devices: list[str] | None = None,
    threads: int = 2,
    days: StreamDays | None = None,
) -> dict[str, list[GpuBucket]]:
    """Per device uuid, the buckets of ``plan`` in time order (see core.metering.series.bucket_gpu).

    Each device apart (seq ranges, or a GROUP BY: several small sorts are cheaper than one big
    one); ``threads`` of them run at once (sqlite3 releases the GIL). ``days``: filled with the
    day sums for pricing of each stream summed by seq ranges (see ``_device_by_ranges``).
    """
    if ledger.tiered(run_id):  # read whole from the ledger and its series store; no day sums
        found = bucket_gpu(ledger.gpu_intervals(run_id), plan)
        return {uuid: b for uuid, b in found.items() if devices is None or uuid in devices}
    if devices is None:
        devices = sorted(stream_counts(ledger, run_id)["gpu"])
    if not devices:
        return {}
    with ThreadPoolExecutor(max_workers=max(1, min(threads, len(devices)))) as pool:
        parts = list(pool.map(lambda uuid: _bucketed_device(ledger, run_id, uuid, plan, days), devices))
    return {uuid: buckets for uuid, buckets in zip(devices, parts, strict=True) if buckets}


def _gpu_aggregates(dialect: str) -> list[Any]:
    """The per-bucket figures of a GPU stream, in this order (the GROUP BY and the seq ranges share them).

    Every aggregate costs ~30-60 ns per row (2 million rows in a big run): only what the report
    uses. Bucket edges come from the plan; the clock mean is per interval (intervals are regular)."""
    g = gpu_intervals.c
    span = g.t1 - g.t0
    util = _per_interval(dialect, g.busy_s, span)
    if dialect == "sqlite":  # the JSON text as stored; no CAST and no CASE per row
        throttled = sa.func.count(sa.func.nullif(sa.type_coerce(g.throttle_s, sa.Text), "{}"))
    else:
        throttled = sa.func.count(sa.case((sa.cast(g.throttle_s, sa.Text) != "{}", 1)))
    return [
        sa.func.count().label("n"),
        sa.func.sum(span).label("covered"),
        sa.func.sum(g.busy_s).label("busy_s"),
        sa.func.min(util).label("util_min"),
        sa.func.max(util).label("util_max"),
        sa.func.max(g.util_max_pct).label("util_max_pct"),
        sa.func.sum(g.energy_j).label("energy_j"),
        sa.func.max(g.power_max_w).label("power_max_w"),
        sa.func.max(g.mem_used_max_b).label("mem_max"),
        sa.func.min(g.mem_used_max_b).label("mem_min"),
        sa.func.max(g.proc_mem_max_b).label("proc_max"),
        sa.func.max(g.temp_max_c).label("temp_max"),
        sa.func.avg(g.sm_clock_avg_mhz).label("clock_avg"),
        sa.func.min(g.sm_clock_avg_mhz).label("clock_min"),
        throttled.label("throttled"),
        sa.func.sum(unmeasured_sql(g)).label("unmeasured"),
    ]


def _throttle_sums() -> list[Any]:
    g = gpu_intervals.c
    return [sa.func.sum(g.throttle_s[r].as_float()).label(r) for r in THROTTLE_REASONS]


def _throttled_rows() -> list[Any]:
    g = gpu_intervals.c
    return [g.throttle_s.is_not(None), sa.cast(g.throttle_s, sa.Text) != "{}"]


def _bucketed_device(
    ledger: Ledger, run_id: str, uuid: str, plan: Plan, days: StreamDays | None = None
) -> list[GpuBucket]:
    def tx(conn: Connection) -> tuple[list[Any], dict[int, dict[str, float]], dict[str, Any]]:
        found = None
        if ledger.dialect == "sqlite":
            found = _device_by_ranges(conn, run_id, uuid, plan, days)
        if found is None:
            found = _device_grouped(conn, ledger.dialect, run_id, uuid, plan)
        return *found, _ends(conn, run_id, uuid)

    rows, throttled, ends = ledger.read(tx)
    out: list[GpuBucket] = []
    for r in rows:
        k = int(r["key"])
        t0, t1 = _edges(plan, k, ends)
        merged = GpuInterval(
            util_unmeasured_s=float(r["unmeasured"] or 0.0),
            device_uuid=uuid,
            seq=k,
            t0=t0,
            t1=t1,
            busy_s=r["busy_s"],
            util_method=ends["util"],
            util_max_pct=r["util_max_pct"],
            energy_j=r["energy_j"],
            energy_method=ends["energy"],
            power_max_w=r["power_max_w"],
            mem_used_max_b=_int(r["mem_max"]),
            proc_mem_max_b=_int(r["proc_max"]),
            temp_max_c=r["temp_max"],
            sm_clock_avg_mhz=r["clock_avg"],
            throttle_s=throttled.get(k, {}) if ends["throttle_known"] or k in throttled else None,
        )
        out.append(
            GpuBucket(
                key=k,
                merged=merged,
                n=int(r["n"]),
                covered_s=float(r["covered"] or 0.0),
                util_min=_clip(r["util_min"]),
                util_max=_clip(r["util_max"]),
                mem_min_b=_int(r["mem_min"]),
                sm_clock_min_mhz=r["clock_min"],
                throttled=int(r["throttled"] or 0),
            )
        )
    out.sort(key=lambda b: b.key)
    return out


def _device_grouped(
    conn: Connection, dialect: str, run_id: str, uuid: str, plan: Plan
) -> tuple[list[Any], dict[int, dict[str, float]]]:
    """One GROUP BY on the bucket of t0 (PostgreSQL, and SQLite streams out of time order)."""
    g = gpu_intervals.c
    key = _key(dialect, g.t0, g.seq, plan).label("key")
    mine = (g.run_id == run_id, g.device_uuid == uuid)
    rows = list(conn.execute(sa.select(key, *_gpu_aggregates(dialect)).where(*mine).group_by(key)).mappings())
    throttled: dict[int, dict[str, float]] = {}
    if any(r["throttled"] for r in rows):
        tq = sa.select(key, *_throttle_sums()).where(*mine, *_throttled_rows()).group_by(key)
        for r in conn.execute(tq).mappings():
            throttled[int(r["key"])] = {k: float(r[k]) for k in THROTTLE_REASONS if r[k] is not None}
    return rows, throttled


def _device_by_ranges(
    conn: Connection, run_id: str, uuid: str, plan: Plan, days: StreamDays | None = None
) -> tuple[list[Any], dict[int, dict[str, float]]] | None:
    """The buckets of one SQLite stream summed seq range by seq range (store/series_ranges.py),
    without the GROUP BY's sort of every row; None when the stream is not in time order.
    ``days``: also the stream's day sums for pricing (cost_queries.stream_day_sums), from the same
    pass: three more aggregates per row instead of the pricing's own read of every interval."""
    g = gpu_intervals.c
    if plan.width_s is None:
        return None
    mine = (g.run_id == _PARAM, g.device_uuid == _PARAM)  # positional: run, uuid, then as each query says
    aggs = _gpu_aggregates("sqlite")
    names = [c.name for c in aggs]
    extra = [sa.func.count(g.busy_s), sa.func.count(g.energy_j), sa.func.max(g.t1)] if days is not None else []
    walk_q = sa.select(sa.func.count(), sa.func.max(g.seq), sa.func.min(g.t0), *extra, *aggs).where(
        *mine, g.seq >= _PARAM, g.seq < _PARAM, g.t0 < _PARAM
    )
    seqs = (g.seq >= _PARAM, g.seq <= _PARAM)
    range_q = sa.select(*_throttle_sums()).where(*mine, *seqs, *_throttled_rows())
    cur = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
    params = (run_id, uuid)
    try:
        where = "run_id = ? AND device_uuid = ?"
        found = series_ranges.stream(cur, _sqlite(walk_q), "gpu_intervals", where, params, plan)
        if found is None:
            return None
        rows, throttled = [], {}
        throttle_sql = _sqlite(range_q)
        for k, a, row in found:
            r = dict(zip(names, row[3 + len(extra) :], strict=True), key=k)
            rows.append(r)
            if r["throttled"]:
                sums = cur.execute(throttle_sql, (*params, a, row[1])).fetchone()
                throttled[k] = {name: float(v) for name, v in zip(THROTTLE_REASONS, sums, strict=True) if v is not None}
        if days is not None:
            buckets = series_ranges.Buckets(plan.origin, plan.width_s)
            read_q = sa.select(g.t0, g.t1, g.busy_s, g.energy_j).where(*mine, *seqs).order_by(g.seq)
            read_sql = _sqlite(read_q)

            def rows_of(a: int, last: int) -> list[tuple[Any, ...]]:
                return cur.execute(read_sql, (*params, a, last)).fetchall()

            ranges = [
                (a, row[1], row[2], buckets.edge(k + 1), row[5], r["busy_s"], row[3], r["energy_j"], row[4], row[0])
                for (k, a, row), r in zip(found, rows, strict=True)
            ]
            days[(run_id, uuid)] = cost_queries.stream_day_sums(run_id, uuid, ranges, rows_of)
        return rows, throttled
    finally:
        cur.close()


_PARAM = sa.literal_column("?")  # a driver parameter in _sqlite's text, bound by position


def _sqlite(q: sa.Select[Any]) -> str:
    """``q`` as SQLite text, its constants inline and ``?`` parameters left for the driver."""
    from sqlalchemy.dialects import sqlite

    return str(q.compile(dialect=sqlite.dialect(), compile_kwargs={"literal_binds": True}))


def _ends(conn: Connection, run_id: str, uuid: str) -> dict[str, Any]:
    """What the device's first and last interval tell (two index lookups, where a scan of every row
    would cost as much as the whole bucketing): the time span, the measuring methods (a collector
    falls back from "samples" to "instant" for good, so a change shows at the ends; both are then
    named) and whether throttling is measured at all."""
    g = gpu_intervals.c
    where = (g.run_id == run_id, g.device_uuid == uuid)
    first = sa.select(sa.func.min(g.seq)).where(*where).scalar_subquery()
    last = sa.select(sa.func.max(g.seq)).where(*where).scalar_subquery()
    rows = conn.execute(
        sa.select(g.t0, g.t1, g.util_method, g.energy_method, g.throttle_s).where(*where, g.seq.in_([first, last]))
    ).all()
    return {
        "t0": min((r[0] for r in rows), default=None),
        "t1": max((r[1] for r in rows), default=None),
        "util": merge_methods(r[2] for r in rows),
        "energy": merge_methods(r[3] for r in rows),
        "throttle_known": any(r[4] is not None for r in rows),
    }


def _edges(plan: Plan, key: int, ends: dict[str, Any]) -> tuple[float, float]:
    """A bucket's span: its edges on the plan, clipped to the stream's first and last interval."""
    assert plan.width_s is not None
    t0 = plan.origin + key * plan.width_s
    t1 = t0 + plan.width_s
    if ends["t0"] is not None:
        t0 = max(t0, ends["t0"])
    if ends["t1"] is not None:
        t1 = min(t1, ends["t1"])
    return t0, max(t0, t1)


def _host_aggregates(dialect: str) -> list[Any]:
    h = host_intervals.c
    span = h.t1 - h.t0
    rate = _per_interval(dialect, h.cpu_s, span)
    return [
        sa.func.count().label("n"),
        sa.func.min(h.t0).label("t0"),
        sa.func.max(h.t1).label("t1"),
        sa.func.sum(span).label("covered"),
        sa.func.sum(h.cpu_s).label("cpu_s"),
        sa.func.min(rate).label("rate_min"),
        sa.func.max(rate).label("rate_max"),
        sa.func.max(h.rss_max_b).label("rss_max"),
        sa.func.min(h.rss_max_b).label("rss_min"),
        _sum_int(h.read_b).label("read_b"),
        _sum_int(h.write_b).label("write_b"),
        sa.func.max(h.procs_max).label("procs_max"),
        _wmean(h.sys_cpu_util_avg_pct, span).label("sys_cpu"),
        sa.func.sum(h.iowait_s).label("iowait_s"),
        sa.func.max(h.sys_mem_used_max_b).label("sys_mem"),
        _sum_int(h.disk_read_b).label("disk_read_b"),
        _sum_int(h.disk_write_b).label("disk_write_b"),
        _sum_int(h.net_rx_b).label("net_rx_b"),
        _sum_int(h.net_tx_b).label("net_tx_b"),
    ]


def _host_by_ranges(conn: Connection, run_id: str, plan: Plan) -> list[dict[str, Any]] | None:
    """The host stream's buckets seq range by seq range (as ``_device_by_ranges``), or None."""
    h = host_intervals.c
    aggs = _host_aggregates("sqlite")
    names = [c.name for c in aggs]
    q = sa.select(sa.func.count(), sa.func.max(h.seq), sa.func.min(h.t0), *aggs).where(
        h.run_id == _PARAM, h.seq >= _PARAM, h.seq < _PARAM, h.t0 < _PARAM
    )
    cur = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
    try:
        found = series_ranges.stream(cur, _sqlite(q), "host_intervals", "run_id = ?", (run_id,), plan)
    finally:
        cur.close()
    if found is None:
        return None
    return [dict(zip(names, row[3:], strict=True), key=k) for k, _, row in found]


def bucketed_host(ledger: Ledger, run_id: str, plan: Plan) -> list[HostBucket]:
    if ledger.tiered(run_id):  # read whole from the ledger and its series store
        return bucket_host(ledger.host_intervals(run_id), plan)

    def tx(conn: Connection) -> list[Any]:
        found = _host_by_ranges(conn, run_id, plan) if ledger.dialect == "sqlite" else None
        if found is not None:
            return found
        key = _key(ledger.dialect, host_intervals.c.t0, host_intervals.c.seq, plan).label("key")
        q = sa.select(key, *_host_aggregates(ledger.dialect)).where(host_intervals.c.run_id == run_id)
        return list(conn.execute(q.group_by(key).order_by(key)).mappings())

    rows = ledger.read(tx)
    out = []
    for r in rows:
        merged = HostInterval(
            seq=int(r["key"]),
            t0=r["t0"],
            t1=r["t1"],
            cpu_s=float(r["cpu_s"] or 0.0),
            rss_max_b=int(r["rss_max"] or 0),
            read_b=int(r["read_b"] or 0),
            write_b=int(r["write_b"] or 0),
            procs_max=int(r["procs_max"] or 0),
            sys_cpu_util_avg_pct=r["sys_cpu"],
            iowait_s=r["iowait_s"],
            sys_mem_used_max_b=_int(r["sys_mem"]),
            disk_read_b=_int(r["disk_read_b"]),
            disk_write_b=_int(r["disk_write_b"]),
            net_rx_b=_int(r["net_rx_b"]),
            net_tx_b=_int(r["net_tx_b"]),
        )
        out.append(
            HostBucket(
                key=int(r["key"]),
                merged=merged,
                n=int(r["n"]),
                covered_s=float(r["covered"] or 0.0),
                cpu_rate_min=r["rate_min"],
                cpu_rate_max=r["rate_max"],
                rss_min_b=_int(r["rss_min"]),
            )
        )
    return out


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def _clip(value: float | None) -> float | None:
    return None if value is None else min(1.0, max(0.0, float(value)))


def latest(ledger: Ledger, run_id: str, last: int = 3) -> dict[str, Any]:
    """The last ``last`` GPU intervals per device and the last host intervals of a run (for a live
    view): index lookups from each stream's highest seq, never a scan of the run."""

    def tx(conn: Connection) -> dict[str, Any]:
        from gpuledger.store import codec

        g, h = gpu_intervals.c, host_intervals.c
        out: dict[str, Any] = {"gpu": {}, "host": []}
        d = devices.c
        uuids = list(conn.scalars(sa.select(d.uuid).where(d.run_id == run_id)))
        tops = [
            (u, conn.scalar(sa.select(sa.func.max(g.seq)).where(g.run_id == run_id, g.device_uuid == u))) for u in uuids
        ]
        for uuid, top in tops:
            if top is None:
                continue
            q = sa.select(gpu_intervals).where(g.run_id == run_id, g.device_uuid == uuid, g.seq > top - last)
            out["gpu"][uuid] = [codec.gpu_from_row(r) for r in conn.execute(q.order_by(g.seq)).mappings()]
        top = conn.scalar(sa.select(sa.func.max(h.seq)).where(h.run_id == run_id))
        if top is not None:
            q = sa.select(host_intervals).where(h.run_id == run_id, h.seq > top - last).order_by(h.seq)
            out["host"] = [codec.host_from_row(r) for r in conn.execute(q).mappings()]
        return out

    return ledger.read(tx)
