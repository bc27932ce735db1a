"""Read queries for cost reports (SQLAlchemy Core, SQLite and PostgreSQL). Read-only.

Sums are done in SQL where the data is large: GPU intervals are summed per run, GPU and UTC day
(an interval crossing midnight is split in proportion to time), rollup rows per run, GPU model and
price period. ``scope`` is the set of projects the reader may see (None: all) and is applied in the
WHERE clause, so rows outside it never leave the database. Queries that serve the split of a
shared GPU ignore the scope on purpose (a visible run's share depends on invisible co-tenants);
their results are used for the arithmetic only, never shown.
"""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gpuledger.store import rollup_stale, series_day_sums
from gpuledger.store.queries import open_run
from gpuledger.store.schema import devices, gpu_intervals, gpu_owners, gpu_rollups, run_labels, runs, series_segments

if TYPE_CHECKING:
    from gpuledger.store.series_cut_days import CutDays

__all__ = [
    "RUN_COLUMNS",
    "Scope",
    "chain_links",
    "device_rows",
    "interval_days",
    "interval_sums",
    "label_values",
    "last_interval_ends",
    "raw_intervals",
    "readings",
    "replayed_in_window",
    "rolled_up_on",
    "rollup_candidates",
    "rollup_days",
    "rollup_group_sums",
    "run_rows",
    "stream_day_sums",
    "summed_streams",
    "tenants_of",
    "unrolled_runs",
    "with_intervals",
]

Scope = frozenset[str] | None  # projects visible; None = every project (must be said explicitly)
DAY_S = 86400
_CHUNK = 2000  # ids per IN (...) list: far below SQLite's and PostgreSQL's parameter limits
# A run and its attempts: summed stream by stream in seq order (a few queries per GPU and day);
# more runs at once (rollups of a batch, a chargeback) are one GROUP BY.
_FEW_RUNS = 8


def _integrals(g: Any) -> list[sa.ColumnElement[Any]]:
    """The sums a day of intervals is priced from, in this order: busy and its count, energy and
    its count (a NULL sum of measured rows stays told apart from 0), the row count."""
    return [
        sa.func.sum(g.busy_s),
        sa.func.count(g.busy_s),
        sa.func.sum(g.energy_j),
        sa.func.count(g.energy_j),
        sa.func.count(),
    ]


def _chunks(items: Sequence[Any]) -> Iterable[Sequence[Any]]:
    for i in range(0, len(items), _CHUNK):
        yield items[i : i + _CHUNK]


def _fetch(conn: Connection, q: sa.Select[Any]) -> list[tuple[Any, ...]]:
    """All rows as plain tuples, straight from the driver's cursor: for the large reads of a
    report, where SQLAlchemy's per-row processing would cost more than the query. Only for
    columns whose driver values need no conversion (text, numbers)."""
    if conn.dialect.name == "postgresql" and conn.dialect.driver == "psycopg":
        # psycopg's binary format halves the time to read a year of floats.
        compiled = q.compile(dialect=conn.dialect, compile_kwargs={"render_postcompile": True})
        with conn.connection.driver_connection.cursor(binary=True) as cur:  # type: ignore[union-attr]
            cur.execute(compiled.string, compiled.params)
            return cur.fetchall()
    result = conn.execute(q)
    try:
        return result.cursor.fetchall() if result.cursor is not None else []
    finally:
        result.close()


def _floor(conn: Connection, expr: sa.ColumnElement[Any]) -> sa.ColumnElement[Any]:
    # SQLite has floor() only when built with math functions; CAST truncates, which is floor for
    # the positive epoch times we store. PostgreSQL's CAST would round, so floor() there.
    if conn.dialect.name == "sqlite":
        return sa.cast(expr, sa.Integer)
    return sa.cast(sa.func.floor(expr), sa.Integer)


def _scoped(q: sa.Select[Any], scope: Scope) -> sa.Select[Any]:
    if scope is None:
        return q
    if not scope:
        return q.where(sa.false())
    return q.where(runs.c.project.in_(sorted(scope)))


def _real_runs(q: sa.Select[Any], replayed: bool) -> sa.Select[Any]:
    """``q`` over the runs table, less the runs metered from a replayed GPU trace (--replay-gpus:
    demos, not hardware anyone pays for) unless ``replayed`` asks for them too."""
    return q if replayed else q.where(runs.c.replayed == sa.false())


def _real_rollups(conn: Connection, q: sa.Select[Any], replayed: bool) -> sa.Select[Any]:
    """``q`` over gpu_rollups, less the rows of replayed runs unless ``replayed``. The rows do not
    carry the flag: the few replayed runs are looked up first and the filter is added only when
    there are some, so a ledger with none pays one scan of the runs table and nothing per row."""
    if replayed:
        return q
    if conn.scalar(sa.select(sa.exists().where(runs.c.replayed == sa.true()))):
        demo = runs.alias("demo")  # never correlated with a runs table the query joins
        return q.where(gpu_rollups.c.run_id.not_in(sa.select(demo.c.id).where(demo.c.replayed == sa.true())))
    return q


