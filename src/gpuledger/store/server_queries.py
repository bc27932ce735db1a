"""Read queries of the team server, each restricted to a scope (the projects the reader may see;
None = all) in its WHERE clause, so rows outside it never leave the database. Large reads (a run's
intervals) are streamed from a server-side cursor (``stream``)."""

from __future__ import annotations

import calendar
import json
import time
from collections.abc import Collection, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gpuledger.core.model import RunRecord
from gpuledger.store import codec, queries, schema

if TYPE_CHECKING:
    from gpuledger.store import Ledger
    from gpuledger.store.engine import Database

Scope = frozenset[str] | None
ALERT_KINDS = ("alert", "oom", "nan_loss")


def in_scope(scope: Scope) -> sa.ColumnElement[bool]:
    if scope is None:
        return sa.true()
    if not scope:
        return sa.false()
    return schema.runs.c.project.in_(sorted(scope))


def list_runs(
    conn: Connection,
    scope: Scope,
    *,
    project: str | None = None,
    team: str | None = None,
    user: str | None = None,
    status: str | None = None,
    since: float | None = None,
    labels: Mapping[str, Any] | None = None,
    limit: int = 50,
) -> list[RunRecord]:
    q = queries.list_runs_query(
        project=project, team=team, user=user, status=status, since=since, labels=labels, limit=limit
    ).where(in_scope(scope))
    return [codec.run_from_row(r) for r in conn.execute(q).mappings()]


def busy_by_run(
    conn: Connection, run_ids: Collection[str], *, tiered: bool = False
) -> dict[str, tuple[int, float | None]]:
    """run id -> (GPUs with intervals, busy seconds summed; None when none measured). ``tiered``
    (the server reads a series store): a run's raw days tiered into it and dropped from the ledger
    count too, from the audit trail's sums (store/tiered_totals.py) as ``gpuledger runs`` counts
    them, not from the store; without it those days are gone, as the CLI reads them. A series-only
    run's GPUs and busy time come from its ``series_day_sums`` (one grouped read for the list)."""
    if not run_ids:
        return {}
    from gpuledger.store.tiered_totals import dropped_gpu_sums, series_only_gpu_sums

    g = schema.gpu_intervals.c
    q = (
        sa.select(g.run_id, g.device_uuid, sa.func.sum(g.busy_s))
        .where(g.run_id.in_(sorted(run_ids)))
        .group_by(g.run_id, g.device_uuid)
    )
    per_gpu: dict[str, dict[str, float | None]] = {}
    for run_id, uuid, busy in conn.execute(q):
        per_gpu.setdefault(run_id, {})[uuid] = None if busy is None else float(busy)
    dropped = dropped_gpu_sums(conn, run_ids) if tiered else {}
    for run_id, parts in [*series_only_gpu_sums(conn, run_ids).items(), *dropped.items()]:
        devices = per_gpu.setdefault(run_id, {})
        for uuid, part in parts.items():
            held = devices.get(uuid)
            add = part.get("busy_s")
            devices[uuid] = held if add is None else (held or 0.0) + add
    out: dict[str, tuple[int, float | None]] = {}
    for run_id, devices in per_gpu.items():
        busy = [b for b in devices.values() if b is not None]
        out[run_id] = (len(devices), sum(busy) if busy else None)
    return out


def visible_run(conn: Connection, run_id: str, scope: Scope) -> RunRecord | None:
    q = sa.select(schema.runs).where(schema.runs.c.id == run_id, in_scope(scope))
    row = conn.execute(q).mappings().first()
    return None if row is None else codec.run_from_row(row)


def recent_alerts(
    conn: Connection, scope: Scope, *, since: float | None, limit: int, kinds: tuple[str, ...] = ALERT_KINDS
) -> list[dict[str, Any]]:
    e, r = schema.events.c, schema.runs.c
    q = (
        sa.select(e.run_id, e.seq, e.t, e.kind, e.message, e.payload, r.name, r.project, r.team, r.user)
        .join(schema.runs, r.id == e.run_id)
        .where(e.kind.in_(kinds), in_scope(scope))
        .order_by(e.t.desc(), e.run_id, e.seq.desc())
        .limit(limit)
    )
    if since is not None:
        q = q.where(e.t >= since)
    out = []
    for row in conn.execute(q).mappings():  # mappings: a Row's .t is a method of Row itself
        item = dict(row)
        item["run_name"] = item.pop("name")
        out.append(item)
    return out


def run_project(conn: Connection, run_id: str) -> tuple[bool, str | None]:
    """(exists, project label) of a run, for a writer's check before it uploads anything."""
    row = conn.execute(sa.select(schema.runs.c.project).where(schema.runs.c.id == run_id)).first()
    return (False, None) if row is None else (True, row[0])


