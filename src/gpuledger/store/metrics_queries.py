"""Read queries behind the server's Prometheus ``/metrics`` (SQLAlchemy Core, SQLite and PostgreSQL).

Per scrape: the runs still recording plus those ended in a recent window (newest first, capped),
their devices, and the intervals each (run, device) gained since the previous scrape: primary-key
range reads, so a scrape's cost follows what was recorded since the last one, not the length of
the runs. A run new to the reader is summed once in SQL (whole_gpu_sums, whole_host_sums), with,
where the server reads a series store, its raw days tiered into it and dropped from the ledger
added from the audit trail's sums (store/tiered_totals.py; the store is not read).
``scope`` is the set of projects the reader may see (None: all), in the WHERE clause.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gpuledger.store import series_streams
from gpuledger.store.queries import open_run
from gpuledger.store.schema import devices, gpu_intervals, host_intervals, runs, series_day_sums, series_segments
from gpuledger.store.schema_series_streams import GAUGES

Scope = frozenset[str] | None
_CHUNK = 500  # run ids per IN (...) list


def _chunks(items: Sequence[str]) -> Iterable[Sequence[str]]:
    for i in range(0, len(items), _CHUNK):
        yield items[i : i + _CHUNK]


def live_runs(conn: Connection, *, ended_since: float, limit: int, scope: Scope) -> list[dict[str, Any]]:
    """Runs recording now, or ended at or after ``ended_since``; newest first, at most ``limit``."""
    r = runs.c
    q = (
        sa.select(r.id, r.name, r.status, r.user, r.project, r.team, r.started_at, r.ended_at, r.replayed)
        .where(sa.or_(open_run(r), r.ended_at >= ended_since))
        .order_by(r.started_at.desc(), r.id)
        .limit(limit)
    )
    if scope is not None:
        q = q.where(r.project.in_(sorted(scope)) if scope else sa.false())
    return [dict(row) for row in conn.execute(q).mappings()]


GPU_COLUMNS = (
    "run_id",
    "device_uuid",
    "seq",
    "busy_s",
    "energy_j",
    "throttle_s",
    "power_max_w",
    "mem_used_last_b",
    "temp_max_c",
)
_TERMS = 100  # (run, device, seq) conditions per query


def new_gpu_rows(conn: Connection, cursors: Sequence[tuple[str, str, int]]) -> list[dict[str, Any]]:
    """GPU intervals at or after each cursor (run_id, device_uuid, first seq not yet read), ordered
    by run, device and seq. Each cursor is a primary-key range."""
    g = gpu_intervals.c
    cols = [g[c] for c in GPU_COLUMNS]
    conditions = [sa.and_(g.run_id == run_id, g.device_uuid == uuid, g.seq >= seq) for run_id, uuid, seq in cursors]
    out = []
    for i in range(0, len(conditions), _TERMS):
        q = sa.select(*cols).where(sa.or_(*conditions[i : i + _TERMS])).order_by(g.run_id, g.device_uuid, g.seq)
        out.extend(dict(row) for row in conn.execute(q).mappings())
    return out


def new_host_rows(conn: Connection, cursors: Sequence[tuple[str, int]]) -> list[dict[str, Any]]:
    """Host intervals (run_id, seq, cpu_s) at or after each run's cursor, ordered by run and seq."""
    h = host_intervals.c
    conditions = [sa.and_(h.run_id == run_id, h.seq >= seq) for run_id, seq in cursors]
    out = []
    for i in range(0, len(conditions), _TERMS):
        q = sa.select(h.run_id, h.seq, h.cpu_s).where(sa.or_(*conditions[i : i + _TERMS])).order_by(h.run_id, h.seq)
        out.extend(dict(row) for row in conn.execute(q).mappings())
    return out


def _units(conn: Connection, expr: sa.ColumnElement[Any], scale: int) -> sa.ColumnElement[Any]:
    """floor(expr * scale + 0.5) as an integer, the same arithmetic as prom.series.units: sums of
    these are exact, so every reader gets the same total. (SQLite's CAST truncates, which is floor
    for the non-negative readings stored; PostgreSQL's CAST would round, so floor() there.)"""
    scaled = expr * scale + 0.5
    if conn.dialect.name == "sqlite":
        return sa.cast(scaled, sa.Integer)
    return sa.cast(sa.func.floor(scaled), sa.BigInteger)