def _in_window(start: float | None, end: float | None) -> list[sa.ColumnElement[bool]]:
    out: list[sa.ColumnElement[bool]] = []
    if end is not None:
        out.append(runs.c.started_at < end)
    if start is not None:
        # ended_at is never before the last interval, so this keeps every run that may have used
        # a GPU in the window (a killed run is cut back to its last interval later).
        out.append(sa.or_(runs.c.ended_at.is_(None), runs.c.ended_at > start))
    return out


RUN_COLUMNS = ("id", "status", "user", "team", "project", "name", "started_at", "ended_at", "attempt_of")


def _run_columns() -> list[sa.ColumnElement[Any]]:
    # RUN_COLUMNS, then NULL for the instance type, the id again as the logical id and the replayed
    # flag: the row is already shaped like reports.cost.usage.RunRow.
    return [
        *(runs.c[c] for c in RUN_COLUMNS),
        sa.null().label("instance_type"),
        runs.c.id.label("logical_id"),
        runs.c.replayed,
    ]


def run_rows(
    conn: Connection,
    *,
    scope: Scope,
    replayed: bool,
    start: float | None = None,
    end: float | None = None,
    ids: Sequence[str] | None = None,
) -> list[tuple[Any, ...]]:
    """Runs in scope that may have used a GPU in [start, end) (or the runs ``ids``), as tuples of
    RUN_COLUMNS, NULL (instance type), the id again (logical id) and the replayed flag; replayed
    runs only with ``replayed``. Labels and rollups are asked separately: joined here they cost
    more than twice."""
    base = _real_runs(_scoped(sa.select(*_run_columns()), scope), replayed).where(*_in_window(start, end))
    if ids is None:
        return _fetch(conn, base)
    out: list[tuple[Any, ...]] = []
    for chunk in _chunks(list(ids)):
        out.extend(_fetch(conn, base.where(runs.c.id.in_(chunk))))
    return out


def unrolled_runs(conn: Connection, *, scope: Scope, replayed: bool, start: float, end: float) -> list[tuple[Any, ...]]:
    """Runs in scope not rolled up (running, or finished since the last rollup) that may have used
    a GPU in [start, end), as run_rows tuples (replayed runs only with ``replayed``): a range of
    the (rolled_up, started_at) index."""
    q = sa.select(*_run_columns()).where(runs.c.rolled_up == sa.false(), *_in_window(start, end))
    return _fetch(conn, _real_runs(_scoped(q, scope), replayed))


def replayed_in_window(conn: Connection, *, scope: Scope, start: float, end: float) -> list[str]:
    """The replayed runs in scope that may have used a GPU in [start, end): what a bill left out."""
    q = sa.select(runs.c.id).where(runs.c.replayed == sa.true(), *_in_window(start, end))
    return sorted(conn.scalars(_scoped(q, scope)))


def label_values(conn: Connection, key: str, ids: Sequence[str]) -> dict[str, str]:
    """run id -> the value of label ``key``, for the runs ``ids`` that have it. (Rolled-up runs'
    instance types come with their rollup rows: only the few other runs are asked here.)"""
    lab = run_labels.c
    base = sa.select(lab.run_id, lab.value).where(lab.key == key)
    out: dict[str, str] = {}
    for chunk in _chunks(list(ids)):
        out.update(_fetch(conn, base.where(lab.run_id.in_(chunk))))
    return out


def rolled_up_on(conn: Connection, days: Sequence[int]) -> set[str]:
    """The runs with rollup rows on any of ``days``."""
    r = gpu_rollups.c
    out: set[str] = set()
    for chunk in _chunks(list(days)):
        out.update(conn.scalars(sa.select(r.run_id).where(r.day.in_(chunk)).distinct()))
    return out


def with_intervals(conn: Connection, ids: Sequence[str]) -> set[str]:
    """The runs of ``ids`` that still have GPU intervals (one index probe each)."""
    out: set[str] = set()
    for chunk in _chunks(list(ids)):
        has = sa.exists().where(gpu_intervals.c.run_id == runs.c.id)
        out.update(conn.scalars(sa.select(runs.c.id).where(runs.c.id.in_(chunk), has)))
    return out


def chain_links(conn: Connection, ids: Collection[str]) -> dict[str, tuple[str | None, str | None]]:
    """(attempt_of, project) of each run in ``ids`` that exists. Unscoped: the caller follows a
    resumed run's chain only through the projects its reader may see."""
    out: dict[str, tuple[str | None, str | None]] = {}
    for chunk in _chunks(sorted(ids)):
        q = sa.select(runs.c.id, runs.c.attempt_of, runs.c.project).where(runs.c.id.in_(chunk))
        out.update({r.id: (r.attempt_of, r.project) for r in conn.execute(q)})
    return out


