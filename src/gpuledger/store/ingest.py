"""One agent push, written in one transaction: run upsert (audited), devices, intervals, events,
metrics, and the run's seal when it is finished.

Idempotent like the rest of the store: intervals are keyed by (run, device, seq) / (run, seq),
events and metrics by (run, seq) as numbered by the agent's local ledger; a resent batch inserts
nothing. The run's row is locked first (PostgreSQL: SELECT ... FOR UPDATE), so pushes of one run
from several replicas are serialised and the bulk path (store/bulk.py) can use COPY safely.

History is immutable (core/audit/run_rules.py): only the run's owner may push it (store/ownership.py),
its identity and devices never change, a finished run's record is final, GPUs belong to the host
that reported them first, and rows outside the run's span, dated in a closed month
(store/closed_months.py), of a GPU the run does not hold or overlapping their series
(store/series_rules.py) are refused one by one (``refused``).
A push that breaks a rule raises PushRefused; the attempt is audited in a transaction of its own.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gpuledger.core.audit import run_rules
from gpuledger.core.audit.run_rules import FINAL, Span, is_final
from gpuledger.core.model import RunRecord, run_is_open
from gpuledger.store import (
    audit,
    bulk,
    closed_months,
    codec,
    lineage,
    liveness_sweep,
    ownership,
    refusal_trail,
    rollup_stale,
    schema,
    series_day_sums,
    series_rules,
    series_segments,
    series_streams,
    writes,
)
from gpuledger.store.engine import Database
from gpuledger.store.ownership import HostRefused, PushRefused, Writer

__all__ = [
    "FINAL",
    "HostRefused",
    "IngestOutcome",
    "NotYours",
    "PushRefused",
    "RefusedRow",
    "Writer",
    "ingest",
    "set_log",
]


@dataclass(frozen=True)
class RefusedRow:
    """A row of the push that was not stored: its list, position in it, what it was, and why."""

    series: str  # gpu | host | events | metrics
    index: int
    item: str
    reason: str
    raw: Any = None  # the row as sent


@dataclass
class IngestOutcome:
    run_id: str
    created: bool = False
    gpu_intervals: int = 0
    host_intervals: int = 0
    events: int = 0
    metrics: int = 0
    dropped_rolled_up: int = 0
    sealed: bool = False
    refused: list[RefusedRow] = field(default_factory=list)


# live ingest (store/series_live.py): (run id, new GPU rows, new host rows), ledger rows without run_id
LiveWrite = Callable[[str, list[dict[str, Any]], list[dict[str, Any]]], object]


class NotYours(Exception):
    """The run exists but belongs to a project the writer may not write (answered as 404)."""


def _insert_numbered(db: Database, conn: Connection, table: sa.Table, run_id: str, rows: list[dict[str, Any]]) -> int:
    if not rows:
        return 0
    for r in rows:
        r["run_id"] = run_id
    ins = db.insert(table).on_conflict_do_nothing().returning(table.c.seq)
    return sum(len(conn.execute(ins.values(chunk)).all()) for chunk in _chunks(rows, 500))


def _chunks(rows: list[dict[str, Any]], n: int) -> list[list[dict[str, Any]]]:
    return [rows[i : i + n] for i in range(0, len(rows), n)]


def _audit_end(conn: Connection, actor: str, run_id: str, row: Mapping[str, Any]) -> None:
    info = {k: row[k] for k in ("status", "ended_at", "exit_code", "signal", "status_reason")}
    audit.append(conn, actor=actor, action="run.ended", obj=f"run:{run_id}", payload=info)


_STORE_ONLY = "_store_only"  # columns of the lock query only, never run fields
_MARKED = "_marked"


@functools.cache
def _lock_query(dialect: str) -> sa.Select[Any]:
    """The run's row (bound ``run``), locked on PostgreSQL, with whether it is series-only
    (store/series_segments.py) and whether retention left it rollup marks (store/bulk.py): a push
    reads the row anyway, so neither costs a round trip. Built once: building it costs more than
    running it."""
    r = schema.runs
    only = sa.exists().where(schema.series_only_runs.c.run_id == r.c.id).label(_STORE_ONLY)
    marked = sa.exists().where(schema.rollup_marks.c.run_id == r.c.id).label(_MARKED)
    q = sa.select(r, only, marked).where(r.c.id == sa.bindparam("run"))
    return q.with_for_update(of=r) if dialect == "postgresql" else q


def _lock_run(db: Database, conn: Connection, run_id: str) -> dict[str, Any] | None:
    """The run's row, locked, with the ``_STORE_ONLY`` and ``_MARKED`` flags (``_lock_query``)."""
    row = conn.execute(_lock_query(db.dialect), {"run": run_id}).mappings().first()
    return None if row is None else dict(row)


