"""Audit queries over the whole ledger (read-only, SQLAlchemy Core, SQLite and PostgreSQL).

- ``gpu_hours``: allocated / busy / idle GPU-hours and energy per user, team or project per ISO
  week or calendar month (UTC). A run's hours land in the days they happened (a run crossing
  midnight is split exactly); allocated = the time the run held each GPU.
- ``failures``: failed, killed, lost and short runs: counts, GPU-hours wasted, commonest causes.
- ``configs``: which configurations (model, imgsz, batch, workers) give the most mAP per busy
  GPU-hour.
- ``gpu_users``: who ran on a GPU (UUID, or a MIG slice of it) in a time range.

Interval sums are read per chunk of runs through the primary-key index, so a big ledger is read
in steps; ``progress(done, total)`` is called after each step (the CLI draws a bar).
"""

from __future__ import annotations

import math
import re
import statistics
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gpuledger.store.schema import devices, events, gpu_intervals, metrics, runs

if TYPE_CHECKING:
    from gpuledger.store import Ledger

DAY_S = 86400.0
CHUNK = 200  # runs per interval query
Progress = Callable[[int, int], None] | None
MAP_KEYS = ("metrics/mAP50-95(B)", "metrics/mAP50-95(M)", "metrics/mAP50-95(P)", "metrics/mAP_0.5:0.95")
FAILURE_KINDS = ("cuda_oom", "oom", "oom_killed", "nan_loss", "dataset_not_found")
BAD_STATUSES = ("failed", "killed", "lost")


@dataclass
class RunRow:
    id: str
    name: str | None
    user: str
    team: str | None
    project: str | None
    host: str
    status: str
    status_reason: str | None
    started_at: float
    end: float  # ended_at, else the last interval, else started_at
    meta: dict[str, Any] = field(default_factory=dict)
    labels: dict[str, Any] = field(default_factory=dict)
    gpus: int = 0

    @property
    def wall_s(self) -> float:
        return max(0.0, self.end - self.started_at)


def _floor(dialect: str, expr: Any) -> Any:
    if dialect == "postgresql":
        return sa.cast(sa.func.floor(expr), sa.BigInteger)
    return sa.cast(expr, sa.Integer)  # SQLite truncates: times are positive, so this is floor


