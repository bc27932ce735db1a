"""``gpuledger db migrate --layout compact --series URL`` (docs/SCALE.md, step 7): an existing
PostgreSQL team ledger moved run by run to the layout ``serve --series-only`` writes, where a run's
raw intervals live in the series store only (store/series_segments.py).

The runs it takes: those with raw rows in the ledger, and those retention tiered and dropped
(rollup marks at the dropped level), down to a run none of whose rows the ledger holds any more:
the store holds them all, and the run moves as the others do, checked against its ``run.raw_tiered``
entries alone. Each run, in one ledger transaction holding the run's row lock (a late push of the
run waits, then finds it moved and goes to the store, store/ingest.py):

1. the run must have ended and may move (series_compact_check.why_not, and its rows must match its
   seal, checked a page at a time: series_compact_seal.py); a run still recording is skipped,
   named, and moved by a later call once it has ended;
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

No step holds a whole run: the ledger and the store are read in keyset pages of BATCH_ROWS rows
(series_compact_read.py), the check merges the two by seq with running summaries
(series_compact_check.Check), and segments and stream sums are written a page at a time (the day
sums, added up row by row in Python, once at the end), so a 72-hour run of 8 GPUs at 1 s takes
what a few pages take, not its 2 GB. A check that fails rolls all of it back with the transaction.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gpuledger.core.model import run_is_open
from gpuledger.store import (
    audit,
    schema,
    series_compact_seal,
    series_day_sums,
    series_live,
    series_segments,
    series_streams,
    series_tier,
)
from gpuledger.store import series_compact_read as pages
from gpuledger.store.partitions import DROPPED_LEVEL
from gpuledger.store.series_compact_check import Check, CompactError, dropped_parts, why_not

if TYPE_CHECKING:
    from gpuledger.store.ledger import Ledger

ACTION = "run.compacted"
BATCH_ROWS = 10_000  # rows per page read (ledger, store), store write and write of segments and stream sums
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
    tiered: int = 0  # rows of days the ledger dropped, checked in the store
    done: bool = False
    kept: str | None = None
    failed: str | None = None


def candidates(ledger: Ledger) -> list[str]:
    """Runs with raw rows in the ledger, raw days retention dropped (tiered first, or why_not says
    why not), or moved already, oldest first. A run all of whose days were tiered and dropped has
    no row left but its rollup marks at the dropped level. The primary keys of these tables lead
    with run_id: one probe per run, no scan."""
    r, g, h, m = schema.runs.c, schema.gpu_intervals.c, schema.host_intervals.c, schema.series_only_runs.c
    k = schema.rollup_marks.c
    held = sa.or_(
        sa.exists().where(g.run_id == r.id),
        sa.exists().where(h.run_id == r.id),
        sa.exists().where(k.run_id == r.id, k.level_s == DROPPED_LEVEL),
        sa.exists().where(m.run_id == r.id),
    )
    q = sa.select(r.id).where(held).order_by(r.started_at, r.id)
    return ledger.read(lambda conn: list(conn.scalars(q)))


def _batches(gpu: Sequence[Row], host: Sequence[Row]) -> Iterator[tuple[Sequence[Row], Sequence[Row]]]:
    for i in range(0, len(gpu), BATCH_ROWS):
        yield gpu[i : i + BATCH_ROWS], []
    for i in range(0, len(host), BATCH_ROWS):
        yield [], host[i : i + BATCH_ROWS]


def copy_rows(tier: series_tier.Tier, run_id: str, gpu: Sequence[Row], host: Sequence[Row]) -> int:
    """Write the rows (a few pages of the run) the store lacks; the rows it stored. A batch's token
    names its rows, so the same batch sent again (a call cut short after the store took it)
    stores nothing twice."""
    gpu, host = series_live.lacking(tier.store, run_id, gpu, host, page=BATCH_ROWS)
    written = 0
    for g, h in _batches(gpu, host):
        written += tier.store.write(run_id, g, h, token="compact:" + series_live.batch_token(run_id, g, h))
    return written


def _copy(conn: Connection, tier: series_tier.Tier, run_id: str, devices: Sequence[str]) -> tuple[int, int, int]:
    """Copy the run's ledger rows the store lacks, BATCH_ROWS at a time (a store write takes the
    GPU rows of several short streams at once): (rows written, GPU rows, host rows)."""
    written, counts = 0, [0, 0]
    for host, streams in ((False, [pages.ledger_gpu_pages(conn, run_id, d, BATCH_ROWS) for d in devices]),
                          (True, [pages.ledger_host_pages(conn, run_id, BATCH_ROWS)])):  # fmt: skip
        pending: list[Row] = []
        for page in (page for stream in streams for page in stream):
            counts[host] += len(page)
            pending += page
            if len(pending) >= BATCH_ROWS:
                written += copy_rows(tier, run_id, [] if host else pending, pending if host else [])
                pending = []
        if pending:
            written += copy_rows(tier, run_id, [] if host else pending, pending if host else [])
    return written, counts[0], counts[1]


class _Derived:
    """What the migration writes of the rows the check reads (series_compact_check.Check's
    ``derive``): segments and stream sums (CPU, throttle, last-row gauges: series_streams.py) of
    every row the store holds, the ledger's own rows where it held them (a push would have recorded
    those), the store's for rows of days the ledger dropped; day sums of the ledger's rows, summed
    in Python row by row (as one call over all of them would) and written once at the end."""

    def __init__(self, conn: Connection, run_id: str) -> None:
        self.conn, self.run_id = conn, run_id
        self.day_sums: series_day_sums.DaySums = {}

    def gpu(self, ledger: list[Row], stored: list[Row]) -> None:
        rows = [*ledger, *stored]
        if not rows:
            return
        series_streams.add(
            self.conn, self.run_id, [[r[c] for c in _STREAM_GPU] for r in rows], _STREAM_GPU, [], _STREAM_HOST
        )
        series_segments.record(
            self.conn, self.run_id, "gpu", [[r[c] for c in _SEGMENT_COLUMNS] for r in rows], _SEGMENT_COLUMNS
        )
        series_day_sums.fold(
            self.day_sums, self.run_id, [[r[c] for c in _DAY_SUM_COLUMNS] for r in ledger], _DAY_SUM_COLUMNS
        )

    def host(self, ledger: list[Row], stored: list[Row]) -> None:
        rows = [*ledger, *stored]
        if not rows:
            return
        series_streams.add(
            self.conn, self.run_id, [], _STREAM_GPU, [[r[c] for c in _STREAM_HOST] for r in rows], _STREAM_HOST
        )
        series_segments.record(self.conn, self.run_id, "host", [[r[c] for c in _SEGMENT_COLUMNS[1:]] for r in rows],
                               _SEGMENT_COLUMNS[1:])  # fmt: skip


def _check(conn: Connection, tier: series_tier.Tier, run_id: str, devices: Sequence[str]) -> tuple[dict[str, Any], int]:
    """Read back what the store holds of the run, a stream and a page at a time, against the ledger's
    rows and the dropped tiered days, writing segments, stream sums and day sums as it goes:
    (the seal, the day sums written); CompactError (the caller rolls them back) when it differs."""
    derived = _Derived(conn, run_id)
    check = Check(run_id, dropped_parts(conn, run_id, tier.url), BATCH_ROWS)
    for uuid in sorted({*devices, *tier.store.gpu_devices(run_id)}):
        ledger = pages.ledger_gpu_pages(conn, run_id, uuid, BATCH_ROWS)
        stored = pages.store_gpu_pages(tier.store, run_id, uuid, BATCH_ROWS)
        check.stream(uuid, ledger, stored, derived.gpu)
    ledger, stored = (
        pages.ledger_host_pages(conn, run_id, BATCH_ROWS),
        pages.store_host_pages(tier.store, run_id, BATCH_ROWS),
    )
    check.stream(series_segments.HOST, ledger, stored, derived.host)
    sealed = check.result()
    # ClickHouse: chargeback reads the rollups its views wrote after the raw rows; a run whose
    # rollups a killed write left short (and no repair reached) does not move until they are whole.
    gpus = {k: v for k, v in check.streams.items() if k != series_segments.HOST}
    days = sorted({day for stream in gpus.values() for day in stream.days})
    short = [line for day in days for line in series_tier.rollup_differences(tier.store, run_id, {"gpu": gpus}, day)]
    if short:
        raise CompactError("; ".join(short))
    return sealed, series_day_sums.write(conn, list(derived.day_sums.values()))


class _Failed(Exception):
    """The store's check found a difference: the run's transaction is rolled back."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


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
    # the seal checked a page at a time; retention's check (the run whole) only names what changed
    same = series_compact_seal.unchanged(conn, run_id, BATCH_ROWS)
    why = why_not(conn, run_id, tier.url) or ("" if same else "; ".join(tampered(conn, run_id)[:3]))
    if why:
        return _Outcome(kept=why)
    if dry_run:
        return _Outcome(rows=sum(pages.ledger_counts(conn, run_id)))
    devices = pages.ledger_devices(conn, run_id)
    written, gpu_rows, host_rows = _copy(conn, tier, run_id, devices)
    try:
        sealed, sums = _check(conn, tier, run_id, devices)
    except CompactError as exc:
        raise _Failed(str(exc)) from exc
    conn.execute(sa.delete(schema.gpu_intervals).where(schema.gpu_intervals.c.run_id == run_id))
    conn.execute(sa.delete(schema.host_intervals).where(schema.host_intervals.c.run_id == run_id))
    series_segments.mark(conn, run_id, tier.url)
    # the trail last: its appends serialise every writer until this commits
    series_segments.seal(conn, run_id, {"series": tier.url, **sealed}, actor=actor)
    tiered = sealed["gpu_rows"] + sealed["host_rows"] - gpu_rows - host_rows
    payload = {
        "series": tier.url, "gpu_rows": gpu_rows, "host_rows": host_rows, "tiered_rows": tiered, "written": written,
        "day_sums": sums,
    }  # fmt: skip
    audit.append(conn, actor=actor, action=ACTION, obj=f"run:{run_id}", payload=payload)
    audit.seal_run(conn, run_id, actor=actor, reason=f"raw intervals moved into the series store {tier.url}")
    return _Outcome(rows=gpu_rows + host_rows, tiered=tiered)


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
        try:
            got = ledger.write(lambda c, rid=run_id: _switch(c, tier, rid, dry_run, actor, tampered))  # type: ignore[misc]
        except _Failed as exc:  # what it wrote of the run rolled back with the transaction
            got = _Outcome(failed=exc.why)
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
            tiered = f" and {got.tiered} rows of its dropped days the store held" if got.tiered else ""
            progress(f"{head}: {'would move' if dry_run else 'moved and checked'} {got.rows} rows{tiered}")
    return out