class _Upserted(NamedTuple):
    created: bool
    changed: bool
    row: dict[str, Any]  # the run's row now
    store_only: bool  # its raw rows live in the series store only (store/series_segments.py)
    marked: bool  # retention left it rollup marks (store/bulk.py)


def _upsert_run(
    db: Database,
    conn: Connection,
    run: RunRecord,
    writer: Writer,
    authorize: Callable[[str | None, str | None], None],
    new_devices: Sequence[Mapping[str, Any]],
    pushed: Sequence[tuple[float, float]],
    closed_before: float | None,
) -> _Upserted:
    """The run created or updated under its row lock.
    ``authorize(existing_project, new_project)`` raises to refuse; PushRefused for a push that
    breaks the rules of core/audit/run_rules.py. A run the liveness sweep took for lost that its
    agent pushes as running is revived first (store/liveness_sweep.py), in this transaction.
    ``pushed``: (t0, t1) of the push's intervals; ``closed_before``: no run may start before it."""
    existing = _lock_run(db, conn, run.id)
    new_row = codec.run_row(run)
    if existing is None:
        authorize(None, new_row["project"])
        if closed_before is not None and run.started_at < closed_before:
            raise PushRefused(
                f"run {run.id} started {closed_months.show(run.started_at)}, in a closed month (bills before "
                f"{closed_months.show(closed_before)} are final): a run of a closed month cannot be created"
            )
        ownership.check_gpus(conn, run.id, ownership.gpu_uuids(new_devices), writer, run.host)
        if writes.insert_run(db, conn, run):
            ownership.record_creator(conn, run.id, writer, run.host)
            info = {k: new_row[k] for k in ("project", "team", "user", "host", "name", "status", "started_at")}
            info |= {"owner": writer.user, "token": writer.token_id or None}
            audit.append(conn, actor=writer.actor, action="run.created", obj=f"run:{run.id}", payload=info)
            if is_final(run.status, run.ended_at):
                _audit_end(conn, writer.actor, run.id, new_row)
            return _Upserted(True, True, new_row, False, False)
        existing = _lock_run(db, conn, run.id)  # a concurrent push created it just now
        assert existing is not None
    store_only, marked = bool(existing.pop(_STORE_ONLY)), bool(existing.pop(_MARKED))
    if run.status == "running":  # the agent is alive: undo the liveness sweep's verdict, if any
        existing |= liveness_sweep.revive_locked(conn, run.id, existing, writer)
    authorize(existing["project"], new_row["project"])
    ownership.check_pusher(conn, run.id, writer, existing["host"])
    last = _last_row_t1(conn, existing, pushed) if existing["status"] == "lost" else None
    seen = existing["ended_at"] if existing.get("swept_at") is not None else None  # the sweep's, not the agent's
    verdict = run_rules.judge_record(run.id, existing, new_row, last, seen)
    if verdict.refusal:
        raise PushRefused(verdict.refusal)
    if not verdict.changes:
        return _Upserted(False, False, existing, store_only, marked)
    changes, old = dict(verdict.changes), dict(verdict.old)
    if existing.get("swept_at") is not None and "status" in changes:  # the owner's word replaces the sweep's
        changes["swept_at"], old["swept_at"] = None, existing["swept_at"]
    conn.execute(sa.update(schema.runs).where(schema.runs.c.id == run.id).values(changes))
    if "labels" in changes:
        writes.replace_labels(conn, run.id, changes["labels"])
    if "meta" in changes:
        lineage.sync(conn, run.id, changes["meta"])
    payload = {"old": old, "new": changes}
    audit.append(conn, actor=writer.actor, action="run.changed", obj=f"run:{run.id}", payload=payload)
    if verdict.ended_now:
        _audit_end(conn, writer.actor, run.id, new_row)
    return _Upserted(False, True, {**existing, **changes}, store_only, marked)