def whole_gpu_sums(
    conn: Connection, run_ids: Sequence[str], reasons: Sequence[str], *, tiered: bool = False
) -> list[dict[str, Any]]:
    """Per run and device, over all stored intervals: busy_us, energy_mj, ``throttle_<reason>`` (µs)
    sums in integer units (None when never measured), last_seq and count (count == last_seq + 1: no
    gap in the seqs). One grouped read per chunk:
    the first scrape of a run by a server process. ``tiered``: with the tiered and dropped days'
    count, busy and energy (their summaries keep no throttle time: it counts the ledger's rows)."""
    g = gpu_intervals.c
    cols = [
        g.run_id,
        g.device_uuid,
        sa.func.sum(_units(conn, g.busy_s, 1_000_000)).label("busy_us"),
        sa.func.sum(_units(conn, g.energy_j, 1_000)).label("energy_mj"),
        sa.func.max(g.seq).label("last_seq"),
        sa.func.count().label("count"),
    ]
    cols += [sa.func.sum(_units(conn, g.throttle_s[r].as_float(), 1_000_000)).label(f"throttle_{r}") for r in reasons]
    out = []
    for chunk in _chunks(run_ids):
        q = sa.select(*cols).where(g.run_id.in_(chunk)).group_by(g.run_id, g.device_uuid)
        out.extend(dict(row) for row in conn.execute(q).mappings())
    if tiered:
        blank = {"busy_us": None, "energy_mj": None, **{f"throttle_{r}": None for r in reasons}}
        _add_dropped(conn, run_ids, "gpu", out, blank, {"busy_us": ("busy_ms", 1000), "energy_mj": ("energy_mj", 1)})
    return out


def whole_host_sums(conn: Connection, run_ids: Sequence[str], *, tiered: bool = False) -> list[dict[str, Any]]:
    """Per run, over all stored host intervals: cpu_us (integer µs), last_seq and count.
    ``tiered``: with the tiered and dropped days'."""
    h = host_intervals.c
    out = []
    for chunk in _chunks(run_ids):
        q = (
            sa.select(
                h.run_id,
                sa.func.sum(_units(conn, h.cpu_s, 1_000_000)).label("cpu_us"),
                sa.func.max(h.seq).label("last_seq"),
                sa.func.count().label("count"),
            )
            .where(h.run_id.in_(chunk))
            .group_by(h.run_id)
        )
        out.extend(dict(row) for row in conn.execute(q).mappings())
    if tiered:
        _add_dropped(conn, run_ids, "host", out, {"cpu_us": None}, {"cpu_us": ("cpu_ms", 1000)})
    return out


def _add_dropped(
    conn: Connection,
    run_ids: Sequence[str],
    series: str,
    out: list[dict[str, Any]],
    blank: dict[str, Any],
    sums: dict[str, tuple[str, int]],
) -> None:
    """Add to ``out`` (rows of whole_gpu_sums / whole_host_sums) the summaries of the days tiered
    and dropped: their rows to count, their last seq to last_seq, and each sum (column: (the
    summary's name, its factor to the column's unit)) some row of theirs measured; a device only
    they hold gets a row of its own. Unmeasured stays None, never 0."""
    from gpuledger.store.tiered_totals import dropped_parts, measured

    key = (lambda r: (r["run_id"], r["device_uuid"])) if series == "gpu" else (lambda r: (r["run_id"], ""))
    by_key = {key(row): row for row in out}
    for run_id, parts in dropped_parts(conn, run_ids, series).items():
        for uuid, part in parts:
            row = by_key.get((run_id, uuid))
            if row is None:
                row = {"run_id": run_id, **({"device_uuid": uuid} if series == "gpu" else {}), **blank}
                row.update(count=0, last_seq=-1)
                by_key[(run_id, uuid)] = row
                out.append(row)
            row["count"] = int(row["count"]) + int(part["rows"])
            row["last_seq"] = max(int(row["last_seq"]), int(part["seq"][1]))
            for column, (name, factor) in sums.items():
                if measured(part, name):
                    row[column] = int(row[column] or 0) + int(part["sums"][name]) * factor