def device_rows(conn: Connection, run_ids: Sequence[str]) -> list[dict[str, Any]]:
    """run_id, uuid, index, name, mig_profile, mig_parent_uuid of the runs' GPUs."""
    d = devices.c
    out: list[dict[str, Any]] = []
    for chunk in _chunks(list(run_ids)):
        q = sa.select(d.run_id, d.uuid, d.index, d.name, d.mig_profile, d.mig_parent_uuid).where(d.run_id.in_(chunk))
        out.extend(dict(r) for r in conn.execute(q).mappings())
    return out


def last_interval_ends(conn: Connection, run_ids: Sequence[str], *, intervals: bool = True) -> dict[str, float]:
    """The end of each run's last GPU interval (or rollup row): how far a killed run is known to have run.
    ``intervals=False``: the rollup rows only (the caller has the intervals' ends already)."""
    out: dict[str, float] = {}
    if intervals:  # a series-only run's GPU rows: the ends of its segments (store/series_segments.py)
        seg = series_segments.c
        for chunk in _chunks(list(run_ids)):
            q = (
                sa.select(seg.run_id, sa.func.max(seg.t1))
                .where(seg.run_id.in_(chunk), seg.device_uuid != "")
                .group_by(seg.run_id)
            )
            out.update({run_id: float(t1) for run_id, t1 in conn.execute(q)})
    for table in (gpu_intervals, gpu_rollups) if intervals else (gpu_rollups,):
        for chunk in _chunks(list(run_ids)):
            q = (
                sa.select(table.c.run_id, sa.func.max(table.c.t1))
                .where(table.c.run_id.in_(chunk))
                .group_by(table.c.run_id)
            )
            for run_id, t1 in conn.execute(q):
                if t1 is not None:
                    out[run_id] = max(out.get(run_id, t1), t1)
    return out


def interval_days(
    conn: Connection,
    run_ids: Sequence[str],
    start: float | None,
    end: float | None,
    skip_days: Sequence[int] = (),
) -> list[dict[str, Any]]:
    """GPU intervals of ``run_ids`` summed per (run_id, device_uuid, day) inside [start, end):
    t0, t1, busy_s, busy_n, energy_j, energy_n, intervals. An interval crossing one midnight is
    split in proportion to time; longer ones are left to ``raw_intervals``, and so are those touching
    ``skip_days`` (days a price changes within) to ``raw_intervals``."""
    return interval_sums(conn, run_ids, start, end, skip_days)[0]


