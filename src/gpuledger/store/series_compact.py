"""``gpuledger db migrate --layout compact --series URL`` (docs/SCALE.md, step 7): an existing
PostgreSQL team ledger moved run by run to the layout ``serve --series-only`` writes, where a run's
raw intervals live in the series store only (store/series_segments.py).

Each run, in one ledger transaction holding the run's row lock (a late push of the run waits, then
finds it moved and goes to the store, store/ingest.py):

1. the run must have ended and may move (series_compact_check.why_not); a run still recording is
   skipped, named, and moved by a later call once it has ended;
2. its GPU and host rows are copied into the store, only those the store lacks (written live by
   ``serve --series-live``, or by an earlier call cut short), in batches whose token names their
   rows (``compact:`` + series_live.batch_token), so a call cut short and run again stores nothing
   twice;
3. what the store holds of the run is read back and checked against the ledger's rows (and its
   tiered days' entries); a run the store does not hold exactly stays as it was;
4. its ``series_segments``, ``series_day_sums`` and ``series_streams`` are written from its ledger
   rows as its pushes would have written them in the series-only mode (a day the ledger dropped
   after tiering it adds to the segments and streams from the store's rows, not to the day sums:
   its busy and energy stay in its ``run.raw_tiered`` entries and frozen rollups, where the
   readers take them), the store's seal recorded (``run.series_sealed``), the raw rows deleted,
   the run listed in ``series_only_runs``, ``run.compacted`` appended and the run resealed over
   what the ledger now keeps, so ``audit verify`` (and with ``--series``, the store) passes after.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gpuledger.core.model import run_is_open
from gpuledger.store import audit, schema, series_day_sums, series_live, series_segments, series_streams, series_tier
from gpuledger.store.series_compact_check import CompactError, check, dropped_parts, why_not

if TYPE_CHECKING:
    from gpuledger.store.ledger import Ledger

ACTION = "run.compacted"
BATCH_ROWS = 50_000  # rows per store write
GPU_COLUMNS, HOST_COLUMNS = series_tier.GPU_COLUMNS, series_tier.HOST_COLUMNS
_SEGMENT_COLUMNS = ("device_uuid", "seq", "t0", "t1")
_DAY_SUM_COLUMNS = ("device_uuid", "t0", "t1", *series_day_sums.SUMMED)
_STREAM_GPU = ("device_uuid", "seq", "throttle_s", *series_streams.GAUGES)
_STREAM_HOST = ("seq", "cpu_s")

Row = dict[str, Any]


@dataclass
class Compacted:
    moved: dict[str, int] = field(default_factory=dict)  # run -> rows moved (dry run: to move)
    done: list[str] = field(default_factory=list)  # runs in the compact layout already
    kept: dict[str, str] = field(default_factory=dict)  # run -> why it stays as it is for now
    failed: dict[str, str] = field(default_factory=dict)  # run -> what the store's check found


@dataclass
class _Outcome:
    rows: int = 0
    done: bool = False
    kept: str | None = None
    failed: str | None = None


def candidates(ledger: Ledger) -> list[str]:
    """Runs with raw rows in the ledger or moved already, oldest first (the primary keys of the
    interval tables lead with run_id: one probe per run, no scan)."""
    r, g, h, m = schema.runs.c, schema.gpu_intervals.c, schema.host_intervals.c, schema.series_only_runs.c
    held = sa.or_(
        sa.exists().where(g.run_id == r.id),
        sa.exists().where(h.run_id == r.id),
        sa.exists().where(m.run_id == r.id),
    )
    q = sa.select(r.id).where(held).order_by(r.started_at, r.id)
    return ledger.read(lambda conn: list(conn.scalars(q)))


def _rows(conn: Connection, run_id: str) -> tuple[list[Row], list[Row]]:
    """The run's GPU rows in (device, seq) order and host rows in seq order, without run_id."""
    g, h = schema.gpu_intervals, schema.host_intervals
    gq = sa.select(*(g.c[c] for c in GPU_COLUMNS)).where(g.c.run_id == run_id).order_by(g.c.device_uuid, g.c.seq)
    hq = sa.select(*(h.c[c] for c in HOST_COLUMNS)).where(h.c.run_id == run_id).order_by(h.c.seq)
    return [dict(r) for r in conn.execute(gq).mappings()], [dict(r) for r in conn.execute(hq).mappings()]


def _batches(gpu: Sequence[Row], host: Sequence[Row]) -> Iterator[tuple[Sequence[Row], Sequence[Row]]]:
    for i in range(0, len(gpu), BATCH_ROWS):
        yield gpu[i : i + BATCH_ROWS], []
    for i in range(0, len(host), BATCH_ROWS):
        yield [], host[i : i + BATCH_ROWS]


def copy_rows(tier: series_tier.Tier, run_id: str, gpu: Sequence[Row], host: Sequence[Row]) -> int:
    """Write the rows the store lacks; the rows it stored. A batch's token names its rows, so the
    same batch sent again (a call cut short after the store took it) stores nothing twice."""
    gpu, host = series_live.lacking(tier.store, run_id, gpu, host)  # ClickHouse: held rows' rollups repaired
    written = 0
    for g, h in _batches(gpu, host):
        written += tier.store.write(run_id, g, h, token="compact:" + series_live.batch_token(run_id, g, h))
    return written


