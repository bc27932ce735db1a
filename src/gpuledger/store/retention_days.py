"""PostgreSQL retention by day: whole day partitions of raw intervals dropped, never rows deleted.

A day (store/partitions.py) older than the raw window goes only when every run with intervals in
it may lose them by the rules retention applies before it rewrites a run's intervals: the run has
ended before the cut, its cost rollups are written (``runs.rolled_up``: reports then never read the
dropped rows), and its rows match its seal (a tampered run is not laundered into a fresh seal; a
run nobody sealed waits for an admin's ``gpuledger audit seal``; a run lost by the liveness sweep
waits for its agent). Otherwise the day is kept and the report says which run held it and why.

With a series store (``tier``), the day's rows are first copied into it run by run and read back
(store/series_tier.py); a day the store does not hold exactly is kept, and ``run.raw_tiered``
records what it holds.

In the transaction of the ``DROP TABLE``: each run's ``rollup_marks`` take the highest seq dropped
per device (a late replay of those rows is then dropped at ingest, store/bulk.unreplaced) at level
``DROPPED_LEVEL``, which also freezes its cost rollups (store/rollup_stale.py: their source rows are
gone, a rebuild could only lose hours); the trail gets ``run.raw_dropped`` and the run is resealed
over the rows it keeps, so ``gpuledger audit verify`` passes afterwards.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gpuledger.core.model import run_is_open
from gpuledger.store import audit, partitions, schema, series_live, series_tier

if TYPE_CHECKING:
    from gpuledger.store.ledger import Ledger

DROPPED_LEVEL = partitions.DROPPED_LEVEL
_LOCK_TIMEOUT = "10s"


@dataclass
class DayReport:
    dropped: list[str] = field(default_factory=list)  # dates (YYYY-MM-DD) whose partitions were dropped
    kept: dict[str, str] = field(default_factory=dict)  # date -> why it was kept
    rows: int = 0  # interval rows dropped with them


def _lock_timeout(exc: sa.exc.OperationalError) -> bool:
    return getattr(exc.orig, "sqlstate", None) == "55P03"  # lock_not_available: lock_timeout ran out


def date_of(day: int) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(day * partitions.DAY_S))


def _why_unsafe(conn: Connection, run_id: str, cut: float, tampered: Callable[[Connection, str], list[str]]) -> str:
    r = schema.runs.c
    row = conn.execute(sa.select(r.status, r.ended_at, r.rolled_up).where(r.id == run_id)).first()
    if row is None:  # the foreign key keeps this from happening
        return "no such run"
    if run_is_open(row.status, row.ended_at):
        return "still recording"
    if row.ended_at is None or row.ended_at >= cut:
        return "ended inside the raw window"
    if not row.rolled_up:
        return "its cost rollups are not written yet (gpuledger report rollup)"
    problems = tampered(conn, run_id)
    return "; ".join(problems[:3])


def _dropped_rows(conn: Connection, name: str, gpu: bool) -> list[Any]:
    device = "device_uuid" if gpu else "''"
    q = f"SELECT run_id, {device} AS device_uuid, count(*) AS n, max(seq) AS upto FROM {name} GROUP BY 1, 2"
    return list(conn.exec_driver_sql(q))


def _mark(conn: Connection, run_id: str, series: str, uuid: str, n: int, upto: int, now: float) -> None:
    m = schema.rollup_marks
    key = (m.c.run_id == run_id, m.c.series == series, m.c.device_uuid == uuid)
    old = conn.execute(sa.select(m.c.upto_seq, m.c.rows_before).where(*key)).first()
    conn.execute(sa.delete(m).where(*key))
    values = {
        "run_id": run_id, "series": series, "device_uuid": uuid, "level_s": DROPPED_LEVEL,
        "upto_seq": max(upto, old.upto_seq if old else -1), "rows_before": n + (old.rows_before if old else 0),
        "rows_after": 0, "at": now,
    }  # fmt: skip
    conn.execute(sa.insert(m), values)


def locked_day_check(
    conn: Connection, names: list[tuple[str, bool]], cut: float, tampered: Callable[[Connection, str], list[str]]
) -> str | dict[str, list[Any]]:
    """Lock the day's partitions (name, is gpu) against writers and check every run in them may
    lose its rows there: the rows per partition counted per run and device, or why not."""
    conn.exec_driver_sql(f"SET LOCAL lock_timeout = '{_LOCK_TIMEOUT}'")
    for name, _ in names:  # no row of the day may arrive between the checks and the drop
        conn.exec_driver_sql(f"LOCK TABLE {name} IN SHARE MODE")
    counted = {name: _dropped_rows(conn, name, gpu) for name, gpu in names}
    run_ids = sorted({r.run_id for rows in counted.values() for r in rows})
    for run_id in run_ids:
        why = _why_unsafe(conn, run_id, cut, tampered)
        if why:
            return f"run {run_id}: {why}"
    return counted


def tier_day(
    conn: Connection, day: int, names: list[tuple[str, bool]], tier: series_tier.Tier, only: set[str] | None = None
) -> str | dict[str, Any]:
    """Copy each run's rows of the day (of the runs in ``only``, if given) into the series store,
    checked (store/series_tier.py): the ``run.raw_tiered`` payload per run, or why the day must stay.
    Rows the store holds already (written live by ``serve --series-live``) are not copied again."""
    date = date_of(day)
    tier = series_live.fill_only(tier)
    out = {}
    for run_id, (gpu, host) in series_tier.day_rows(conn, names).items():
        if only is not None and run_id not in only:
            continue
        try:
            out[run_id] = series_tier.copy_run(tier, date, run_id, gpu, host)
        except series_tier.TierError as exc:
            return f"run {run_id}: not tiered into {tier.url}: {exc}"
    return out


def _drop_day(
    conn: Connection, day: int, names: list[tuple[str, bool]], cut: float, actor: str,
    tampered: Callable[[Connection, str], list[str]], tier: series_tier.Tier | None = None,
) -> str | int:  # fmt: skip
    """Drop the day's partitions (name, is gpu) when every run in them is safe, after copying them
    into the series store when there is one: the rows dropped, or why not."""
    counted = locked_day_check(conn, names, cut, tampered)
    if isinstance(counted, str):
        return counted
    tiered = tier_day(conn, day, names, tier) if tier is not None else {}
    if isinstance(tiered, str):
        return tiered
    now = time.time()
    per_run: dict[str, dict[str, int]] = {}
    for (_name, gpu), rows in zip(names, counted.values(), strict=True):
        series = "gpu" if gpu else "host"
        for r in rows:
            _mark(conn, r.run_id, series, r.device_uuid, int(r.n), int(r.upto), now)
            tally = per_run.setdefault(r.run_id, {"gpu_rows": 0, "host_rows": 0})
            tally[f"{series}_rows"] += int(r.n)
    for name, _ in names:
        conn.exec_driver_sql(f"DROP TABLE {name}")
    date = date_of(day)
    for run_id, tally in per_run.items():
        if run_id in tiered:  # what the store holds instead, checked by audit verify --series
            audit.append(conn, actor=actor, action=series_tier.ACTION, obj=f"run:{run_id}", payload=tiered[run_id])
        payload = {"day": date, **tally}
        audit.append(conn, actor=actor, action="run.raw_dropped", obj=f"run:{run_id}", payload=payload)
        audit.seal_run(conn, run_id, actor=actor, reason=f"raw intervals of {date} dropped by retention")
    return sum(sum(t.values()) for t in per_run.values())


def old_days(ledger: Ledger, cut: float) -> dict[int, list[tuple[str, bool]]]:
    """Day -> its partitions (name, is gpu) of the days that end at or before ``cut``."""
    by_day: dict[int, list[tuple[str, bool]]] = {}
    for table, gpu in (("gpu_intervals", True), ("host_intervals", False)):
        for day, name in ledger.read(lambda c, t=table: partitions.day_partitions(c, t)).items():  # type: ignore[misc]
            if (day + 1) * partitions.DAY_S <= cut:
                by_day.setdefault(day, []).append((name, gpu))
    return by_day


def drop_old_days(
    ledger: Ledger, cut: float, *, actor: str, tampered: Callable[[Connection, str], list[str]],
    tier: series_tier.Tier | None = None,
) -> DayReport:  # fmt: skip
    """Drop the day partitions that end at or before ``cut`` and hold only intervals of runs safe
    to drop; one transaction per day. With ``tier``, each day is first copied into that series
    store and read back (a day the store does not hold exactly is kept)."""
    report = DayReport()
    if ledger.dialect != "postgresql":
        return report
    try:
        partitions.maintain(ledger.database)  # strays out of the default partitions, into their days
    except sa.exc.OperationalError as exc:
        if not _lock_timeout(exc):
            raise  # else: strays stay in the default partition until the next maintenance
    by_day = old_days(ledger, cut)
    for day in sorted(by_day):
        try:
            outcome = ledger.write(lambda c, d=day: _drop_day(c, d, by_day[d], cut, actor, tampered, tier))  # type: ignore[misc]
        except sa.exc.OperationalError as exc:
            if not _lock_timeout(exc):
                raise
            outcome = f"its tables stayed locked by other transactions for {_LOCK_TIMEOUT}; tried again next time"
        if isinstance(outcome, str):
            report.kept[date_of(day)] = outcome
        else:
            report.dropped.append(date_of(day))
            report.rows += outcome
    return report