def _last_row_t1(conn: Connection, run: Mapping[str, Any], pushed: Sequence[tuple[float, float]]) -> float | None:
    """The end of a lost run's last interval: stored, or in this push within its span."""
    span = Span.of(run)
    ends = [t1 for t0, t1 in pushed if span.refusal(t0, t1) is None]
    for table in (schema.gpu_intervals, schema.host_intervals):
        stored = conn.scalar(sa.select(sa.func.max(table.c.t1)).where(table.c.run_id == run["id"]))
        if stored is not None:
            ends.append(float(stored))
    held = series_segments.last_t1(conn, str(run["id"]))  # a run whose rows only the series store holds
    if held is not None:
        ends.append(held)
    return max(ends) if ends else None


def _devices(
    db: Database, conn: Connection, run_row: Mapping[str, Any], devices: Sequence[Mapping[str, Any]], writer: Writer,
    created: bool,
) -> tuple[set[str], bool]:  # fmt: skip
    """Store the run's new devices (GPUs registered to its host) and refuse a changed one; the
    run's device UUIDs after the push, and whether any was new."""
    run_id = str(run_row["id"])
    d = schema.devices
    stored = {r["uuid"]: dict(r) for r in conn.execute(sa.select(d).where(d.c.run_id == run_id)).mappings()}
    new = []
    for dev in devices:
        known = stored.get(dev["uuid"])
        if known is not None:
            refusal = run_rules.device_refusal(run_id, known, dev)
            if refusal:
                raise PushRefused(refusal)
        else:
            new.append(dev)
    if new:
        if is_final(run_row["status"], run_row["ended_at"]) and not created:
            names = ", ".join(str(dv["uuid"]) for dv in new)
            raise PushRefused(f"run {run_id} has ended ({run_row['status']}): it gets no new GPUs ({names})")
        if not created:  # a new run's GPUs were checked before it was stored
            ownership.check_gpus(conn, run_id, ownership.gpu_uuids(new), writer, str(run_row["host"]))
        conn.execute(db.insert_new(d), [{**dv, "run_id": run_id} for dv in new])
    return set(stored) | {str(dv["uuid"]) for dv in new}, bool(new)


def _refuser(series: str, columns: Sequence[str], refused: list[RefusedRow]) -> series_rules.Refuse:
    seq_at = columns.index("seq")
    uuid_at = columns.index("device_uuid") if "device_uuid" in columns else None

    def refuse(i: int, r: Sequence[Any], why: str) -> None:
        item = f"seq {r[seq_at]}" if uuid_at is None else f"{r[uuid_at]} seq {r[seq_at]}"
        refused.append(RefusedRow(series, i, item, why, dict(zip(columns, r, strict=True))))

    return refuse