def series_only_sums(
    conn: Connection, run_ids: Sequence[str], reasons: Sequence[str]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(GPU rows, host rows) as ``whole_gpu_sums`` / ``whole_host_sums`` give them, of the
    series-only runs among ``run_ids`` (no row in ``gpu_intervals`` / ``host_intervals``,
    store/series_segments.py): busy_us and energy_mj from ``series_day_sums`` (None when no row
    measured it), count and last_seq from the seq segments, throttle time, the host's cpu_us and
    the GPU rows' gauges (``power_max_w``, ``mem_used_last_b``, ``temp_max_c`` of the latest row)
    from ``series_streams`` (store/series_streams.py; sums None where a stream's rows predate it).
    Their rows never reach the interval tables, so the cursors never see them: these sums are read
    again on every scrape (one read of each table per chunk, the segments' only for such runs)."""
    d, s = series_day_sums.c, series_segments.c
    gpu_out: list[dict[str, Any]] = []
    host_out: list[dict[str, Any]] = []
    for chunk in _chunks(sorted(set(run_ids))):
        streams = series_streams.read(conn, chunk)
        q = (
            sa.select(
                d.run_id,
                d.device_uuid,
                _units(conn, sa.func.sum(d.busy_s), 1_000_000).label("busy_us"),
                _units(conn, sa.func.sum(d.energy_j), 1_000).label("energy_mj"),
            )
            .where(d.run_id.in_(chunk))
            .group_by(d.run_id, d.device_uuid)
        )
        sums = {(r["run_id"], r["device_uuid"]): dict(r) for r in conn.execute(q).mappings()}
        host_out += [
            {"run_id": run_id, "cpu_us": series_streams.cpu_us(row)}
            for (run_id, uuid), row in streams.items()
            if uuid == series_streams.HOST
        ]
        if not sums:
            continue
        sq = (
            sa.select(
                s.run_id,
                s.device_uuid,
                sa.func.max(s.last_seq).label("last_seq"),
                sa.func.sum(s.last_seq - s.first_seq + 1).label("count"),
            )
            .where(s.run_id.in_(sorted({k[0] for k in sums})), s.device_uuid != "")
            .group_by(s.run_id, s.device_uuid)
        )
        seqs = {(r["run_id"], r["device_uuid"]): r for r in conn.execute(sq).mappings()}
        for key, row in sums.items():
            seg, stream = seqs.get(key), streams.get(key)
            row["last_seq"] = -1 if seg is None else int(seg["last_seq"])
            row["count"] = 0 if seg is None else int(seg["count"])
            throttle = {} if stream is None else series_streams.throttle_us(stream)
            row.update({f"throttle_{r}": throttle.get(r) for r in reasons})
            row.update({c: None if stream is None else stream[c] for c in GAUGES})
            gpu_out.append(row)
    return gpu_out, host_out


def gpu_rows_at(conn: Connection, keys: Sequence[tuple[str, str, int]]) -> list[dict[str, Any]]:
    """The intervals at exactly (run_id, device_uuid, seq): primary-key lookups (the latest gauges)."""
    g = gpu_intervals.c
    cols = [g[c] for c in GPU_COLUMNS]
    out = []
    for i in range(0, len(keys), _TERMS):
        conditions = [sa.and_(g.run_id == r, g.device_uuid == u, g.seq == s) for r, u, s in keys[i : i + _TERMS]]
        out.extend(dict(row) for row in conn.execute(sa.select(*cols).where(sa.or_(*conditions))).mappings())
    return out


def device_rows(conn: Connection, run_ids: Sequence[str]) -> list[dict[str, Any]]:
    d = devices.c
    out = []
    for chunk in _chunks(run_ids):
        q = sa.select(d.run_id, d.uuid, d.index, d.memory_total_b).where(d.run_id.in_(chunk))
        out.extend(dict(row) for row in conn.execute(q).mappings())
    return out
