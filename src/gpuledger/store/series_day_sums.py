"""Per run x GPU x UTC day sums of a series-only run's intervals, added push by push.

A run whose raw intervals only the series store holds (store/series_segments.py) has no rows in
``gpu_intervals`` for cost queries to sum. Each push adds its new GPU rows' sums per (run, GPU,
day) to ``series_day_sums`` in its own transaction (``INSERT ... ON CONFLICT DO UPDATE SET x = x +
excluded.x``): the figures ``cost_queries.interval_sums`` computes from raw rows (first start, last
end, busy and energy with the count of rows that measured them, rows ending in the day), an
interval crossing midnight split in proportion to its parts' lengths and counted on the day it
ends, as there. Only rows new to the store are added (the segments decide), so a resent or
regrouped batch adds nothing and a rolled-back push added nothing. ``interval_sums`` reads these
rows for such runs, so ``materialise_rollups`` writes their ``gpu_rollups`` as for any run.

A price change inside a day (``cuts``) cannot split these sums: for such a day the cost read takes
the run's rows of the day from the store instead (store/series_cut_days.py).
"""

from __future__ import annotations

import calendar
import functools
import time
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import Connection

from gpuledger.core.pricing.usage import DAY_S, day_of, split_days
from gpuledger.store import schema, series_tier

SUMMED = ("busy_s", "energy_j")


DaySums = dict[tuple[str, int], dict[str, Any]]  # (GPU, day) -> its day_rows row


def day_rows(run_id: str, rows: Sequence[Sequence[Any]], columns: Sequence[str]) -> list[dict[str, Any]]:
    """The (run, GPU, day) sums of GPU ``rows`` (values in ``columns`` order)."""
    out: DaySums = {}
    fold(out, run_id, rows, columns)
    return list(out.values())


def fold(out: DaySums, run_id: str, rows: Sequence[Sequence[Any]], columns: Sequence[str]) -> None:
    """Add GPU ``rows`` to the sums ``out``, row by row: rows given a page at a time sum as the
    same rows given at once do, to the last bit (store/series_compact.py)."""
    at = {c: columns.index(c) for c in ("device_uuid", "t0", "t1", *SUMMED)}
    for r in rows:
        uuid, t0, t1 = str(r[at["device_uuid"]]), float(r[at["t0"]]), float(r[at["t1"]])
        length = t1 - t0
        for day, a, b in split_days(t0, t1) if length > 0 else [(day_of(t0), t0, t1)]:
            share = (b - a) / length if length > 0 else 1.0
            row = out.get((uuid, day))
            if row is None:
                row = out[(uuid, day)] = {
                    "run_id": run_id, "device_uuid": uuid, "day": day, "t0": a, "t1": b,
                    "busy_s": None, "busy_n": 0, "energy_j": None, "energy_n": 0, "intervals": 0,
                }  # fmt: skip
            row["t0"], row["t1"] = min(row["t0"], a), max(row["t1"], b)
            for col, count in (("busy_s", "busy_n"), ("energy_j", "energy_n")):
                value = r[at[col]]
                if value is not None:
                    row[col] = (row[col] or 0.0) + float(value) * share
                    row[count] += 1
            row["intervals"] += int(b == t1)


def _plus(old: Any, new: Any) -> Any:
    """old + new where a NULL is "never measured": NULL only when both are."""
    return sa.case(
        (sa.and_(old.is_(None), new.is_(None)), sa.null()),
        else_=sa.func.coalesce(old, 0.0) + sa.func.coalesce(new, 0.0),
    )


@functools.cache
def _upsert() -> Any:
    """The statement ``write`` runs, built once (building and keying it costs more than running it)."""
    t = schema.series_day_sums
    ins = pg_insert(t)
    ex = ins.excluded
    return ins.on_conflict_do_update(
        index_elements=[t.c.run_id, t.c.device_uuid, t.c.day],
        set_={
            "t0": sa.func.least(t.c.t0, ex.t0),
            "t1": sa.func.greatest(t.c.t1, ex.t1),
            "busy_s": _plus(t.c.busy_s, ex.busy_s),
            "energy_j": _plus(t.c.energy_j, ex.energy_j),
            "busy_n": t.c.busy_n + ex.busy_n,
            "energy_n": t.c.energy_n + ex.energy_n,
            "intervals": t.c.intervals + ex.intervals,
        },
    )


def add(conn: Connection, run_id: str, rows: Sequence[Sequence[Any]], columns: Sequence[str]) -> int:
    """Add the new GPU ``rows``' day sums (PostgreSQL); the rows written."""
    return write(conn, day_rows(run_id, rows, columns))


