"""Retention: raw intervals -> 1-minute -> 1-hour rollups, old logs, and (optionally) old runs.

Per finished run, one transaction each, audited:

1. the cost engine's per-day rollups are written first (``gpu_rollups``), so costs stay exact;
2. a run that ended more than ``raw_days`` ago has its intervals replaced by 1-minute intervals
   (core/metering/rollup.py: exact sums), after ``minute_days`` by 1-hour ones. No merged interval
   straddles an instant where reports cut figures by time (epoch boundaries, UTC midnights, the rate
   card's price changes, another run's start or end on the same GPU), and a GPU's intervals while
   another run shared it are kept as they are (the share split works interval by interval);
   ``rollup_marks`` remembers how far the raw seqs went, so a late replay of raw rows is dropped.
   A run without intervals is left as it is (nothing to roll up, nothing to audit). PostgreSQL with
   ``Policy.drop_partitions``: instead, whole day partitions older than ``raw_days`` are dropped
   under the same rules (store/retention_days.py), and nothing is rewritten;
3. logs of runs that ended more than ``log_days`` ago are deleted (their sha256 stays in the
   audit chain); runs older than ``run_days`` (off by default) are deleted whole;
4. the capacity ledger's raw intervals older than ``capacity_days`` are deleted, its day sums kept
   (store/capacity_retention.py: cut at a midnight, nothing a server has not acknowledged); with a
   series store (``tier``), copied into it and checked first (store/capacity_tier.py). PostgreSQL:
   whole day partitions are dropped instead (store/capacity_days_drop.py).

A run's rows are checked against its seal before they are rewritten: a tampered run is skipped
and reported, never laundered into a fresh seal, and so is a finished run nobody sealed (an admin
approves it with ``gpuledger audit seal``). Runs still recording, or lost by the server's verdict,
are left alone.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gpuledger.core.audit.seal import compare
from gpuledger.core.metering import rollup
from gpuledger.core.model import run_is_open
from gpuledger.core.pricing.usage import held_span
from gpuledger.core.training.epochs import BOUNDARY_KINDS
from gpuledger.store import audit, capacity_days_drop, codec, cost_queries, liveness_sweep, schema, writes
from gpuledger.store.capacity_retention import Pruned, prune_capacity
from gpuledger.store.retention_days import DayReport, drop_old_days
from gpuledger.store.series_tier import Tier
from gpuledger.store.series_window import WindowReport, keep_window

if TYPE_CHECKING:
    from gpuledger.store.ledger import Ledger

DAY_S = 86400.0


@dataclass(frozen=True)
class Policy:
    raw_days: float = 7.0
    minute_days: float = 90.0
    log_days: float | None = 90.0
    run_days: float | None = None
    capacity_days: float | None = 90.0
    # PostgreSQL: raw intervals older than raw_days go as whole day partitions (store/retention_days.py)
    # instead of being rewritten as 1-minute and 1-hour rollups (no DELETE, no vacuum). SQLite: ignored.
    drop_partitions: bool = False


@dataclass
class Report:
    rolled_up: dict[int, int] = field(default_factory=dict)  # level_s -> runs
    rows_before: int = 0
    rows_after: int = 0
    logs_deleted: int = 0
    runs_deleted: int = 0
    cost_rollups: dict[str, int] | None = None
    capacity: Pruned | None = None
    skipped: dict[str, str] = field(default_factory=dict)  # run id -> why
    days: DayReport | None = None  # PostgreSQL with drop_partitions: the day partitions dropped and kept
    series: WindowReport | None = None  # with a tier store: its days past its own window dropped


def _ended_before(conn: Connection, t: float) -> list[str]:
    r = schema.runs.c
    q = sa.select(r.id).where(r.status != "running", r.ended_at.is_not(None), r.ended_at < t).order_by(r.id)
    return list(conn.scalars(q))


def _level(conn: Connection, run_id: str) -> int:
    m = schema.rollup_marks.c
    return int(conn.scalar(sa.select(sa.func.min(m.level_s)).where(m.run_id == run_id)) or 0)


def _has_intervals(conn: Connection, run_id: str) -> bool:
    return any(
        conn.execute(sa.select(t.c.seq).where(t.c.run_id == run_id).limit(1)).first() is not None
        for t in (schema.gpu_intervals, schema.host_intervals)
    )


def _tampered(conn: Connection, run_id: str) -> list[str]:
    """Why the run's rows may not be rewritten: they differ from its seal, or nobody sealed them
    (only an admin approves those: gpuledger audit seal). [] when they may."""
    sealed = audit.latest_seal(conn, run_id)
    if sealed is None:
        r = schema.runs.c
        row = conn.execute(sa.select(r.status, r.swept_at).where(r.id == run_id)).first()
        if row is None or liveness_sweep.swept(row.status, row.swept_at):
            return ["lost by the server's verdict, not sealed yet (its agent may still report)"]
        return ["never sealed: approve it first with `gpuledger audit seal`"]
    found = audit.current_seal(conn, run_id)
    return [] if found is None else compare(sealed, found[0], found[1])


def _midnights(t0: float, t1: float) -> list[float]:
    """The UTC midnights strictly inside (t0, t1): where the reports split intervals into days."""
    first = math.floor(t0 / DAY_S) + 1
    return [d * DAY_S for d in range(first, math.ceil(t1 / DAY_S))]


def _shared_spans(conn: Connection, run_id: str) -> dict[str, list[tuple[float, float]]]:
    """Per GPU of the run: the held spans of the other runs that held it, found as the cost split
    finds them (store/cost_queries.tenants_of). Where one meets the run's intervals the GPU may have
    been shared: those intervals are kept as they are, and the spans' edges (the other runs' starts
    and ends) are cuts. An end is taken generously (the record's or the priced one, whichever is
    later; for a run still recording, never): a span kept too long only merges less."""
    others = [t for t in cost_queries.tenants_of(conn, [run_id], None, None) if t["run_id"] != run_id]
    last = cost_queries.last_interval_ends(conn, sorted({t["run_id"] for t in others}))
    out: dict[str, list[tuple[float, float]]] = {}
    for t in others:
        start, ended = t["started_at"], t["ended_at"]
        priced_end = held_span(t["status"], start, ended, last.get(t["run_id"]))[1]
        end = math.inf if run_is_open(t["status"], ended) else max(priced_end, start if ended is None else ended)
        out.setdefault(t["uuid"], []).append((start, end))
    return out


def _rollup_run(
    conn: Connection, run_id: str, level_s: int, actor: str, price_changes: Sequence[float] = ()
) -> tuple[int, int]:
    """Replace the run's intervals by ``level_s`` rollups; (rows before, rows after). Nothing is
    merged across an instant where a report later cuts figures by time: the run's epoch boundaries,
    UTC midnights, ``price_changes`` and, per GPU, the start and end of any other run on it; and
    the intervals of a GPU while another run shared it are kept as they are (core/metering/rollup.py)."""
    e = schema.events.c
    cuts = list(conn.scalars(sa.select(e.t).where(e.run_id == run_id, e.kind.in_(BOUNDARY_KINDS))))
    before = after = 0
    marks: list[dict[str, Any]] = []
    now = time.time()
    g = schema.gpu_intervals
    rows = [codec.gpu_from_row(r) for r in conn.execute(sa.select(g).where(g.c.run_id == run_id)).mappings()]
    h = schema.host_intervals
    hosts = [codec.host_from_row(r) for r in conn.execute(sa.select(h).where(h.c.run_id == run_id)).mappings()]
    everything = [*rows, *hosts]
    if everything:
        t0, t1 = min(iv.t0 for iv in everything), max(iv.t1 for iv in everything)
        cuts += _midnights(t0, t1) + [c for c in price_changes if t0 < c < t1]
    by_device: dict[str, list[Any]] = {}
    for iv in rows:
        by_device.setdefault(iv.device_uuid, []).append(iv)
    shared = _shared_spans(conn, run_id) if by_device else {}
    old_marks = {
        (m.series, m.device_uuid): m.upto_seq
        for m in conn.execute(sa.select(schema.rollup_marks).where(schema.rollup_marks.c.run_id == run_id))
    }
    new_rows: list[dict[str, Any]] = []
    for uuid, ivs in by_device.items():
        merged = rollup.rollup_gpu(ivs, level_s, cuts, keep=shared.get(uuid, ()))
        new_rows += [codec.to_row(m, run_id=run_id) for m in merged]
        upto = max([iv.seq for iv in ivs] + [old_marks.get(("gpu", uuid), -1)])
        marks.append(_mark(run_id, "gpu", uuid, level_s, upto, len(ivs), len(merged), now))
        before, after = before + len(ivs), after + len(merged)
    conn.execute(sa.delete(g).where(g.c.run_id == run_id))
    if new_rows:
        conn.execute(sa.insert(g), new_rows)
    if hosts:
        merged_h = rollup.rollup_host(hosts, level_s, cuts)
        conn.execute(sa.delete(h).where(h.c.run_id == run_id))
        conn.execute(sa.insert(h), [codec.to_row(m, run_id=run_id) for m in merged_h])
        upto = max([iv.seq for iv in hosts] + [old_marks.get(("host", ""), -1)])
        marks.append(_mark(run_id, "host", "", level_s, upto, len(hosts), len(merged_h), now))
        before, after = before + len(hosts), after + len(merged_h)
    conn.execute(sa.delete(schema.rollup_marks).where(schema.rollup_marks.c.run_id == run_id))
    if marks:
        conn.execute(sa.insert(schema.rollup_marks), marks)
    return before, after


def _mark(
    run_id: str, series: str, uuid: str, level_s: int, upto: int, n_in: int, n_out: int, at: float
) -> dict[str, Any]:
    return {
        "run_id": run_id, "series": series, "device_uuid": uuid, "level_s": level_s, "upto_seq": upto,
        "rows_before": n_in, "rows_after": n_out, "at": at,
    }  # fmt: skip


def _step(
    ledger: Ledger, run_id: str, level_s: int, actor: str, report: Report, price_changes: Sequence[float]
) -> None:
    def tx(conn: Connection) -> None:
        if _level(conn, run_id) >= level_s:
            return
        problems = _tampered(conn, run_id)
        if problems:
            first = problems[0]
            if first.startswith("lost by the server"):
                return  # not final yet: left alone, like a running run
            sealed = not first.startswith("never sealed")
            report.skipped[run_id] = "does not match its seal: " + "; ".join(problems[:3]) if sealed else first
            return
        if not _has_intervals(conn, run_id):
            return  # nothing to roll up, nothing to audit; left unmarked, so raw rows that come later count
        n_in, n_out = _rollup_run(conn, run_id, level_s, actor, price_changes)
        payload = {"level_s": level_s, "rows_before": n_in, "rows_after": n_out}
        audit.append(conn, actor=actor, action="run.rolled_up", obj=f"run:{run_id}", payload=payload)
        audit.seal_run(conn, run_id, actor=actor, reason=f"rolled up to {level_s} s intervals")
        report.rolled_up[level_s] = report.rolled_up.get(level_s, 0) + 1
        report.rows_before += n_in
        report.rows_after += n_out

    ledger.write(tx)


def _delete_log(ledger: Ledger, run_id: str, actor: str, report: Report) -> None:
    def tx(conn: Connection) -> None:
        lg = schema.logs.c
        row = conn.execute(sa.select(lg.sha256, lg.size_b).where(lg.run_id == run_id)).first()
        if row is None or _tampered(conn, run_id):
            return
        conn.execute(sa.delete(schema.logs).where(lg.run_id == run_id))
        payload = {"sha256": row.sha256, "size_b": row.size_b, "reason": "retention"}
        audit.append(conn, actor=actor, action="log.deleted", obj=f"run:{run_id}", payload=payload)
        audit.seal_run(conn, run_id, actor=actor, reason="log deleted by retention")
        report.logs_deleted += 1

    ledger.write(tx)


def _delete_run(ledger: Ledger, run_id: str, actor: str, report: Report) -> None:
    def tx(conn: Connection) -> None:
        found = audit.current_seal(conn, run_id)
        if found is None or _tampered(conn, run_id):
            return
        writes.delete_run(conn, run_id)
        payload = {"reason": "retention", "seal": found[0]}
        audit.append(conn, actor=actor, action="run.deleted", obj=f"run:{run_id}", payload=payload)
        report.runs_deleted += 1

    ledger.write(tx)


def run_retention(
    ledger: Ledger,
    policy: Policy,
    *,
    actor: str,
    now: float | None = None,
    cost_rollups: Callable[[Ledger], dict[str, int]] | None = None,
    price_changes: Sequence[float] = (),
    tier: Tier | None = None,
) -> Report:
    """Apply ``policy`` to every finished run; ``cost_rollups`` writes the cost engine's day
    rollups first (reports/cost/rollups.materialise_rollups when installed). ``price_changes``:
    the instants the rate card's prices change (RateCard.change_points), which no rolled-up
    interval straddles, so reports priced with that card cut busy time there exactly. ``tier``: the
    series store each dropped day is first copied into (store/series_tier.py), whose own days past
    ``tier.series_days`` are then dropped (store/series_window.py)."""
    price_changes = sorted(price_changes)
    now = time.time() if now is None else now
    report = Report()
    if cost_rollups is not None:
        report.cost_rollups = cost_rollups(ledger)
    read = ledger.database.read
    if policy.drop_partitions and ledger.dialect == "postgresql":
        report.days = drop_old_days(ledger, now - policy.raw_days * DAY_S, actor=actor, tampered=_tampered, tier=tier)
        if tier is not None:  # the store's own window (tier.series_days), and its maintenance
            report.series = keep_window(ledger, tier, actor=actor, now=now)
    else:
        for level_s, days in ((60, policy.raw_days), (3600, policy.minute_days)):
            for run_id in read(lambda c, t=now - days * DAY_S: _ended_before(c, t)):
                _step(ledger, run_id, level_s, actor, report, price_changes)
    if policy.log_days is not None:
        lg = schema.logs.c
        with_logs = set(read(lambda c: list(c.scalars(sa.select(lg.run_id)))))
        for run_id in read(lambda c: _ended_before(c, now - policy.log_days * DAY_S)):  # type: ignore[operator]
            if run_id in with_logs:
                _delete_log(ledger, run_id, actor, report)
    if policy.run_days is not None:
        for run_id in read(lambda c: _ended_before(c, now - policy.run_days * DAY_S)):  # type: ignore[operator]
            _delete_run(ledger, run_id, actor, report)
    if policy.capacity_days is not None:
        before_ms = int((now - policy.capacity_days * DAY_S) * 1000)
        if capacity_days_drop.partitioned(ledger):  # PostgreSQL: whole days, no DELETE
            report.capacity = capacity_days_drop.drop_days(ledger, before_ms, tier, actor=actor, now=now)
        else:
            report.capacity = prune_capacity(ledger, before_ms, tier, actor=actor, now=now)
    summary = {
        "policy": policy.__dict__,
        "rolled_up": {str(k): v for k, v in report.rolled_up.items()},
        "rows_before": report.rows_before,
        "rows_after": report.rows_after,
        "logs_deleted": report.logs_deleted,
        "runs_deleted": report.runs_deleted,
        "skipped": report.skipped,
        "capacity": None if report.capacity is None else report.capacity.__dict__,
    }
    if report.days is not None:
        summary["raw_days_dropped"] = report.days.dropped
        summary["raw_days_kept"] = report.days.kept
    if report.series is not None:
        summary["series_days_dropped"] = report.series.dropped
    ledger.write(lambda c: audit.append(c, actor=actor, action="retention.run", obj="retention", payload=summary))
    return report