def _stored(tier: series_tier.Tier, run_id: str) -> tuple[list[Row], list[Row]]:
    gpu = sorted(tier.store.gpu_intervals(run_id), key=lambda r: (str(r["device_uuid"]), int(r["seq"])))
    return gpu, sorted(tier.store.host_intervals(run_id), key=lambda r: int(r["seq"]))


def _streams(
    conn: Connection, run_id: str, gpu: Sequence[Row], host: Sequence[Row], sg: list[Row], sh: list[Row]
) -> None:
    """Segments and stream sums (CPU, throttle, last-row gauges: store/series_streams.py) over
    every row the store holds: the ledger's own rows where it held them (a push would have
    recorded those), the store's for rows of days the ledger dropped."""
    held_gpu = {(str(r["device_uuid"]), int(r["seq"])) for r in gpu}
    held_host = {int(r["seq"]) for r in host}
    g_rows = [*gpu, *(r for r in sg if (str(r["device_uuid"]), int(r["seq"])) not in held_gpu)]
    h_rows = [*host, *(r for r in sh if int(r["seq"]) not in held_host)]
    series_streams.add(conn, run_id, [[r[c] for c in _STREAM_GPU] for r in g_rows], _STREAM_GPU,
                       [[r[c] for c in _STREAM_HOST] for r in h_rows], _STREAM_HOST)  # fmt: skip
    series_segments.record(conn, run_id, "gpu", [[r[c] for c in _SEGMENT_COLUMNS] for r in g_rows], _SEGMENT_COLUMNS)
    series_segments.record(conn, run_id, "host", [[r[c] for c in _SEGMENT_COLUMNS[1:]] for r in h_rows],
                           _SEGMENT_COLUMNS[1:])  # fmt: skip


def _switch(conn: Connection, tier: series_tier.Tier, run_id: str, dry_run: bool, actor: str,
            tampered: Callable[[Connection, str], list[str]]) -> _Outcome:  # fmt: skip
    r = schema.runs.c
    row = conn.execute(sa.select(r.status, r.ended_at).where(r.id == run_id).with_for_update()).first()
    if row is None:
        return _Outcome(kept="deleted meanwhile")
    if series_segments.is_marked(conn, run_id):
        return _Outcome(done=True)
    if run_is_open(row.status, row.ended_at):
        return _Outcome(kept="still recording: moved by a later call once it has ended")
    why = why_not(conn, run_id, tier.url) or "; ".join(tampered(conn, run_id)[:3])
    if why:
        return _Outcome(kept=why)
    gpu, host = _rows(conn, run_id)
    if dry_run:
        return _Outcome(rows=len(gpu) + len(host))
    written = copy_rows(tier, run_id, gpu, host)
    stored_gpu, stored_host = _stored(tier, run_id)
    try:
        sealed = check(run_id, gpu, host, stored_gpu, stored_host, dropped_parts(conn, run_id, tier.url))
    except CompactError as exc:
        return _Outcome(failed=str(exc))
    _streams(conn, run_id, gpu, host, stored_gpu, stored_host)
    sums = series_day_sums.add(conn, run_id, [[g[c] for c in _DAY_SUM_COLUMNS] for g in gpu], _DAY_SUM_COLUMNS)
    conn.execute(sa.delete(schema.gpu_intervals).where(schema.gpu_intervals.c.run_id == run_id))
    conn.execute(sa.delete(schema.host_intervals).where(schema.host_intervals.c.run_id == run_id))
    series_segments.mark(conn, run_id, tier.url)
    # the trail last: its appends serialise every writer until this commits
    series_segments.seal(conn, run_id, {"series": tier.url, **sealed}, actor=actor)
    payload = {"series": tier.url, "gpu_rows": len(gpu), "host_rows": len(host), "written": written, "day_sums": sums}
    audit.append(conn, actor=actor, action=ACTION, obj=f"run:{run_id}", payload=payload)
    audit.seal_run(conn, run_id, actor=actor, reason=f"raw intervals moved into the series store {tier.url}")
    return _Outcome(rows=len(gpu) + len(host))


def compact(
    ledger: Ledger, tier: series_tier.Tier, *, actor: str, tampered: Callable[[Connection, str], list[str]],
    dry_run: bool = False, progress: Callable[[str], None] = lambda line: None,
) -> Compacted:  # fmt: skip
    """Move every ended run's raw intervals into ``tier``'s store, checked; one transaction per run."""
    if ledger.dialect != "postgresql":
        raise ValueError("the compact layout is a PostgreSQL ledger's: a SQLite ledger keeps its rows")
    out = Compacted()
    runs = candidates(ledger)
    for i, run_id in enumerate(runs, 1):
        got = ledger.write(lambda c, rid=run_id: _switch(c, tier, rid, dry_run, actor, tampered))  # type: ignore[misc]
        head = f"[{i}/{len(runs)}] run {run_id}"
        if got.done:
            out.done.append(run_id)
            progress(f"{head}: in the compact layout already")
        elif got.kept is not None:
            out.kept[run_id] = got.kept
            progress(f"{head}: kept in PostgreSQL for now: {got.kept}")
        elif got.failed is not None:
            out.failed[run_id] = got.failed
            progress(f"{head}: NOT moved, the series store does not hold its rows exactly: {got.failed}")
        else:
            out.moved[run_id] = got.rows
            progress(f"{head}: {'would move' if dry_run else 'moved and checked'} {got.rows} rows")
    return out