def write(conn: Connection, sums: Sequence[dict[str, Any]]) -> int:
    """Add ``sums`` (``day_rows`` rows) to the ledger's (PostgreSQL); the rows written."""
    if not sums:
        return 0
    conn.execute(_upsert(), sums)
    return len(sums)


def series_only(conn: Connection, run_ids: Sequence[str]) -> set[str]:
    """Those of ``run_ids`` whose raw intervals only the series store holds."""
    m = schema.series_only_runs.c
    marked: set[str] = set()
    ids = sorted(set(run_ids))
    for i in range(0, len(ids), 1000):
        marked |= set(conn.scalars(sa.select(m.run_id).where(m.run_id.in_(ids[i : i + 1000]))))
    return marked


def read(
    conn: Connection, run_ids: Sequence[str], start: float | None, end: float | None
) -> tuple[list[dict[str, Any]], set[str]]:
    """(the day sums of those of ``run_ids`` that are series-only, inside the whole days of
    [start, end); those runs' ids)."""
    marked = series_only(conn, run_ids)
    if not marked:
        return [], marked
    c = schema.series_day_sums.c
    q = sa.select(schema.series_day_sums).where(c.run_id.in_(sorted(marked)))
    if start is not None:
        q = q.where(c.day >= int(start // DAY_S))
    if end is not None:
        q = q.where(c.day < -int(-end // DAY_S))
    return [dict(r) for r in conn.execute(q).mappings()], marked


def iso_day(day: int) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(day * DAY_S))


def run_days(conn: Connection, run_id: str) -> list[str]:
    """The UTC days (YYYY-MM-DD) the run's rows lie on: those its GPU rows end on (its day sums),
    the day its first row starts on (the store keeps a row on the day it starts), and the days
    tiered and dropped from the ledger before ``db migrate --layout compact`` moved it, which
    have no day sums (their ``run.raw_tiered`` entries hold them)."""
    d, s = schema.series_day_sums.c, schema.series_segments.c
    days = {int(x) for x in conn.scalars(sa.select(d.day).where(d.run_id == run_id).distinct())}
    first = conn.scalar(sa.select(sa.func.min(s.t0)).where(s.run_id == run_id))
    if first is not None:
        days.add(int(float(first) // DAY_S))
    return sorted({*(iso_day(x) for x in days), *series_tier.tiered_days(conn, run_id)})


def store_days(conn: Connection, shown: str, since: str = "", before: str | None = None) -> list[str]:
    """The days (YYYY-MM-DD) in [``since``, ``before``) ("": no bound) the rows of the series-only
    runs writing into the store ``shown`` lie on (by their day sums, as ``run_days``): those a drop
    of that store's days may remove. Reads only what the window needs: the runs with a segment
    reaching into it (a segment spans its rows, so no other run has a row there), and of those
    their days inside it; a retention pass looks at the days since its last one, so the runs of
    the weeks before cost it nothing."""
    d, m, s = schema.series_day_sums.c, schema.series_only_runs.c, schema.series_segments.c
    lo = None if not since else _day_number(since)
    hi = None if before is None else _day_number(before)
    reaching = sa.select(s.run_id).where(s.run_id.in_(sa.select(m.run_id).where(m.store == shown)))
    sums = sa.select(d.day)
    firsts = sa.select(sa.func.min(s.t0)).group_by(s.run_id)
    if hi is not None:
        reaching = reaching.where(s.t0 < hi * DAY_S)
        sums = sums.where(d.day < hi)
        firsts = firsts.having(sa.func.min(s.t0) < hi * DAY_S)
    if lo is not None:
        reaching = reaching.where(s.t1 >= lo * DAY_S)
        sums = sums.where(d.day >= lo)
        firsts = firsts.having(sa.func.min(s.t0) >= lo * DAY_S)
    runs = reaching.distinct()
    days = {int(x) for x in conn.scalars(sums.where(d.run_id.in_(runs)).distinct())}
    # the day a run's first row starts on (a host row before its GPU rows): by the run's first segment
    days |= {int(float(t) // DAY_S) for t in conn.scalars(firsts.where(s.run_id.in_(runs))) if t is not None}
    return [iso_day(x) for x in sorted(days)]


def _day_number(iso: str) -> int:
    """YYYY-MM-DD as days since 1970-01-01."""
    return int(calendar.timegm(time.strptime(iso, "%Y-%m-%d")) // DAY_S)


def run_sums(conn: Connection, run_id: str) -> list[dict[str, Any]]:
    """The run's day sums, every day."""
    c = schema.series_day_sums.c
    return [dict(r) for r in conn.execute(sa.select(schema.series_day_sums).where(c.run_id == run_id)).mappings()]