def _keep_intervals(
    conn: Connection, run_id: str, series: str, rows: Sequence[Sequence[Any]], columns: Sequence[str], span: Span,
    devices: set[str] | None, refused: list[RefusedRow], only: bool = False, *, marks: bulk.Marks | None = None,
    held: Any = None,
) -> list[Sequence[Any]]:  # fmt: skip
    """The rows inside the run's span that keep their series a timeline; the others are added to
    ``refused``. ``only``: a run whose rows only the series store holds: checked against the seq
    ranges it holds, and only the rows it lacks returned (store/series_segments.py). ``marks``:
    the run's rollup marks (bulk.run_marks). ``held``: extended by what the check read (the stored
    keys, series_rules.keep_timeline; with ``only`` the segments, series_segments.keep_new), for
    the writes that follow in this transaction."""
    t0_at, t1_at = columns.index("t0"), columns.index("t1")
    refuse = _refuser(series, columns, refused)
    items = []
    for i, r in enumerate(rows):
        why = span.refusal(float(r[t0_at]), float(r[t1_at]))
        if why is None:
            items.append((i, r))
        else:
            refuse(i, r, why)
    if only:
        kept = series_segments.keep_new(conn, run_id, series, items, columns, devices, refuse, held=held)
    else:
        marked = None if marks is None else marks.get(series, {})
        kept = series_rules.keep_timeline(
            conn, run_id, series, items, columns, devices, refuse, marks=marked, held=held
        )
    return [r for _, r in kept]


def _segments_read(
    conn: Connection, run_id: str, gpu: Sequence[Sequence[Any]], gpu_columns: Sequence[str], host: Sequence[Any]
) -> dict[str, list[series_segments.Segment]]:
    """A series-only run's segments of every stream the push names (its GPUs', its host's), one
    read for the checks of both series and the record after them."""
    uuid_at = gpu_columns.index("device_uuid")
    names = {str(r[uuid_at]) for r in gpu} | ({series_segments.HOST} if host else set())
    return series_segments.streams(conn, run_id, names)


def _keep_timed(series: str, items: Sequence[Mapping[str, Any]], span: Span, refused: list[RefusedRow]) -> list[dict]:  # type: ignore[type-arg]
    kept = []
    for i, item in enumerate(items):
        why = span.refusal(float(item["t"]), float(item["t"]))
        if why is None:
            kept.append(dict(item))
        else:
            refused.append(RefusedRow(series, i, f"seq {item.get('seq')}", why, dict(item)))
    return kept


def _times(row: Sequence[Any], columns: Sequence[str]) -> tuple[float, float]:
    return float(row[columns.index("t0")]), float(row[columns.index("t1")])


def _late_reason(out: IngestOutcome) -> str:
    added = [f"{n} {what}" for n, what in ((out.gpu_intervals, "GPU intervals"), (out.host_intervals, "host intervals"),
                                           (out.events, "events"), (out.metrics, "metrics")) if n]  # fmt: skip
    return "late push" + (f": {', '.join(added)} added" if added else ": the run record or its devices")