def interval_export_query(
    run_id: str,
    columns: Sequence[str],
    *,
    series: Sequence[str] = ("gpu", "host"),
    after_t: float | None = None,
    limit: int | None = None,
) -> sa.Select[Any]:
    """A run's intervals as rows with the given export columns (docs/EXPORT.md), oldest first in
    the export's order: t0, then series (gpu before host), then GPU index. ``series``: which of the
    two; ``after_t``: only rows ending after it; ``limit``: at most this many rows."""
    g, h, d = schema.gpu_intervals, schema.host_intervals, schema.devices
    gpu_from = g.outerjoin(d, sa.and_(d.c.run_id == g.c.run_id, d.c.uuid == g.c.device_uuid))
    special = {
        "gpu": {"series": sa.literal("gpu", sa.String), "gpu_index": d.c["index"], "gpu_uuid": g.c.device_uuid,
                "gpu_name": d.c.name, "util_unmeasured_s": queries.unmeasured_sql(g.c)},
        "host": {"series": sa.literal("host", sa.String)},
    }  # fmt: skip
    kinds = {c.name: c.type for c in (*g.c, *h.c)} | {
        "gpu_index": sa.Integer(),
        "gpu_uuid": sa.Text(),
        "gpu_name": sa.Text(),
    }

    def absent(c: str) -> sa.ColumnElement[Any]:  # a typed NULL: PostgreSQL cannot guess the type of a bare one
        return sa.cast(sa.null(), kinds.get(c, sa.Text()))

    selects = []
    for name, table, source in (("gpu", g, gpu_from), ("host", h, h)):
        if name not in series:
            continue
        picked = [
            special[name].get(c, table.c[c] if c in table.c and c != "device_uuid" else absent(c)).label(c)
            for c in columns
        ]
        q = sa.select(*picked).select_from(source).where(table.c.run_id == run_id)
        if after_t is not None:
            q = q.where(table.c.t1 > after_t)
        selects.append(q)
    both = sa.union_all(*selects).subquery() if len(selects) > 1 else selects[0].subquery()
    key = [both.c.t0, both.c.series, sa.func.coalesce(both.c.gpu_index, -1), both.c.seq]
    q = sa.select(*both.c).order_by(*key)
    return q if limit is None else q.limit(limit)


def tiered_interval_rows(
    ledger: Ledger,
    run_id: str,
    *,
    series: Sequence[str] = ("gpu", "host"),
    after_t: float | None = None,
    limit: int | None = None,
) -> Iterator[dict[str, Any]]:
    """The rows ``interval_export_query`` gives, for a run with raw days tiered into the ledger's
    series store (``Ledger.tiered``), where that query misses the dropped days: the ledger's rows
    merged with the store's (store/series_read.py), in the same order, filtered and cut alike.
    Tiered rows come back quantized to the store's units (series/quantum.py). A page (``limit``)
    from a store that reads a time window (``TieredReads.windowed``) reads growing windows from
    ``after_t`` until the page is full, not the whole run; otherwise the run is read whole."""
    from gpuledger.reports.run.export import interval_rows

    reads = ledger.series_reads
    if limit is not None and reads is not None and reads.windowed:
        rows = _windows(ledger, reads, run_id, series, after_t, limit)
    else:
        gpu = ledger.gpu_intervals(run_id) if "gpu" in series else []
        host = ledger.host_intervals(run_id) if "host" in series else []
        rows = interval_rows(run_id, ledger.devices(run_id), gpu, host)
    if limit is not None and limit <= 0:
        return
    n = 0
    for row in rows:
        if after_t is not None and row["t1"] <= after_t:  # type: ignore[operator]
            continue
        n += 1
        if row["throttle_s"] is not None:  # as the database hands it over: streaming.export_row writes it
            row["throttle_s"] = json.loads(row["throttle_s"])  # type: ignore[arg-type]
        yield row
        if n == limit:  # before asking for another row: that could read the next window
            return


FIRST_WINDOW_S = 3600.0  # a page's first window from after_t
GROWTH = 4.0  # a next window is at most this many times longer (after an empty one, exactly)
_MS = 0.001  # the store's time unit


def _windows(
    ledger: Ledger, reads: Any, run_id: str, series: Sequence[str], after_t: float | None, limit: int
) -> Iterator[dict[str, Any]]:
    """The run's rows in export order, window after window: window k reads the rows with t1 past
    its start (less a unit, so a row of no length on the boundary is not missed) and t0 before its
    end, from the ledger (SQL) and from the store. After window k every row with t1 > after_t and
    t0 before its end has been read, so its new rows (each key once) sort after those given. The
    next window is as long as the rows still wanted take at the rate the last one found (a quarter
    more), so a page reads about its own rows."""
    from gpuledger.reports.run.export import interval_rows

    span = ledger.read(lambda conn: _span(conn, run_id))
    if span is None:
        return
    devices = ledger.devices(run_id)
    start = span[0] if after_t is None else after_t
    # The first page's first window ends where the run started: before it there is seldom a row,
    # and windows grown over that empty stretch would read far more than the page.
    first_end = ledger.get_run(run_id).started_at if after_t is None else start
    seen: set[tuple[str, int]] = set()
    t_from, width, wanted = start, FIRST_WINDOW_S, limit
    while t_from <= span[1] and wanted > 0:
        before_start = t_from == start and first_end > start + width
        t_to = first_end if before_start else t_from + width
        lo = t_from if t_from == start else t_from - _MS
        gpu = _new(ledger, reads, run_id, lo, t_to, seen, True) if "gpu" in series else []
        host = _new(ledger, reads, run_id, lo, t_to, seen, False) if "host" in series else []
        found = len(gpu) + len(host)  # each one given: new rows end after after_t
        yield from interval_rows(run_id, devices, gpu, host)  # type: ignore[arg-type]
        wanted -= found
        grow = 1.0 if before_start else GROWTH if not found else min(GROWTH, 1.25 * wanted / found)
        t_from, width = t_to, max(1.0, width * grow)


