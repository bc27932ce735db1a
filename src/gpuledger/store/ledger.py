"""The ledger: the one place gpuledger's records are written to and read from SQL.

``Ledger(url)`` works on SQLite (a local file, zero set-up, several writers at once) and PostgreSQL
(a team server). It takes and returns the dataclasses of ``core/model.py``; times are epoch seconds.
Every write is one short transaction, idempotent where a record has a natural key, so callers may
simply resend a batch after an error.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from gpuledger.core.model import Event, GpuIdentity, GpuInterval, HostInterval, Metric, RunRecord
from gpuledger.store import (
    codec,
    flush,
    lineage,
    log_codec,
    migrations,
    ownership,
    queries,
    rollup_stale,
    run_rollup,
    schema,
    writes,
)
from gpuledger.store.engine import Database
from gpuledger.store.errors import AmbiguousRun, RunNotFound
from gpuledger.store.series_read import TieredReads
from gpuledger.store.url import default_url

if TYPE_CHECKING:
    from gpuledger.series.base import SeriesStore

T = TypeVar("T")

MIN_PREFIX = 4
_HEX_REF = re.compile(r"[0-9A-Fa-f-]+")  # a run id or a prefix of one (not a short id, not another source's id)
_MAX_CANDIDATES = 10


class Ledger:
    """Runs, their devices, intervals, events, metrics and logs in one SQL database.

    ``url``: any SQLAlchemy URL or a bare file path (SQLite); None means ``default_url()``.
    ``migrate``: apply pending schema migrations on open; with False, an outdated schema raises
    SchemaOutdated (servers that must not migrate implicitly).
    ``busy_timeout_s``: how long a SQLite writer waits for the lock before retrying; after the
    retries a write raises LedgerLocked and the caller keeps its data for later.
    """

    def __init__(
        self,
        url: str | os.PathLike[str] | None = None,
        *,
        migrate: bool = True,
        busy_timeout_s: float = 30.0,
        retries: int = 4,
        series: str | SeriesStore | None = None,
    ) -> None:
        # series: a store some days were tiered into; run reads merge them back (store/series_read.py)
        self._tiered = TieredReads(series) if series else None
        self._db = Database(
            default_url() if url is None else os.fspath(url), busy_timeout_s=busy_timeout_s, retries=retries
        )
        self._known_runs: set[str] = set()  # runs seen to exist: appends skip the look-up
        try:
            version = self._db.read(migrations.current_version)
            migrations.check(self._db, version, migrate=migrate)
            if version < migrations.LATEST:
                migrations.upgrade(self._db)
        except BaseException:
            self._db.close()
            raise

    # -- lifecycle -----------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The database URL with its password masked."""
        return self._db.display

    @property
    def dialect(self) -> str:
        """``"sqlite"`` or ``"postgresql"``."""
        return self._db.dialect

    @property
    def database(self) -> Database:
        """The engine wrapper, for store functions that take it (writes that need its dialect helpers)."""
        return self._db

    def read(self, fn: Callable[[Connection], T]) -> T:
        """``fn(conn)`` in one read transaction (one consistent snapshot), retried on a transient
        error (a locked SQLite file, a lost PostgreSQL connection). For queries the methods below lack."""
        return self._db.read(fn)

    def write(self, fn: Callable[[Connection], T]) -> T:
        """``fn(conn)`` in one write transaction, retried as ``read``; ``fn`` must be safe to rerun."""
        return self._db.write(fn)

    def schema_version(self) -> int:
        return self._db.read(migrations.current_version)

    def close(self) -> None:
        self._db.close()
        if self._tiered is not None:
            self._tiered.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- writes --------------------------------------------------------------------------------

    def create_run(self, run: RunRecord) -> bool:
        """Store a new run; False (and nothing changed) if a run with this id already exists,
        so a replayed creation is harmless. Change an existing run with ``update_run``."""

        def tx(conn: Connection) -> bool:
            ownership.refuse_direct_recording(conn, self._db.display)  # a team ledger: via its server only
            return writes.insert_run(self._db, conn, run)

        created = self._db.write(tx)
        self._known_runs.add(run.id)
        return created

    def add_devices(self, run_id: str, devices: Sequence[GpuIdentity]) -> None:
        """Insert or update (by uuid) the run's GPUs."""
        self._db.write(lambda conn: writes.upsert_devices(self._db, conn, run_id, devices))

    def append(
        self,
        run_id: str,
        gpu: Sequence[GpuInterval] = (),
        host: Sequence[HostInterval] = (),
        events: Sequence[Event] = (),
        metrics: Sequence[Metric] = (),
        *,
        event_seq: int | None = None,
        metric_seq: int | None = None,
    ) -> None:
        """Add a batch of records to a run, all in one transaction.

        Idempotent: GPU intervals are keyed by (run, device uuid, seq), host intervals by
        (run, seq). Events and metrics are numbered per run: pass ``event_seq`` / ``metric_seq``,
        the number of the batch's first event / metric in the run (i.e. how many the caller handed
        over before), and a resent batch lands on the same numbers and is skipped. Without them the
        ledger numbers the batch after the run's last record and skips records already stored with
        the same (t, kind, message) for events or (t, key, epoch, step) for metrics.
        """
        if not (gpu or host or events or metrics):
            return
        if not (events or metrics) and flush.append_to_open_run(self._db, run_id, gpu, host):
            self._known_runs.add(run_id)
            return  # the recorder's usual flush (flush.py)
        known = run_id in self._known_runs
        try:
            self._db.write(
                lambda conn: writes.append(
                    self._db, conn, run_id, gpu, host, events, metrics, event_seq, metric_seq, known
                )
            )
        except sa.exc.IntegrityError as exc:  # the run was deleted since we last saw it
            self._known_runs.discard(run_id)
            raise RunNotFound(run_id) from exc
        self._known_runs.add(run_id)

    def update_run(self, run_id: str, **fields: Any) -> None:
        """Change fields of a run (any RunRecord field but ``id``); ValueError for an unknown field
        or status, RunNotFound for an unknown run. ``labels`` replaces the whole label set."""
        values = codec.run_update_values(fields)
        if not values:
            return

        def tx(conn: Connection) -> None:
            upd = sa.update(schema.runs).where(schema.runs.c.id == run_id).values(values)
            if conn.execute(upd).rowcount == 0:
                raise RunNotFound(run_id)
            if "labels" in values:
                writes.replace_labels(conn, run_id, values["labels"])
            if "meta" in values:
                lineage.sync(conn, run_id, values["meta"])
            if fields.keys() & rollup_stale.ROLLUP_FIELDS:
                rollup_stale.drop_rollups(conn, [run_id])

        self._db.write(tx)

    def set_log(self, run_id: str, data: bytes, *, truncated: bool = False) -> None:
        """Store (replace) the run's redacted output with its sha256 and size.
        ``truncated``: the relay kept only part of the output."""
        self._db.write(lambda conn: writes.set_log(self._db, conn, run_id, data, truncated))

    def delete_run(self, run_id: str) -> None:
        """Delete a run and everything recorded for it; RunNotFound if there is no such run."""
        self._known_runs.discard(run_id)
        self._db.write(lambda conn: writes.delete_run(conn, run_id))

    # -- reads ---------------------------------------------------------------------------------

    def resolve(self, ref: str) -> str:
        """The full id of the run ``ref`` names: a full id, its short id (core/ids.py), or a unique
        prefix of at least 4 chars. A ref that is both a prefix and a short id matches both ways."""
        from gpuledger.core.ids import tail_of_short_id

        ref = ref.strip()
        ids = schema.runs.c.id
        tail = tail_of_short_id(ref)

        # Run ids are lower-case UUIDs: one typed in capitals (or a prefix of one) names the same run.
        canonical = ref.lower() if _HEX_REF.fullmatch(ref) else ref

        def tx(conn: Connection) -> str:
            for exact in dict.fromkeys((ref, canonical)):
                if conn.scalar(sa.select(ids).where(ids == exact)) is not None:
                    return exact
            if len(ref) < MIN_PREFIX:
                hint = f"give the full run id, its short id or a prefix of at least {MIN_PREFIX} characters"
                raise RunNotFound(ref, hint)
            match = ids.startswith(canonical, autoescape=True)
            if tail is not None:
                match = sa.or_(match, ids.endswith(tail))
            q = (
                sa.select(ids)
                .where(match)
                .order_by(schema.runs.c.started_at.desc(), ids.desc())
                .limit(_MAX_CANDIDATES + 1)
            )
            found = list(conn.scalars(q))
            if not found:
                raise RunNotFound(ref)
            if len(found) > 1:
                raise AmbiguousRun(ref, found[:_MAX_CANDIDATES], more=len(found) > _MAX_CANDIDATES)
            return found[0]

        return self._db.read(tx)

    def get_run(self, run_id: str) -> RunRecord:
        row = self._db.read(
            lambda conn: conn.execute(sa.select(schema.runs).where(schema.runs.c.id == run_id)).mappings().first()
        )
        if row is None:
            raise RunNotFound(run_id)
        return codec.run_from_row(row)

    def list_runs(
        self,
        project: str | None = None,
        team: str | None = None,
        user: str | None = None,
        status: str | None = None,
        since: float | None = None,
        labels: Mapping[str, Any] | None = None,
        limit: int | None = None,
    ) -> list[RunRecord]:
        """Runs matching every given filter, newest first. ``since``: started at or after (epoch s);
        ``labels``: each key=value must be among the run's labels."""
        q = queries.list_runs_query(
            project=project, team=team, user=user, status=status, since=since, labels=labels, limit=limit
        )
        return [codec.run_from_row(r) for r in self._rows(q)]

    def devices(self, run_id: str) -> list[GpuIdentity]:
        d = schema.devices.c
        q = sa.select(schema.devices).where(d.run_id == run_id).order_by(d.index, d.uuid)
        return [codec.device_from_row(r) for r in self._rows(q)]

    def gpu_intervals(self, run_id: str, device_uuid: str | None = None) -> list[GpuInterval]:
        """Ordered by device uuid, then seq."""
        g = schema.gpu_intervals.c
        q = sa.select(schema.gpu_intervals).where(g.run_id == run_id)
        if device_uuid is not None:
            q = q.where(g.device_uuid == device_uuid)
        held = [codec.gpu_from_row(r) for r in self._rows(q.order_by(g.device_uuid, g.seq))]
        return held if self._tiered is None else self._tiered.gpu(run_id, device_uuid, held)

    def host_intervals(self, run_id: str) -> list[HostInterval]:
        h = schema.host_intervals.c
        q = sa.select(schema.host_intervals).where(h.run_id == run_id).order_by(h.seq)
        held = [codec.host_from_row(r) for r in self._rows(q)]
        return held if self._tiered is None else self._tiered.host(run_id, held)

    @property
    def series_reads(self) -> TieredReads | None:
        """The reads of the series store tiered days went to (store/series_read.py); None without one."""
        return self._tiered

    def tiered(self, run_id: str) -> bool:
        """Whether the run has raw days in the series store this ledger reads (``run.raw_tiered``,
        store/series_tier.py; or all of them, a series-only run: store/series_segments.py): SQL
        over the interval tables then misses rows, and a read goes
        through gpu_intervals()/host_intervals(). False without a store, with no query."""
        if self._tiered is None:
            return False
        from gpuledger.store.series_segments import is_marked
        from gpuledger.store.series_tier import run_was_tiered

        # a series-only run (serve --series-only) holds all its raw rows in the store
        return self._db.read(lambda conn: run_was_tiered(conn, run_id) or is_marked(conn, run_id))

    def tiered_dropped(self, run_id: str) -> tuple[dict[tuple[str, str], int], list[dict[str, Any]]]:
        """The run's tiered days the ledger dropped: the highest seq dropped per (series, device) and
        its ``run.raw_tiered`` entries (store/tiered_totals.py sums them without the store)."""
        from gpuledger.store.tiered_totals import dropped

        return self._db.read(lambda conn: dropped(conn, run_id))

    def series_only_sums(self, run_id: str) -> dict[str, dict[str, Any]]:
        """A series-only run's per-GPU count, busy_s and energy_j from its ``series_day_sums``
        ({} for any other run): a per-run read the server's scoped view forwards too."""
        from gpuledger.store.tiered_totals import series_only_gpu_sums

        return self._db.read(lambda conn: series_only_gpu_sums(conn, [run_id])).get(run_id, {})

    def series_expired_days(self, run_id: str) -> list[str]:
        """The days (YYYY-MM-DD) of a series-only run its series store dropped past its window
        (store/series_only_window.py); none for another run."""
        from gpuledger.store.series_only_window import expired_days

        return self._db.read(lambda conn: expired_days(conn, run_id))

    def series_day_intervals(self, run_id: str) -> tuple[list[GpuInterval], dict[str, int]]:
        """A series-only run's day sums folded into one interval per GPU, and each GPU's row count
        (store/series_only_window.py): its figures once its store has dropped some of its days."""
        from gpuledger.store.series_only_window import day_sum_intervals

        return self._db.read(lambda conn: day_sum_intervals(conn, run_id))

    def events(self, run_id: str, kind: str | None = None) -> list[Event]:
        """In the order they were appended (seq)."""
        e = schema.events.c
        q = sa.select(schema.events).where(e.run_id == run_id)
        if kind is not None:
            q = q.where(e.kind == kind)
        return [codec.event_from_row(r) for r in self._rows(q.order_by(e.seq))]

    def metrics(self, run_id: str, key: str | None = None) -> list[Metric]:
        """In the order they were appended (seq)."""
        m = schema.metrics.c
        q = sa.select(schema.metrics).where(m.run_id == run_id)
        if key is not None:
            q = q.where(m.key == key)
        return [codec.metric_from_row(r) for r in self._rows(q.order_by(m.seq))]

    def get_log(self, run_id: str) -> bytes | None:
        lg = schema.logs.c
        row = self._db.read(lambda conn: conn.execute(sa.select(lg.data, lg.size_b).where(lg.run_id == run_id)).first())
        return None if row is None else log_codec.decode(bytes(row[0]), int(row[1]))

    def log_info(self, run_id: str) -> dict[str, Any] | None:
        """``{"sha256", "size_b", "truncated"}`` of the stored log without loading it; None if none."""
        lg = schema.logs.c
        q = sa.select(lg.sha256, lg.size_b, lg.truncated).where(lg.run_id == run_id)
        rows = self._rows(q)
        return {**rows[0], "truncated": bool(rows[0]["truncated"])} if rows else None

    def gpu_totals(self, run_id: str) -> dict[str, dict[str, Any]]:
        """Per device uuid: count (intervals), samples, t0 (min), t1 (max), busy_s and energy_j
        (sums; None when no interval measured them), busy_count / energy_count (intervals that did),
        and the maxima of power_max_w, util_max_pct, mem_used_max_b, mem_reserved_b,
        proc_mem_max_b, temp_max_c, mem_clock_max_mhz."""
        return self._db.read(lambda conn: queries.gpu_totals(conn, run_id))

    def host_totals(self, run_id: str) -> dict[str, Any]:
        """count, samples, t0, t1; sums of cpu_s, read_b, write_b, iowait_s, disk_*_b, net_*_b;
        maxima of rss_max_b, threads_max, procs_max, sys_mem_used_max_b; time-weighted
        sys_cpu_util_avg_pct. With no host intervals: count 0 and None elsewhere."""
        return self._db.read(lambda conn: queries.host_totals(conn, run_id))

    def gpu_rollups(self, run_id: str) -> tuple[list[GpuInterval], dict[str, int]]:
        """Each device's intervals merged in SQL into one, and each device's interval count."""
        return self._db.read(lambda conn: run_rollup.gpu_rollups(conn, run_id))

    def host_rollup(self, run_id: str) -> tuple[HostInterval | None, int]:
        """The host intervals merged in SQL into one (None without any), and their count."""
        return self._db.read(lambda conn: run_rollup.host_rollup(conn, run_id))

    def last_flush_t(self, run_id: str) -> float | None:
        """The latest t1 of the run's intervals (how far a lost run is known to have run)."""
        return self._db.read(lambda conn: queries.last_flush_t(conn, run_id))

    def _rows(self, q: sa.Select[Any]) -> list[Mapping[str, Any]]:
        return self._db.read(lambda conn: list(conn.execute(q).mappings()))