def interval_sums(
    conn: Connection,
    run_ids: Sequence[str],
    start: float | None,
    end: float | None,
    skip_days: Sequence[int] = (),
    series: CutDays | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(``interval_days``, ``raw_intervals``) of the same arguments, from one scan of the intervals
    when no interval needs reading raw (and one more when some do). A series-only run's day sums on
    ``skip_days`` are replaced by its rows of those days read from the store (``series``:
    store/series_cut_days.py), where it still holds them; without ``series`` they stay whole.

    Speed (a 72-hour run of 8 GPUs has 2 million intervals): one GROUP BY per run, GPU, day and
    kind of interval (inside the day, crossing the next midnight, to be read raw). A GPU's
    intervals follow each other, so a night has one crossing interval per GPU: its group's
    MIN/MAX/SUM are that interval's own figures, and it is split here. (A UNION of both halves of
    every row, grouped, read each row twice and sorted twice as many; the raw ones were looked
    for with a scan of their own.) Overlapping intervals that cross the same midnight are read one
    by one. A few whole runs without price-change days are first summed without the GROUP BY's
    sort (``_in_seq_order``: a 72-hour, 8-GPU run in 1.0 s of CPU instead of 2.8 s).
    """
    held, marked = series_day_sums.read(conn, run_ids, start, end)
    if marked:  # runs whose rows only the series store holds: their day sums, added push by push
        rest = [r for r in run_ids if r not in marked]
        day_rows, raw_rows = interval_sums(conn, rest, start, end, skip_days) if rest else ([], [])
        if skip_days and series is not None:  # a price changes within these days: split exactly
            held, more = series.split(held, set(skip_days))
            raw_rows = [*raw_rows, *more]
        return [*day_rows, *held], raw_rows
    if start is None and end is None and not skip_days and len(set(run_ids)) <= _FEW_RUNS:
        found = _in_seq_order(conn, run_ids)
        if found is not None:
            return found
    g = gpu_intervals.c
    d0 = _floor(conn, g.t0 / DAY_S)
    d1 = _floor(conn, g.t1 / DAY_S)
    crosses = sa.and_(d1 > d0, g.t1 > (d0 + 1) * DAY_S)
    raw = [d1 > d0 + 1]
    if skip_days:
        raw += [d0.in_(list(skip_days)), d1.in_(list(skip_days))]
    kind = sa.case((sa.or_(*raw), 2), (crosses, 1), else_=0).label("kind")
    conds = []
    if start is not None:
        conds.append(g.t1 > start)
    if end is not None:
        conds.append(g.t0 < end)
    sums: dict[tuple[str, str, int], dict[str, Any]] = {}
    raw_rows: list[dict[str, Any]] = []
    for chunk in _chunks(list(run_ids)):
        where = [g.run_id.in_(chunk), *conds]
        day = d0.label("day")
        q = (
            sa.select(
                g.run_id,
                g.device_uuid,
                day,
                kind,
                sa.func.min(g.t0),
                sa.func.max(g.t1),
                *_integrals(g),
            )
            .where(*where)
            .group_by(g.run_id, g.device_uuid, day, kind)
        )
        crossing: list[tuple[Any, ...]] = []
        any_raw = False
        for run_id, uuid, d, k, t0, t1, busy, busy_n, energy, energy_n, n in _fetch(conn, q):
            if k == 0:
                _add_sums(sums, run_id, uuid, int(d), t0, t1, busy, busy_n, energy, energy_n, n)
            elif k == 2:
                any_raw = True
            elif n == 1:  # the group is one interval: its figures are the aggregates
                crossing.append((run_id, uuid, d, t0, t1, busy, energy))
            else:
                rows = sa.select(g.run_id, g.device_uuid, d0, g.t0, g.t1, g.busy_s, g.energy_j).where(
                    *where, g.device_uuid == uuid, g.run_id == run_id, d0 == d, crosses, sa.not_(sa.or_(*raw))
                )
                crossing += _fetch(conn, rows)
        for run_id, uuid, d, t0, t1, busy, energy in crossing:
            night = (int(d) + 1) * DAY_S
            first = (night - t0) / (t1 - t0)  # t1 > night > t0 here: the part before midnight
            _add_part(sums, run_id, uuid, int(d), t0, night, busy, energy, first, 0)
            _add_part(sums, run_id, uuid, int(d) + 1, night, t1, busy, energy, 1.0 - first, 1)
        if any_raw:
            raw_rows += raw_intervals(conn, chunk, start, end, skip_days)
    return list(sums.values()), raw_rows


def _in_seq_order(conn: Connection, run_ids: Sequence[str]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]] | None:
    """``interval_sums`` of whole runs without sorting: a stream (run, GPU) whose intervals follow
    each other in time is cut at each midnight by a binary search on seq (index lookups), and each
    day's seq range is summed in index order. Each range's own MIN(t0), MAX(t0) and MAX(t1) prove
    that all its rows lie inside its day (the last row of a range, which may cross midnight, is
    read and placed here); None when a stream is not in time order, for the GROUP BY to do.
    A GROUP BY sorts every row (2 million in a 72-hour, 8-GPU run: about three times the scan)."""
    g = gpu_intervals.c
    sums: dict[tuple[str, str, int], dict[str, Any]] = {}
    raw_rows: list[dict[str, Any]] = []
    known = _SUMMED.get()
    for run_id in sorted(set(run_ids)):
        uuid: str | None = None
        while True:  # the run's streams, one index seek each (no scan of its intervals)
            q = sa.select(sa.func.min(g.device_uuid)).where(g.run_id == run_id)
            if uuid is not None:
                q = q.where(g.device_uuid > uuid)
            uuid = _fetch(conn, q)[0][0]
            if uuid is None:
                break
            summed = known.get((run_id, uuid))
            if summed is not None:  # the run report summed this stream already (store/series_queries.py)
                sums.update({(run_id, uuid, row["day"]): dict(row) for row in summed[0]})
                raw_rows += summed[1]
            elif _stream_in_seq_order(conn, run_id, uuid, sums, raw_rows) is None:
                return None
    return list(sums.values()), raw_rows


# (run_id, uuid) -> that stream's (day rows, raw rows), as _stream_in_seq_order would add them.
StreamDays = dict[tuple[str, str], tuple[list[dict[str, Any]], list[dict[str, Any]]]]
_SUMMED: ContextVar[StreamDays] = ContextVar("summed_streams", default={})  # noqa: B039 (never mutated)


@contextlib.contextmanager
def summed_streams(streams: StreamDays) -> Iterator[None]:
    """Within the block, ``interval_sums`` of whole runs takes these streams' day sums as given
    instead of reading their intervals again: the run report sums each stream's buckets in one
    pass and prices the run from the same pass (``stream_day_sums``)."""
    token = _SUMMED.set(streams)
    try:
        yield
    finally:
        _SUMMED.reset(token)


# One seq range of a stream: a, last seq, least t0, a bound above every t0 in it, greatest t1,
# busy sum and count, energy sum and count, rows.
Range = tuple[int, int, float, float, float, float | None, int, float | None, int, int]


def stream_day_sums(
    run_id: str, uuid: str, ranges: Iterable[Range], rows_of: Callable[[int, int], list[tuple[Any, ...]]]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """One stream's (day rows, raw rows), as ``_stream_in_seq_order`` makes them, from sums over
    consecutive seq ranges that cover the stream: a range inside one day (its t0 bound and its
    greatest t1 say so) is added whole; the few others (around a midnight) are read row by row
    with ``rows_of(a, last)``: (t0, t1, busy_s, energy_j) tuples."""
    sums: dict[tuple[str, str, int], dict[str, Any]] = {}
    raw_rows: list[dict[str, Any]] = []
    for a, last, t0, below, t1, busy, busy_n, energy, energy_n, n in ranges:
        day = int(t0 / DAY_S)  # as SQL's CAST(t0 / 86400 AS INTEGER), which may round up to a midnight
        if int(math.nextafter(below, -math.inf) / DAY_S) == day and t1 <= (day + 1) * DAY_S:
            _add_sums(sums, run_id, uuid, day, t0, t1, busy, busy_n, energy, energy_n, n)
            continue
        for r0, r1, r_busy, r_energy in rows_of(a, last):
            _add_row(sums, raw_rows, run_id, uuid, r0, r1, r_busy, r_energy)
    return list(sums.values()), raw_rows


def _add_row(
    sums: dict[tuple[str, str, int], dict[str, Any]],
    raw_rows: list[dict[str, Any]],
    run_id: str,
    uuid: str,
    t0: float,
    t1: float,
    busy: float | None,
    energy: float | None,
) -> None:
    """One interval added to its day (split in two when it crosses one midnight; raw beyond)."""
    d0, d1 = int(t0 / DAY_S), int(t1 / DAY_S)
    if d1 > d0 + 1:
        raw_rows.append({"run_id": run_id, "device_uuid": uuid, "t0": t0, "t1": t1, "busy_s": busy, "energy_j": energy})
    elif d1 > d0 and t1 > (d0 + 1) * DAY_S:
        night = (d0 + 1) * DAY_S
        first = (night - t0) / (t1 - t0)
        _add_part(sums, run_id, uuid, d0, t0, night, busy, energy, first, 0)
        _add_part(sums, run_id, uuid, d0 + 1, night, t1, busy, energy, 1.0 - first, 1)
    else:
        _add_sums(sums, run_id, uuid, d0, t0, t1, busy, int(busy is not None), energy, int(energy is not None), 1)


def _stream_in_seq_order(
    conn: Connection,
    run_id: str,
    uuid: str,
    sums: dict[tuple[str, str, int], dict[str, Any]],
    raw_rows: list[dict[str, Any]],
) -> int | None:
    """Add one stream's day sums (see _in_seq_order); its interval count, or None."""
    g = gpu_intervals.c
    base = (g.run_id == run_id, g.device_uuid == uuid)
    lo_hi = _fetch(conn, sa.select(sa.func.min(g.seq), sa.func.max(g.seq)).where(*base))
    lo, hi = lo_hi[0] if lo_hi else (None, None)
    if lo is None:
        return 0

    def at_or_after(seq: int) -> tuple[int, float]:
        row = _fetch(conn, sa.select(g.seq, g.t0).where(*base, g.seq >= seq).order_by(g.seq).limit(1))
        return int(row[0][0]), float(row[0][1])

    first_day, last_day = int(at_or_after(lo)[1] // DAY_S), int(at_or_after(hi)[1] // DAY_S)
    if last_day - first_day > 366:
        return None  # a long-lived stream: one GROUP BY beats a search per day
    bounds = [lo]
    for day in range(first_day + 1, last_day + 1):
        midnight, a, b = day * DAY_S, bounds[-1], hi
        while a < b:  # the first seq whose interval starts at or after this midnight
            mid = (a + b) // 2
            if at_or_after(mid)[1] >= midnight:
                b = mid
            else:
                a = mid + 1
        bounds.append(at_or_after(a)[0])
    bounds.append(hi + 1)
    counted = 0
    for k, (a, b) in enumerate(itertools.pairwise(bounds)):
        if b <= a:
            continue
        day = first_day + k
        last = _fetch(
            conn,
            sa.select(g.seq, g.t0, g.t1, g.busy_s, g.energy_j).where(*base, g.seq < b).order_by(g.seq.desc()).limit(1),
        )
        last_seq, t0, t1, busy, energy = last[0]
        if last_seq < a:
            continue
        body = _fetch(
            conn,
            sa.select(
                sa.func.min(g.t0),
                sa.func.max(g.t0),
                sa.func.max(g.t1),
                *_integrals(g),
            ).where(*base, g.seq >= a, g.seq < last_seq),
        )[0]
        if body[7]:
            # SQL's own day of t0 (CAST of the same float division), and nothing past the next midnight.
            if int(body[0] / DAY_S) != day or int(body[1] / DAY_S) != day or body[2] > (day + 1) * DAY_S:
                return None
            _add_sums(sums, run_id, uuid, day, body[0], body[2], body[3], body[4], body[5], body[6], body[7])
            counted += body[7]
        counted += 1
        _add_row(sums, raw_rows, run_id, uuid, t0, t1, busy, energy)
    return counted


def _add_sums(
    sums: dict[tuple[str, str, int], dict[str, Any]],
    run_id: str,
    uuid: str,
    day: int,
    t0: float,
    t1: float,
    busy: float | None,
    busy_n: int,
    energy: float | None,
    energy_n: int,
    n: int,
) -> None:
    row = sums.get((run_id, uuid, day))
    if row is None:
        sums[(run_id, uuid, day)] = {
            "run_id": run_id,
            "device_uuid": uuid,
            "day": day,
            "t0": t0,
            "t1": t1,
            "busy_s": busy,
            "busy_n": busy_n,
            "energy_j": energy,
            "energy_n": energy_n,
            "intervals": n,
        }
        return
    row["t0"], row["t1"] = min(row["t0"], t0), max(row["t1"], t1)
    if busy is not None:
        row["busy_s"] = (row["busy_s"] or 0.0) + busy
    if energy is not None:
        row["energy_j"] = (row["energy_j"] or 0.0) + energy
    row["busy_n"] += busy_n
    row["energy_n"] += energy_n
    row["intervals"] += n


def _add_part(
    sums: dict[tuple[str, str, int], dict[str, Any]],
    run_id: str,
    uuid: str,
    day: int,
    a: float,
    b: float,
    busy: float | None,
    energy: float | None,
    share: float,
    ends: int,
) -> None:
    """One day's part of an interval crossing midnight, added as SQL's SUM/COUNT/MIN/MAX would."""
    row = sums.get((run_id, uuid, day))
    if row is None:
        row = sums[(run_id, uuid, day)] = {
            "run_id": run_id,
            "device_uuid": uuid,
            "day": day,
            "t0": a,
            "t1": b,
            "busy_s": None,
            "busy_n": 0,
            "energy_j": None,
            "energy_n": 0,
            "intervals": 0,
        }
    row["t0"], row["t1"] = min(row["t0"], a), max(row["t1"], b)
    if busy is not None:
        row["busy_s"] = (row["busy_s"] or 0.0) + busy * share
        row["busy_n"] += 1
    if energy is not None:
        row["energy_j"] = (row["energy_j"] or 0.0) + energy * share
        row["energy_n"] += 1
    row["intervals"] += ends


def raw_intervals(
    conn: Connection, run_ids: Sequence[str], start: float | None, end: float | None, days: Sequence[int] = ()
) -> list[dict[str, Any]]:
    """The intervals ``interval_days`` leaves to Python: those crossing more than one midnight
    (imported runs) and those touching one of ``days``. Each is returned once."""
    g = gpu_intervals.c
    d0 = _floor(conn, g.t0 / DAY_S)
    d1 = _floor(conn, g.t1 / DAY_S)
    wanted = [d1 > d0 + 1]
    if days:
        wanted += [d0.in_(list(days)), d1.in_(list(days))]
    conds = [sa.or_(*wanted)]
    if start is not None:
        conds.append(g.t1 > start)
    if end is not None:
        conds.append(g.t0 < end)
    out: list[dict[str, Any]] = []
    for chunk in _chunks(list(run_ids)):
        q = sa.select(g.run_id, g.device_uuid, g.t0, g.t1, g.busy_s, g.energy_j).where(g.run_id.in_(chunk), *conds)
        out.extend(dict(r) for r in conn.execute(q).mappings())
    return out


def tenants_of(
    conn: Connection, run_ids: Sequence[str], start: float | None, end: float | None
) -> list[dict[str, Any]]:
    """Every run (any project: see the module docstring) holding a GPU that one of ``run_ids``
    holds, in [start, end): uuid, run_id, status, started_at, ended_at. Only runs of the GPU's own
    host count (``gpu_owners``, store/ownership.py): a run of another machine naming the same UUID
    must not halve anyone's bill. A GPU without an owner row (a local ledger) counts every run."""
    d2 = devices.alias("mine")
    out: list[dict[str, Any]] = []
    for chunk in _chunks(list(run_ids)):
        mine = sa.select(d2.c.uuid).where(d2.c.run_id.in_(chunk))
        q = (
            sa.select(
                devices.c.uuid, runs.c.id.label("run_id"), runs.c.status, runs.c.started_at, runs.c.ended_at,
                runs.c.host,
            )
            .select_from(devices.join(runs, runs.c.id == devices.c.run_id))
            .where(devices.c.uuid.in_(mine), *_in_window(start, end))
        )  # fmt: skip
        out.extend(dict(r) for r in conn.execute(q).mappings())
    # The owners apart, not joined: joined, PostgreSQL plans the IN (...) above row by row (10x slower).
    homes: dict[str, str] = {}
    uuids = sorted({r["uuid"] for r in out})
    for chunk in _chunks(uuids):
        homes.update(
            conn.execute(sa.select(gpu_owners.c.uuid, gpu_owners.c.host).where(gpu_owners.c.uuid.in_(chunk))).all()
        )
    uniq: dict[tuple[str, str], dict[str, Any]] = {}
    for r in out:
        host = r.pop("host")
        if homes.get(r["uuid"], host) == host:  # the GPU's own host, or a GPU nobody registered
            uniq[(r["uuid"], r["run_id"])] = r
    return list(uniq.values())


def readings(
    conn: Connection, pairs: Collection[tuple[str, str]], start: float | None, end: float | None
) -> list[dict[str, Any]]:
    """The raw intervals of (run_id, device_uuid) pairs in [start, end), with per-process figures."""
    g = gpu_intervals.c
    by_run: dict[str, set[str]] = {}
    for run_id, uuid in pairs:
        by_run.setdefault(run_id, set()).add(uuid)
    out: list[dict[str, Any]] = []
    cols = (g.run_id, g.device_uuid, g.t0, g.t1, g.busy_s, g.energy_j, g.proc_sm_util_avg_pct, g.proc_mem_max_b)
    for chunk in _chunks(sorted(by_run)):
        q = sa.select(*cols).where(g.run_id.in_(chunk))
        if start is not None:
            q = q.where(g.t1 > start)
        if end is not None:
            q = q.where(g.t0 < end)
        out.extend(dict(r) for r in conn.execute(q).mappings() if r["device_uuid"] in by_run[r["run_id"]])
    return out


def rollup_days(
    conn: Connection, *, scope: Scope, replayed: bool, first_day: int | None, last_day: int | None
) -> list[tuple[Any, ...]]:
    """Rollup rows of runs in scope (replayed runs' only with ``replayed``) from ``first_day`` to
    ``last_day``, as they are: tuples
    (run_id, day, gpu_name, mig_profile, t0, t1, alloc_s, busy_s, energy_j, share_rule,
    instance_type), with '' for an unknown name and a whole GPU's profile. Summing them in SQL
    (GROUP BY) costs more than sending them: the caller sums in one pass."""
    r = gpu_rollups.c
    q = sa.select(
        r.run_id,
        r.day,
        r.gpu_name,
        r.mig_profile,
        r.t0,
        r.t1,
        r.alloc_s,
        r.busy_s,
        r.energy_j,
        r.share_rule,
        r.instance_type,
    )
    if scope is not None:  # rows outside the scope never leave the database
        q = q.where(r.project.in_(sorted(scope)) if scope else sa.false())
    day: sa.ColumnElement[Any] = r.day
    if _most_of_the_table(conn, first_day, last_day):
        # SQLite would read most of the table through the day index, row by row; "day + 0" is not
        # an indexed term, so it scans the table in order instead (a third faster for a year).
        day = r.day + 0
    if first_day is not None:
        q = q.where(day >= first_day)
    if last_day is not None:
        q = q.where(day <= last_day)
    return _fetch(conn, _real_rollups(conn, q, replayed))


def _most_of_the_table(conn: Connection, first_day: int | None, last_day: int | None) -> bool:
    """Whether [first_day, last_day] spans at least half the days of gpu_rollups (SQLite only)."""
    if conn.dialect.name != "sqlite" or first_day is None or last_day is None:
        return False
    day = gpu_rollups.c.day
    lo = conn.scalar(sa.select(sa.func.min(day)))  # one min() or max() per query: an index look-up
    hi = conn.scalar(sa.select(sa.func.max(day)))
    return lo is not None and 2 * (min(last_day, hi) - max(first_day, lo) + 1) >= hi - lo + 1


def rollup_group_sums(
    conn: Connection,
    *,
    scope: Scope,
    replayed: bool,
    keys: Sequence[str],
    first_day: int,
    last_day: int,
    period_days: Sequence[int],
    exclude: Collection[str] = (),
    exact_days: Collection[int] = (),
) -> list[tuple[Any, ...]]:
    """Rollup rows from ``first_day`` to ``last_day`` summed per (run ``keys`` values...,
    instance_type, gpu_name, mig_profile, period, measured, own): each row is those values, then
    min(t0), max(t1), the sums of alloc_s, busy_s and energy_j, and the weakest share rule.
    ``measured``: the GPUs measured busy time; ``own``: the run of an ``exact_days`` row, else
    ''. A row's period is the number of ``period_days`` (sorted) at or before its day. One scan of
    the table by its day index (the rows carry their run's grouping values, migration 5;
    ``status``, fixed once a run is rolled up, comes from the runs table); runs in ``exclude``
    (read from their intervals instead) are left out, and so are replayed runs unless ``replayed``.

    Rows whose GPUs measured no busy time are summed apart from those that did: a sum of busy
    time must not absorb the held hours of GPUs billed by rule. On ``exact_days`` (a price changes
    inside them) each run's row stays its own, so its held time keeps its own span and is cut at
    the change exactly rather than in proportion to a group's whole span."""
    r = gpu_rollups.c
    inside = [d for d in period_days if first_day < d <= last_day]
    before = sum(1 for d in period_days if d <= first_day)
    period: sa.ColumnElement[Any] = sa.literal(before)
    if inside:
        whens = [(r.day < d, before + i) for i, d in enumerate(inside)]
        period = sa.case(*whens, else_=before + len(inside))
    source: sa.FromClause = gpu_rollups
    key_columns = []
    for k in keys:
        if k == "status":
            source = gpu_rollups.join(runs, runs.c.id == r.run_id)
            key_columns.append(runs.c.status)
        else:
            key_columns.append(r[k])
    measured = r.busy_s.is_not(None).label("measured")
    own: sa.ColumnElement[Any] = sa.literal("")
    if exact_days:
        own = sa.case((r.day.in_(sorted(exact_days)), r.run_id), else_=sa.literal(""))
    group = [*key_columns, r.instance_type, r.gpu_name, r.mig_profile, period.label("period"), measured]
    group.append(own.label("own"))
    q = (
        sa.select(
            *group,
            sa.func.min(r.t0),
            sa.func.max(r.t1),
            sa.func.sum(r.alloc_s),
            sa.func.sum(r.busy_s),
            sa.func.sum(r.energy_j),
            sa.func.min(sa.func.nullif(r.share_rule, "")),  # "equal" < "memory" < "sm": the weakest
        )
        .select_from(source)
        .where(r.day >= first_day, r.day <= last_day)
    )
    if scope is not None:
        q = q.where(r.project.in_(sorted(scope)) if scope else sa.false())
    if exclude:
        q = q.where(r.run_id.not_in(sorted(exclude)))
    return _fetch(conn, _real_rollups(conn, q, replayed).group_by(*group))


def rollups_of(conn: Connection, ids: Sequence[str]) -> list[tuple[Any, ...]]:
    """The rollup rows of the runs among ``ids`` that are rolled up and not frozen, in
    ``rollup_days`` form: read by run key, so a few runs' value costs no scan of the day range.
    Frozen runs (raw days dropped) are left to ``frozen_rollups``, which prices them per model."""
    r = gpu_rollups.c
    cols = (r.run_id, r.day, r.gpu_name, r.mig_profile, r.t0, r.t1, r.alloc_s, r.busy_s, r.energy_j,
            r.share_rule, r.instance_type)  # fmt: skip
    out: list[tuple[Any, ...]] = []
    for chunk in _chunks(sorted(ids)):
        q = sa.select(*cols).where(r.run_id.in_(chunk), ~rollup_stale.frozen(r.run_id))
        out.extend(_fetch(conn, q))
    return out


def frozen_rollups(conn: Connection, ids: Sequence[str]) -> list[Any]:
    """The rollup rows of the runs among ``ids`` whose raw intervals went with a dropped day
    partition (store/rollup_stale.frozen): what they used is read from these rows, never from the
    intervals they keep."""
    r = gpu_rollups.c
    q = sa.select(
        r.run_id, r.gpu_name, r.mig_profile, r.gpus, r.t0, r.t1, r.alloc_s, r.busy_s, r.energy_j, r.share_rule
    ).where(r.run_id.in_(sorted(ids)), rollup_stale.frozen(r.run_id))
    return list(conn.execute(q.order_by(r.run_id, r.day, r.gpu_name, r.mig_profile)))


def rollup_candidates(conn: Connection, *, rebuild: bool, limit: int | None = None) -> list[str]:
    """Finished runs not rolled up yet (every finished run with ``rebuild``, but those whose raw
    intervals went with a dropped day partition: their rollups are final, store/rollup_stale.frozen)."""
    q = sa.select(runs.c.id).where(~open_run(runs.c))
    q = q.where(~rollup_stale.frozen(runs.c.id) if rebuild else runs.c.rolled_up == sa.false())
    q = q.order_by(runs.c.started_at, runs.c.id)
    if limit is not None:
        q = q.limit(limit)
    return list(conn.scalars(q))