def _new(
    ledger: Ledger, reads: Any, run_id: str, lo: float, hi: float, seen: set[tuple[str, int]], gpu: bool
) -> list[Any]:
    """The window's rows not given yet: the ledger's, and the store's it does not hold (as the whole
    read, store/series_read.py, the ledger's copy of an interval wins wherever its times put it)."""
    table = schema.gpu_intervals if gpu else schema.host_intervals
    q = sa.select(table).where(table.c.run_id == run_id, table.c.t1 > lo, table.c.t0 < hi)
    decode = codec.gpu_from_row if gpu else codec.host_from_row
    held = [decode(r) for r in ledger.read(lambda conn: list(conn.execute(q).mappings()))]
    tiered = reads.gpu_between(run_id, lo, hi) if gpu else reads.host_between(run_id, lo, hi)
    also_held = ledger.read(lambda conn: _held_keys(conn, run_id, [_key(iv, gpu) for iv in tiered], gpu))
    out = []
    for iv in [*held, *(t for t in tiered if _key(t, gpu) not in also_held)]:
        if _key(iv, gpu) not in seen:
            seen.add(_key(iv, gpu))
            out.append(iv)
    return sorted(out, key=lambda iv: _key(iv, gpu))  # the order of Ledger.gpu_intervals / host_intervals


def _key(iv: Any, gpu: bool) -> tuple[str, int]:
    return (iv.device_uuid if gpu else "", iv.seq)


def _held_keys(conn: Connection, run_id: str, keys: list[tuple[str, int]], gpu: bool) -> set[tuple[str, int]]:
    """Which of ``keys`` the ledger holds: per device, its seqs in their range (the key index)."""
    table = schema.gpu_intervals if gpu else schema.host_intervals
    by_device: dict[str, list[int]] = {}
    for device, seq in keys:
        by_device.setdefault(device, []).append(seq)
    out = set()
    for device, seqs in by_device.items():
        q = sa.select(table.c.seq).where(table.c.run_id == run_id, table.c.seq.between(min(seqs), max(seqs)))
        if gpu:
            q = q.where(table.c.device_uuid == device)
        out |= {(device, int(seq)) for seq in conn.scalars(q)}
    return out


def _span(conn: Connection, run_id: str) -> tuple[float, float] | None:
    """Bounds of the run's rows in the ledger and the series store: no t0 before the first, and
    none at or after the second (the store holds rows only on tiered days, or the ledger's too, or
    a series-only run's, which its segments bound)."""
    from gpuledger.store.series_tier import tiered_days

    lows, highs = [], []
    for table in (schema.gpu_intervals, schema.host_intervals):
        lo, hi = conn.execute(
            sa.select(sa.func.min(table.c.t0), sa.func.max(table.c.t1)).where(table.c.run_id == run_id)
        ).one()
        if lo is not None:
            lows.append(float(lo) - 1.0)
            highs.append(float(hi))
    # a series-only run (store/series_segments.py): its segments bound the rows the store holds
    s = schema.series_segments.c
    lo, hi = conn.execute(sa.select(sa.func.min(s.t0), sa.func.max(s.t1)).where(s.run_id == run_id)).one()
    if lo is not None:
        lows.append(float(lo) - 1.0)
        highs.append(float(hi))
    days = tiered_days(conn, run_id)
    if days:
        lows.append(calendar.timegm(time.strptime(days[0], "%Y-%m-%d")) - 1.0)
        highs.append(calendar.timegm(time.strptime(days[-1], "%Y-%m-%d")) + 86400.0)
    return (min(lows), max(highs)) if lows else None


def stream(db: Database, query: sa.Select[Any], per_fetch: int) -> Iterator[Mapping[str, Any]]:
    """The rows of ``query`` from a server-side cursor (PostgreSQL: a named cursor), ``per_fetch``
    rows per round trip, so a result of any size costs the memory of one fetch. The connection and
    its read transaction are held until the iterator is exhausted or closed: close it."""
    conn = db.engine.connect()
    try:
        with conn.begin():
            result = conn.execution_options(yield_per=per_fetch).execute(query)
            yield from result.mappings()
    finally:
        conn.close()