def _chunks(items: Sequence[str], size: int = CHUNK) -> list[Sequence[str]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def runs_between(conn: Connection, start: float | None, end: float | None, extra: Sequence[Any] = ()) -> list[RunRow]:
    """Runs whose time overlaps [start, end) (a running run reaches to now), oldest first."""
    r = runs.c
    q = sa.select(
        r.id,
        r.name,
        r.user,
        r.team,
        r.project,
        r.host,
        r.status,
        r.status_reason,
        r.started_at,
        r.ended_at,
        r.meta,
        r.labels,
    ).where(*extra)
    if end is not None:
        q = q.where(r.started_at < end)
    if start is not None:
        q = q.where(sa.or_(r.ended_at.is_(None), r.ended_at >= start))
    rows = conn.execute(q.order_by(r.started_at, r.id)).all()
    ids = [row.id for row in rows]
    last: dict[str, float] = {}
    ngpus: dict[str, int] = {}
    g, d = gpu_intervals.c, devices.c
    for chunk in _chunks(ids, 500):
        last.update(
            conn.execute(sa.select(g.run_id, sa.func.max(g.t1)).where(g.run_id.in_(chunk)).group_by(g.run_id)).all()
        )
        ngpus.update(
            conn.execute(sa.select(d.run_id, sa.func.count()).where(d.run_id.in_(chunk)).group_by(d.run_id)).all()
        )
    return [
        RunRow(
            row.id,
            row.name,
            row.user,
            row.team,
            row.project,
            row.host,
            row.status,
            row.status_reason,
            row.started_at,
            row.ended_at if row.ended_at is not None else last.get(row.id, row.started_at),
            row.meta or {},
            row.labels or {},
            int(ngpus.get(row.id, 0)),
        )
        for row in rows
    ]


def busy_per_day(
    conn: Connection,
    dialect: str,
    run_ids: Sequence[str],
    progress: Progress = None,
) -> dict[str, list[tuple[int, float, float]]]:
    """Run id -> [(UTC day number, busy seconds, energy joules)], all GPUs of the run summed; an
    interval counts in the day it starts."""
    g = gpu_intervals.c
    day = _floor(dialect, g.t0 / DAY_S).label("day")
    out: dict[str, list[tuple[int, float, float]]] = {}
    done = 0
    for chunk in _chunks(run_ids):
        q = (
            sa.select(g.run_id, day, sa.func.sum(g.busy_s), sa.func.sum(g.energy_j))
            .where(g.run_id.in_(chunk))
            .group_by(g.run_id, day)
        )
        for run_id, d, busy, energy in conn.execute(q):
            out.setdefault(run_id, []).append((int(d), float(busy or 0.0), float(energy or 0.0)))
        done += len(chunk)
        if progress is not None:
            progress(done, len(run_ids))
    return out


def _period(day: int, per: str) -> str:
    date = datetime.fromtimestamp(day * DAY_S, tz=timezone.utc)
    if per == "week":
        year, week, _ = date.isocalendar()
        return f"{year}-W{week:02d}"
    return f"{date.year}-{date.month:02d}"


def _group(run: RunRow, by: str) -> str:
    value = {"user": run.user, "team": run.team, "project": run.project}[by]
    return value if value else "(none)"


def _days(t0: float, t1: float) -> list[tuple[int, float]]:
    """(day number, seconds in that day) of [t0, t1)."""
    out = []
    day = math.floor(t0 / DAY_S)
    while day * DAY_S < t1:
        part = min(t1, (day + 1) * DAY_S) - max(t0, day * DAY_S)
        if part > 0:
            out.append((day, part))
        day += 1
    return out


def gpu_hours(
    ledger: Ledger,
    by: str = "user",
    per: str = "month",
    start: float | None = None,
    end: float | None = None,
    progress: Progress = None,
    include_replayed: bool = False,
) -> list[dict[str, Any]]:
    """Rows per (period, group): runs, allocated / busy / idle GPU-hours, energy kWh; newest period first,
    then by busy hours. Only the part of each run inside [start, end) counts. Runs metered from a
    replayed GPU trace used no real GPU and are left out, as the chargeback leaves them, unless
    ``include_replayed`` (each row then counts its ``replayed_runs``)."""
    if by not in ("user", "team", "project") or per not in ("week", "month"):
        raise ValueError("by: user, team or project; per: week or month")

    def tx(conn: Connection) -> list[dict[str, Any]]:
        found = runs_between(conn, start, end, () if include_replayed else (runs.c.replayed.is_(False),))
        demo = (runs.c.replayed.is_(True),)
        replayed = {r.id for r in runs_between(conn, start, end, demo)} if include_replayed else set()
        per_day = busy_per_day(conn, ledger.dialect, [r.id for r in found], progress)
        acc: dict[tuple[str, str], dict[str, Any]] = {}
        lo, hi = (start if start is not None else -math.inf), (end if end is not None else math.inf)

        def row_for(day: int, run: RunRow) -> dict[str, Any]:
            key = (_period(day, per), _group(run, by))
            row = acc.setdefault(
                key,
                {
                    "period": key[0],
                    by: key[1],
                    "runs": set(),
                    "allocated_gpu_hours": 0.0,
                    "busy_gpu_hours": 0.0,
                    "energy_kwh": 0.0,
                },
            )
            row["runs"].add(run.id)
            return row

        for run in found:
            for day, seconds in _days(max(run.started_at, lo), min(run.end, hi)):
                row_for(day, run)["allocated_gpu_hours"] += seconds * run.gpus / 3600
            for day, busy, energy in per_day.get(run.id, []):
                if (day + 1) * DAY_S <= lo or day * DAY_S >= hi:  # whole days: give dates as the range
                    continue
                row = row_for(day, run)
                row["busy_gpu_hours"] += busy / 3600
                row["energy_kwh"] += energy / 3.6e6
        out = []
        for row in acc.values():
            if include_replayed:
                row["replayed_runs"] = len(row["runs"] & replayed)
            row["runs"] = len(row["runs"])
            row["idle_gpu_hours"] = max(0.0, row["allocated_gpu_hours"] - row["busy_gpu_hours"])
            out.append(row)
        out.sort(key=lambda r: (r["period"], r["busy_gpu_hours"]), reverse=True)
        return out

    return ledger.read(tx)


def replayed_between(ledger: Ledger, start: float | None, end: float | None) -> int:
    """How many runs metered from a replayed GPU trace overlap [start, end)."""
    return ledger.read(lambda conn: len(runs_between(conn, start, end, (runs.c.replayed.is_(True),))))


# -- failures -------------------------------------------------------------------------------------


def cause_of(run: RunRow, kinds: Sequence[str]) -> str:
    """A short, groupable cause: the failure event kind, else the status reason without numbers."""
    for kind in FAILURE_KINDS:
        if kind in kinds:
            return kind
    reason = (run.status_reason or "").strip()
    if not reason:
        return "short run" if run.status == "succeeded" else run.status
    reason = re.sub(r"\d+(\.\d+)?", "N", reason.splitlines()[0])
    return reason[:80]


def failures(
    ledger: Ledger,
    start: float | None = None,
    end: float | None = None,
    short_s: float = 300.0,
    progress: Progress = None,
) -> dict[str, Any]:
    """Failed, killed and lost runs, and succeeded runs shorter than ``short_s``: counts, allocated
    GPU-hours spent on them ("wasted"), the commonest causes, and the runs."""

    def tx(conn: Connection) -> dict[str, Any]:
        found = [
            r
            for r in runs_between(conn, start, end)
            if r.status in BAD_STATUSES or (r.status == "succeeded" and r.wall_s < short_s)
        ]
        e = events.c
        kinds: dict[str, list[str]] = {}
        for i, chunk in enumerate(_chunks([r.id for r in found])):
            q = sa.select(e.run_id, e.kind).where(e.run_id.in_(chunk), e.kind.in_(FAILURE_KINDS))
            for run_id, kind in conn.execute(q):
                kinds.setdefault(run_id, []).append(kind)
            if progress is not None:
                progress(min(len(found), (i + 1) * CHUNK), len(found))
        causes: Counter[str] = Counter()
        hours: Counter[str] = Counter()
        listed = []
        for r in found:
            cause = cause_of(r, kinds.get(r.id, []))
            gpu_h = r.wall_s * r.gpus / 3600
            causes[cause] += 1
            hours[cause] += gpu_h
            listed.append(
                {
                    "id": r.id,
                    "name": r.name,
                    "user": r.user,
                    "project": r.project,
                    "status": r.status,
                    "started_at": r.started_at,
                    "wall_seconds": r.wall_s,
                    "gpus": r.gpus,
                    "allocated_gpu_hours": gpu_h,
                    "cause": cause,
                }
            )
        by_status = Counter("short" if r.status == "succeeded" else r.status for r in found)
        return {
            "runs": len(found),
            "by_status": dict(by_status),
            "wasted_gpu_hours": sum(hours.values()),
            "short_seconds": short_s,
            "causes": [{"cause": c, "runs": n, "gpu_hours": hours[c]} for c, n in causes.most_common()],
            "items": listed,
        }

    return ledger.read(tx)


# -- configurations -------------------------------------------------------------------------------


def _pick(run: RunRow, key: str) -> Any:
    hp = run.meta.get("hyperparameters") if isinstance(run.meta.get("hyperparameters"), dict) else {}
    value = run.meta.get(key, hp.get(key, run.labels.get(key)))
    if isinstance(value, dict):
        value = value.get("name") or value.get("source")
    return value


def configs(
    ledger: Ledger, start: float | None = None, end: float | None = None, progress: Progress = None
) -> list[dict[str, Any]]:
    """Succeeded runs with an mAP, grouped by (model, imgsz, batch, workers): runs, best mAP50-95, busy
    GPU-hours, and mAP points per busy GPU-hour (median over the runs), best value first."""

    def tx(conn: Connection) -> list[dict[str, Any]]:
        found = [r for r in runs_between(conn, start, end, (runs.c.status == "succeeded",))]
        ids = [r.id for r in found]
        m, g = metrics.c, gpu_intervals.c
        best: dict[str, float] = {}
        busy: dict[str, float] = {}
        for i, chunk in enumerate(_chunks(ids)):
            q = (
                sa.select(m.run_id, m.key, sa.func.max(m.value))
                .where(m.run_id.in_(chunk), m.key.in_(MAP_KEYS))
                .group_by(m.run_id, m.key)
            )
            for run_id, key, value in conn.execute(q):
                if value is not None and value == value and (run_id not in best or key == MAP_KEYS[0]):
                    best[run_id] = float(value)
            q2 = sa.select(g.run_id, sa.func.sum(g.busy_s)).where(g.run_id.in_(chunk)).group_by(g.run_id)
            busy.update({run_id: float(s) for run_id, s in conn.execute(q2) if s is not None})
            if progress is not None:
                progress(min(len(ids), (i + 1) * CHUNK), len(ids))
        groups: dict[tuple[Any, ...], list[RunRow]] = {}
        for r in found:
            if r.id in best:
                groups.setdefault(tuple(_pick(r, k) for k in ("model", "imgsz", "batch", "workers")), []).append(r)
        out = []
        for key, members in groups.items():
            values = [best[r.id] * 100 / (busy[r.id] / 3600) for r in members if busy.get(r.id)]
            out.append(
                {
                    "model": key[0],
                    "imgsz": key[1],
                    "batch": key[2],
                    "workers": key[3],
                    "runs": len(members),
                    "best_map": max(best[r.id] for r in members),
                    "busy_gpu_hours": sum(busy.get(r.id, 0.0) for r in members) / 3600,
                    "map_points_per_busy_gpu_hour": statistics.median(values) if values else None,
                    "run_ids": [r.id for r in members],
                }
            )
        out.sort(key=lambda r: -(r["map_points_per_busy_gpu_hour"] or -1.0))
        return out

    return ledger.read(tx)


# -- who used a GPU -------------------------------------------------------------------------------


def gpu_users(ledger: Ledger, uuid: str, start: float | None = None, end: float | None = None) -> list[dict[str, Any]]:
    """Runs that held GPU ``uuid`` (or a MIG slice of it) during [start, end), oldest first, with the
    busy GPU-hours on that GPU inside the range."""

    def tx(conn: Connection) -> list[dict[str, Any]]:
        d, g = devices.c, gpu_intervals.c
        held = conn.execute(
            sa.select(d.run_id, d.uuid, d.index, d.name).where(sa.or_(d.uuid == uuid, d.mig_parent_uuid == uuid))
        ).all()
        by_run: dict[str, list[Any]] = {}
        for row in held:
            by_run.setdefault(row.run_id, []).append(row)
        found = runs_between(conn, start, end, (runs.c.id.in_(list(by_run)),)) if by_run else []
        out = []
        for r in found:
            uuids = [row.uuid for row in by_run[r.id]]
            q = sa.select(sa.func.sum(g.busy_s)).where(g.run_id == r.id, g.device_uuid.in_(uuids))
            if start is not None:
                q = q.where(g.t1 > start)
            if end is not None:
                q = q.where(g.t0 < end)
            busy = conn.scalar(q)
            first = by_run[r.id][0]
            out.append(
                {
                    "id": r.id,
                    "name": r.name,
                    "user": r.user,
                    "team": r.team,
                    "project": r.project,
                    "host": r.host,
                    "status": r.status,
                    "started_at": r.started_at,
                    "ended_at": r.end,
                    "gpu_index": first.index,
                    "gpu_name": first.name,
                    "device_uuids": uuids,
                    "busy_gpu_hours": None if busy is None else float(busy) / 3600,
                }
            )
        return out

    return ledger.read(tx)