def ingest(
    db: Database,
    *,
    run: RunRecord,
    devices: Sequence[Mapping[str, Any]],
    gpu: Sequence[Sequence[Any]],
    host: Sequence[Sequence[Any]],
    gpu_columns: Sequence[str],
    host_columns: Sequence[str],
    events: Sequence[Mapping[str, Any]],
    metrics: Sequence[Mapping[str, Any]],
    final: bool,
    writer: Writer,
    authorize: Callable[[str | None, str | None], None],
    closed_before: float | None = None,
    live: LiveWrite | None = None,
    only: str | None = None,
    summary: Callable[[str], Mapping[str, Any]] | None = None,
    pushing: Callable[[], contextlib.AbstractContextManager[object]] | None = None,
    noted_at: float | None = None,
) -> IngestOutcome:
    """Store one push of ``writer``. Raises PushRefused (nothing stored; the attempt audited).
    ``closed_before``: the months before it are closed (store/closed_months.py; None: none is).
    ``live(run_id, gpu, host)``: PostgreSQL, the rows the ledger newly inserted (ledger rows
    without run_id), written to a series store before the push commits; what it raises rolls
    the push back (store/series_live.py). ``only`` (with ``live``): the store's URL as shown; a run
    this push creates keeps its raw rows in the store only (store/series_segments.py): the ledger
    keeps the seq ranges it holds, not the rows. Such a run stays so: a push of it without ``live``
    raises SeriesRequired, nothing stored. ``summary(run_id)``: what the store holds of such a run
    (``LiveSeries.summary``), recorded in the trail as the seal of its intervals when the run is
    sealed (``run.series_sealed``; ``audit verify --series`` compares the store with it).
    ``pushing()`` (``LiveSeries.pushing``): entered once the push holds its run's lock and left
    when its work in the transaction ends, so a group commit of the store waits for it while it
    may still write (store/series_batch.py). ``noted_at``: the push's time, noted as the run's last
    sign of life (``run_liveness``, store/liveness_sweep.py) in this transaction."""
    times = [_times(r, c) for rows, c in ((gpu, gpu_columns), (host, host_columns)) for r in rows]

    def tx(conn: Connection) -> IngestOutcome:
        with contextlib.ExitStack() as scope:
            return body(conn, scope)

    def body(conn: Connection, scope: contextlib.ExitStack) -> IngestOutcome:
        out = IngestOutcome(run.id)
        upserted = _upsert_run(db, conn, run, writer, authorize, devices, times, closed_before)
        if pushing is not None and (gpu or host):  # it holds its run's lock: on its way to the store
            scope.enter_context(pushing())
        out.created, changed, row, store_only, marked = upserted
        uuids, new_devices = _devices(db, conn, row, devices, writer, out.created)
        span = replace(Span.of(row), closed=closed_before)
        if out.created and only is not None and live is not None:
            series_segments.mark(conn, run.id, only)
            store_only = True
        if store_only and live is None:
            raise series_segments.SeriesRequired(
                f"run {run.id} keeps its intervals in the series store only, and this server writes none"
            )
        # read once for both series: the rollup marks (only where the lock query found some), and
        # what the checks read, which the writes below reuse instead of reading it again
        marks = bulk.run_marks(conn, run.id) if marked and not store_only else bulk.NO_MARKS
        held: Any = _segments_read(conn, run.id, gpu, gpu_columns, host) if store_only else set()
        keep = functools.partial(_keep_intervals, conn, run.id, refused=out.refused, only=store_only, held=held)
        gpu_in = keep("gpu", gpu, gpu_columns, span, uuids, marks=marks)
        host_in = keep("host", host, host_columns, span, None, marks=marks)
        events_in = _keep_timed("events", events, span, out.refused)
        metrics_in = _keep_timed("metrics", metrics, span, out.refused)
        new_gpu: list[Sequence[Any]] | None = [] if live is not None else None
        new_host: list[Sequence[Any]] | None = [] if live is not None else None
        if store_only:  # the new rows go to the store (below), their seq ranges to the ledger
            assert new_gpu is not None and new_host is not None
            new_gpu.extend(gpu_in)
            new_host.extend(host_in)
            parts = [("gpu", gpu_in, gpu_columns), ("host", host_in, host_columns)]
            series_segments.record_all(conn, run.id, parts, held)
            series_day_sums.add(conn, run.id, gpu_in, gpu_columns)  # what cost queries sum (materialise_rollups)
            series_streams.add(conn, run.id, gpu_in, gpu_columns, host_in, host_columns)  # CPU, throttle, gauges
            out.gpu_intervals, d1 = len(gpu_in), 0
        else:
            out.gpu_intervals, d1 = bulk.insert_intervals(
                db, conn, "gpu", run.id, gpu_in, gpu_columns, new_gpu, marks=marks["gpu"], held=held
            )
        if out.gpu_intervals:  # new rows only: a resent batch changes nothing
            at = [gpu_columns.index(c) for c in ("device_uuid", "t0", "t1")]
            spans = [(r[at[0]], r[at[1]], r[at[2]]) for r in gpu_in]
            finished = not run_is_open(row["status"], row["ended_at"])  # rollup_stale.run_finished, from the locked row
            rollup_stale.drop_after_append(conn, run.id, spans, finished=finished)
        elif new_devices or (changed and not out.created):
            # Only a change a rollup summed: devices sent again as stored, or rows all dropped as
            # rolled up (a late replay), leave the rollups standing.
            rollup_stale.drop_rollups(conn, [run.id])
        if store_only:
            out.host_intervals, d2 = len(host_in), 0
        else:
            out.host_intervals, d2 = bulk.insert_intervals(
                db, conn, "host", run.id, host_in, host_columns, new_host, marks=marks["host"], held=held
            )
        out.dropped_rolled_up = d1 + d2
        out.events = _insert_numbered(db, conn, schema.events, run.id, events_in)
        out.metrics = _insert_numbered(db, conn, schema.metrics, run.id, metrics_in)
        wrote = changed or any((out.gpu_intervals, out.host_intervals, out.events, out.metrics))
        ended = is_final(row["status"], row["ended_at"])
        sealing = ended and (final or (wrote and audit.latest_seal(conn, run.id) is not None))
        if sealing:
            reason = "final push" if final and audit.latest_seal(conn, run.id) is None else _late_reason(out)
            out.sealed = audit.seal_run(conn, run.id, actor=writer.actor, reason=reason) is not None
        if live is not None and (new_gpu or new_host):  # last: the store's write, then the commit
            live(run.id, _dicts(new_gpu, gpu_columns), _dicts(new_host, host_columns))
        if store_only and sealing and summary is not None:  # after the store's write: what it holds now
            out.sealed = series_segments.seal(conn, run.id, summary(run.id), actor=writer.actor) or out.sealed
        if noted_at is not None:
            liveness_sweep.note_push(conn, run.id, noted_at)
        return out

    if live is not None and db.dialect != "postgresql":
        raise ValueError("live ingest into a series store needs a PostgreSQL ledger (it knows which rows are new)")
    return _refusals_audited(db, run.id, writer, lambda: db.write(tx))


def _dicts(rows: Sequence[Sequence[Any]] | None, columns: Sequence[str]) -> list[dict[str, Any]]:
    return [dict(zip(columns, r, strict=True)) for r in rows or ()]


def _refusals_audited(db: Database, run_id: str, writer: Writer, attempt: Callable[[], Any]) -> Any:
    try:
        return attempt()
    except PushRefused as exc:
        # At most one push.refused row per token per minute, with the count it stands for.
        refusal_trail.refused(db, run_id=run_id, actor=writer.actor, token_id=writer.token_id, reason=str(exc))
        raise


def set_log(
    db: Database, *, run_id: str, data: bytes, truncated: bool, writer: Writer,
    authorize: Callable[[str | None], None],
) -> bool:  # fmt: skip
    """Store a run's log (audited, with its sha256); reseal the run when it is sealed. False if the
    run does not exist. The log of a sealed run that has one already cannot change (PushRefused)."""
    import hashlib

    digest = hashlib.sha256(data).hexdigest()

    def tx(conn: Connection) -> bool:
        row = conn.execute(
            sa.select(schema.runs.c.project, schema.runs.c.host).where(schema.runs.c.id == run_id)
        ).first()
        if row is None:
            return False
        authorize(row.project)
        ownership.check_pusher(conn, run_id, writer, str(row.host))
        stored = conn.scalar(sa.select(schema.logs.c.sha256).where(schema.logs.c.run_id == run_id))
        if stored == digest:
            return True  # sent again
        sealed = audit.latest_seal(conn, run_id) is not None
        if sealed and stored is not None:
            raise PushRefused(f"run {run_id} is sealed with its log (sha256 {stored[:12]}…): the log cannot change")
        writes.set_log(db, conn, run_id, data, truncated)
        payload = {"sha256": digest, "size_b": len(data), "truncated": truncated, "token": writer.token_id or None}
        audit.append(conn, actor=writer.actor, action="log.stored", obj=f"run:{run_id}", payload=payload)
        if sealed:
            audit.seal_run(conn, run_id, actor=writer.actor, reason="log stored")
        return True

    return bool(_refusals_audited(db, run_id, writer, lambda: db.write(tx)))
