"""The compact raw-interval store on PostgreSQL (docs/SCALE.md, step 2): a series/base.SeriesStore
in a schema of its own (default ``series``) of any PostgreSQL database, given a ``postgresql://``
URL. 104-114 B per GPU interval at rest with its index, against 505 B as ledger rows.

- Layout: series/postgres_ddl.py (tables, day partitions), series/postgres_codec.py (the row).
- ``write``: one COPY (binary) into a temporary staging table, then per day an
  ``INSERT INTO <day partition> SELECT ... ON CONFLICT DO NOTHING`` on the (stream, seq) key, in one
  transaction with the batch's token: a resent batch, by token or by rows, stores nothing more.
- Reads of one run go by key: its streams from ``streams``, then ``stream = ANY(...)``, an index
  scan of each day partition's (stream, seq) key (tests/test_series_postgres.py checks the plan).
- ``write_capacity`` / ``capacity_intervals``: the node agents' capacity intervals
  (series/postgres_capacity.py), the same way: a token, day partitions, the (gpu, t_ms) key.
- ``drop_days_before``: DROP TABLE of whole day partitions, never a DELETE of rows.

One connection per store, used by one thread at a time; open one store per worker.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from datetime import date
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from gpuledger.series import postgres_capacity
from gpuledger.series import postgres_ddl as ddl
from gpuledger.series.base import DayRollup, Row
from gpuledger.series.postgres_codec import (
    DAY_MS,
    GPU_COLUMNS,
    GPU_NAMES,
    HOST_COLUMNS,
    HOST_NAMES,
    INT2,
    INT4,
    Encoded,
    decode_gpu,
    decode_host,
    encode_gpu,
    encode_host,
    gpu_units,
    reserved_extra,
)
from gpuledger.series.postgres_days import MEASURED, DaySum, add_group, day_range, first_day_reaching, split_row
from gpuledger.series.postgres_keys import Keys

AHEAD_DAYS = 2  # day partitions made ahead of today (store/partitions.py does the same for the ledger)
COMPACT_AFTER_S = 3600  # a day's index is rebuilt this long after the day ended (late pushes are rare then)
_EPOCH = date(1970, 1, 1)


def gpu_run_query(schema: str) -> str:
    """One run's GPU rows, given its stream keys: an index scan of each day's (stream, seq) key."""
    return f"SELECT {', '.join(GPU_NAMES)} FROM {schema}.gpu_iv WHERE stream = ANY(%s)"


_T0_MS = f"(day::int8 * {DAY_MS} + t_ms)"
_WINDOW = f"{_T0_MS} + dur_ms > %s AND {_T0_MS} < %s"


def gpu_window_query(schema: str) -> str:
    """One run's GPU rows in a time window (``window_params``): the window's days by their key
    index, and the odd rows (crossing a midnight) of the days before it by their partial index."""
    one = gpu_run_query(schema)
    return (
        f"{one} AND day BETWEEN %s AND %s AND {_WINDOW} UNION ALL "
        f"{one} AND day BETWEEN %s AND %s AND ({ddl.ODD}) AND {_WINDOW}"
    )


def host_window_query(schema: str) -> str:
    """One run's host rows in a time window, as gpu_window_query, in seq order."""
    one = f"SELECT {', '.join(HOST_NAMES)} FROM {schema}.host_iv WHERE run = %s"
    return (
        f"{one} AND day BETWEEN %s AND %s AND {_WINDOW} UNION ALL "
        f"{one} AND day BETWEEN %s AND %s AND ({ddl.HOST_ODD}) AND {_WINDOW} ORDER BY seq"
    )


def window_params(t_from: float, t_to: float) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """The parameters of a window query's two parts after the run's key: (its days, t_from ms,
    t_to ms), then (the earlier days whose rows can reach into it, the same ms)."""
    lo_ms, hi_ms = t_from * 1000, t_to * 1000
    lo, hi = math.floor(lo_ms / DAY_MS), math.floor(hi_ms / DAY_MS)
    lo, hi = max(lo, INT2[0]), min(hi, INT2[1])  # no day outside int2 has a row
    return (lo, hi, lo_ms, hi_ms), (first_day_reaching(lo, INT4[1]), lo - 1, lo_ms, hi_ms)


def _conninfo(url: str) -> str:
    for prefix in ("postgresql+psycopg://", "postgres://", "postgresql://"):
        if url.startswith(prefix):
            return "postgresql://" + url[len(prefix) :]
    raise ValueError(f"series store URL {url!r}: expected postgresql://")


class PostgresSeries:
    def __init__(self, url: str, schema: str = "series") -> None:
        self.schema = ddl.check_schema(schema)
        self._conn = psycopg.connect(_conninfo(url), autocommit=True)
        self.keys = Keys(self._conn, self.schema)
        self._staged = False
        self._parts: dict[str, dict[int, str]] = {t: {} for t in ddl.TABLES}  # known day partitions

    # -- tables -------------------------------------------------------------------------------

    def create(self) -> None:
        ddl.create(self._conn, self.schema)
        self.maintain(compact=False)  # a server creating it at start must not wait on others' snapshots

    def maintain(self, now: float | None = None, ahead_days: int = AHEAD_DAYS, *, compact: bool = True) -> list[str]:
        """What a server runs at start and hourly: the day partitions from yesterday to
        ``ahead_days`` ahead made where missing (a write also makes the ones it needs), and with
        ``compact`` the key index of each day that ended ``COMPACT_AFTER_S`` ago rebuilt full once
        (postgres_ddl.compact_before). A start leaves the rebuild to the hourly pass: ``REINDEX
        CONCURRENTLY`` waits for every older transaction of the database, and one left idle by any
        client would hold the server's start. The partitions and indexes made."""
        now = time.time() if now is None else now
        today = int(now // 86400)
        made = ddl.ensure_days(self._conn, self.schema, set(range(today - 1, today + ahead_days + 1)))
        if not compact:
            return made
        return made + ddl.compact_before(self._conn, self.schema, int((now - COMPACT_AFTER_S) // 86400))

    def _stage(self) -> None:
        if not self._staged:
            for table in ddl.TABLES:
                self._conn.execute(
                    f"CREATE TEMP TABLE IF NOT EXISTS {table}_stage (LIKE {self.schema}.{table}) ON COMMIT DELETE ROWS"
                )
            self._staged = True

    # -- writing ------------------------------------------------------------------------------

    def write(self, run_id: str, gpu: Sequence[Row], host: Sequence[Row], token: str) -> int:
        if not isinstance(run_id, str) or not run_id:
            raise ValueError(f"run id {run_id!r} is not a name")
        encoded = [encode_gpu(r) for r in gpu]  # every row checked before anything is stored
        hosts = [encode_host(r, 0) for r in host]
        seen, kept_from = self._seen(token)
        if seen:
            return 0
        if kept_from is not None:  # a resend of days already dropped stores nothing
            encoded = [e for e in encoded if e.day >= kept_from]
            hosts = [h for h in hosts if h["day"] >= kept_from]
        gpu_rows, host_rows = self._keyed(run_id, encoded, hosts)
        return self._store(token, [
            ("gpu_iv", GPU_COLUMNS, gpu_rows, {e.day for e in encoded}),
            ("host_iv", HOST_COLUMNS, host_rows, {h["day"] for h in hosts}),
        ])  # fmt: skip

    def write_capacity(self, rows: Sequence[Row], token: str) -> int:
        """Store capacity intervals (``gpu_capacity`` rows: series/capacity.py) once: the same
        token again, or a row whose (GPU, start) is held, stores nothing. The rows stored."""
        parsed = postgres_capacity.parse(rows)  # every row checked before anything is stored
        seen, kept_from = self._seen(token)
        if seen:
            return 0
        if kept_from is not None:  # a resend of days already dropped stores nothing
            parsed = [p for p in parsed if p.day >= kept_from]
        keyed = postgres_capacity.keyed(parsed, self.keys)
        return self._store(token, [("cap_iv", ddl.CAP_COLUMNS, keyed, {p.day for p in parsed})])

    def _seen(self, token: str) -> tuple[bool, int | None]:
        """(whether the batch ``token`` was stored, the first day still kept)."""
        s = self.schema
        row = self._conn.execute(
            f"SELECT EXISTS (SELECT 1 FROM {s}.batches WHERE token = %s), (SELECT day FROM {s}.kept_from)", (token,)
        ).fetchone()
        assert row is not None
        return bool(row[0]), row[1]

    def _store(self, token: str, copies: list[tuple[str, tuple[tuple[str, str], ...], list[Any], set[int]]]) -> int:
        """One transaction: the token, then each (table, columns, rows, their days) copied into
        its day partitions (made where missing); the rows stored, 0 when the token was there."""
        s = self.schema
        days = {d for *_, ds in copies for d in ds}
        self._stage()
        last_day = max(days, default=int(time.time() // 86400))
        for attempt in (1, 2):
            if any(ds - set(self._parts[table]) for table, _, _, ds in copies):
                ddl.ensure_days(self._conn, s, days)
                self._parts = {t: ddl.days(self._conn, s, t) for t in ddl.TABLES}
            try:
                with self._conn.transaction():
                    stored = self._conn.execute(
                        f"INSERT INTO {s}.batches (token, day) VALUES (%s, %s) ON CONFLICT DO NOTHING RETURNING 1",
                        (token, last_day),
                    ).fetchone()
                    if stored is None:  # another writer stored this batch meanwhile
                        return 0
                    return sum(self._copy(table, cols, rows, ds) for table, cols, rows, ds in copies)
            except psycopg.errors.UndefinedTable:
                if attempt == 2:
                    raise
                self._parts = {t: {} for t in ddl.TABLES}  # another process dropped a day we knew
        raise AssertionError("unreachable")

    def _keyed(
        self, run_id: str, encoded: list[Encoded], hosts: list[dict[str, Any]]
    ) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
        """The rows with their run, stream and shape keys (allocated where new), in table order."""
        run = self.keys.run_key(run_id)
        assert run is not None
        gpu_keys = self.keys.gpu_keys(e.device_uuid for e in encoded)
        first_reserved: dict[int, int | None] = {}
        for e in encoded:
            first_reserved.setdefault(gpu_keys[e.device_uuid], e.mem_reserved_units)
        streams = self.keys.stream_keys(run, first_reserved)
        shapes = self.keys.shape_codes(e.shape for e in encoded)
        gpu_rows = []
        for e in encoded:
            stream, reserved = streams[gpu_keys[e.device_uuid]]
            values = {**reserved_extra(e, reserved), "stream": stream, "shape": shapes[e.shape]}
            if values["extra"] is not None:
                values["extra"] = Jsonb(values["extra"])
            gpu_rows.append(tuple(values[c] for c in GPU_NAMES))
        host_rows = [tuple({**h, "run": run}[c] for c in HOST_NAMES) for h in hosts]
        return gpu_rows, host_rows

    def _copy(
        self, table: str, columns: tuple[tuple[str, str], ...], rows: list[tuple[Any, ...]], days: set[int]
    ) -> int:
        if not rows:
            return 0
        names = ", ".join(c for c, _ in columns)
        with self._conn.cursor() as cur:
            with cur.copy(f"COPY {table}_stage ({names}) FROM STDIN (FORMAT BINARY)") as copy:
                copy.set_types([t for _, t in columns])
                for row in rows:
                    copy.write_row(row)
            n = 0
            parts = self._parts[table]
            key = ddl.KEY_COLUMNS[table]
            for day in sorted(days):
                cur.execute(
                    f"INSERT INTO {self.schema}.{parts[day]} ({names}) SELECT {names} FROM {table}_stage "
                    f"WHERE day = %s ORDER BY {key} ON CONFLICT ({key}) DO NOTHING",
                    (day,),
                )
                n += cur.rowcount
        return n

    # -- reading ------------------------------------------------------------------------------

    def gpu_intervals(self, run_id: str, device_uuid: str | None = None) -> list[dict[str, Any]]:
        return self._gpu(run_id, device_uuid, gpu_run_query(self.schema), ())

    def host_intervals(self, run_id: str) -> list[dict[str, Any]]:
        q = f"SELECT {', '.join(HOST_NAMES)} FROM {self.schema}.host_iv WHERE run = %s ORDER BY seq"
        return self._host(run_id, q, ())

    def gpu_intervals_between(self, run_id: str, t_from: float, t_to: float) -> list[dict[str, Any]]:
        """The run's GPU intervals with t1 > ``t_from`` and t0 < ``t_to`` (seconds), in (device, seq)
        order: the day partitions of that window and the rows of earlier days crossing into it
        (gpu_window_query), not the whole run."""
        return self._gpu(run_id, None, gpu_window_query(self.schema), window_params(t_from, t_to))

    def host_intervals_between(self, run_id: str, t_from: float, t_to: float) -> list[dict[str, Any]]:
        """The run's host intervals with t1 > ``t_from`` and t0 < ``t_to``, in seq order."""
        return self._host(run_id, host_window_query(self.schema), window_params(t_from, t_to))

    def gpu_devices(self, run_id: str) -> list[str]:
        """The UUIDs of the GPUs the store holds a stream of the run for, sorted."""
        run = self.keys.run_key(run_id, create=False)
        return [] if run is None else sorted({uuid for _, uuid, _ in self.keys.run_streams(run)})

    def gpu_page(self, run_id: str, device_uuid: str, after_seq: int, limit: int) -> list[dict[str, Any]]:
        """The run's rows of the GPU with seq > ``after_seq`` in seq order: the first ``limit`` and
        any more of the last one's seq (a seq in two day partitions), by the (stream, seq) keys."""
        q = f"{gpu_run_query(self.schema)} AND seq > %s ORDER BY seq FETCH FIRST %s ROWS WITH TIES"
        return self._gpu(run_id, device_uuid, q, ((after_seq, limit),))

    def host_page(self, run_id: str, after_seq: int, limit: int) -> list[dict[str, Any]]:
        """The run's host rows with seq > ``after_seq`` in seq order, as ``gpu_page``."""
        q = (
            f"SELECT {', '.join(HOST_NAMES)} FROM {self.schema}.host_iv WHERE run = %s AND seq > %s "
            "ORDER BY seq FETCH FIRST %s ROWS WITH TIES"
        )
        return self._host(run_id, q, ((after_seq, limit),))

    def _gpu(
        self, run_id: str, device_uuid: str | None, q: str, parts: tuple[tuple[Any, ...], ...]
    ) -> list[dict[str, Any]]:
        """Decoded rows of ``q``: one ``gpu_run_query`` part per tuple of further parameters, or one."""
        run = self.keys.run_key(run_id, create=False)
        if run is None:
            return []
        streams = {k: (uuid, reserved) for k, uuid, reserved in self.keys.run_streams(run)}
        if device_uuid is not None:
            streams = {k: v for k, v in streams.items() if v[0] == device_uuid}
        if not streams:
            return []
        params = [p for part in parts or ((),) for p in (list(streams), *part)]
        with self._conn.cursor(row_factory=dict_row) as cur:
            rows = cur.execute(q, params).fetchall()
        out = []
        for r in rows:
            uuid, reserved = streams[r["stream"]]
            out.append(decode_gpu(r, self.keys.shape(r["shape"]), uuid, reserved))
        out.sort(key=lambda r: (r["device_uuid"], r["seq"]))
        return out

    def _host(self, run_id: str, q: str, parts: tuple[tuple[Any, ...], ...]) -> list[dict[str, Any]]:
        run = self.keys.run_key(run_id, create=False)
        if run is None:
            return []
        params = [p for part in parts or ((),) for p in (run, *part)]
        with self._conn.cursor(row_factory=dict_row) as cur:
            return [decode_host(r) for r in cur.execute(q, params)]

    def capacity_intervals(self, gpu_uuids: Sequence[str], t_from_ms: int, t_to_ms: int) -> list[dict[str, Any]]:
        """The capacity intervals of ``gpu_uuids`` starting in [t_from_ms, t_to_ms), in (GPU, start)
        order, by each day's (gpu, t_ms) key."""
        return postgres_capacity.read(self._conn, self.schema, self.keys, gpu_uuids, t_from_ms, t_to_ms)

    def day_rollups(self, t_from: float, t_to: float) -> list[DayRollup]:
        days = day_range(t_from, t_to)
        if days is None:
            return []
        lo, hi = days
        s = self.schema
        sums: dict[int, dict[int, DaySum]] = {}  # stream -> day -> sums
        cols = ", ".join(f"sum({c})" for _, c in MEASURED)
        q = (
            f"SELECT stream, day, shape, count(*), sum(samples), sum(dur_ms), {cols} FROM {s}.gpu_iv "
            f"WHERE day BETWEEN %s AND %s AND NOT ({ddl.ODD}) GROUP BY stream, day, shape"
        )
        for stream, day, shape, n, samples, dur, *measured in self._conn.execute(q, (lo, hi)):
            d = sums.setdefault(stream, {}).setdefault(day, DaySum())
            values = {k: v for (k, _), v in zip(MEASURED, measured, strict=True)}
            add_group(d, self.keys.shape(shape), n, samples or 0, dur, values)
        odd = f"SELECT {', '.join(GPU_NAMES)} FROM {s}.gpu_iv WHERE day BETWEEN %s AND %s AND ({ddl.ODD})"
        with self._conn.cursor(row_factory=dict_row) as cur:
            for r in cur.execute(odd, (first_day_reaching(lo, INT4[1]), hi)):
                units = gpu_units(r, self.keys.shape(r["shape"]), 0)
                split_row(sums.setdefault(r["stream"], {}), units, units["samples"] or 0, lo, hi)
        names = self._stream_names(list(sums))
        out = []
        for stream, per_day in sums.items():
            run_id, uuid = names[stream]
            for day, d in sorted(per_day.items()):
                m = {k: d.sums[k] / 1000 if d.measured[k] else None for k, _ in MEASURED}
                out.append(DayRollup(
                    run_id, uuid, date.fromordinal(_EPOCH.toordinal() + day), d.intervals, d.samples,
                    d.allocated_ms / 1000, m["busy_s"], m["util_idle_s"], m["util_unknown_s"],
                    m["util_unmeasured_s"], m["energy_j"],
                ))  # fmt: skip
        out.sort(key=lambda r: (r.run_id, r.device_uuid, r.day))
        return out

    def _stream_names(self, streams: list[int]) -> dict[int, tuple[str, str]]:
        q = (
            f"SELECT s.key, r.run_id, g.uuid FROM {self.schema}.streams s JOIN {self.schema}.run_keys r "
            f"ON r.key = s.run JOIN {self.schema}.gpu_keys g ON g.key = s.gpu WHERE s.key = ANY(%s)"
        )
        return {k: (run_id, uuid) for k, run_id, uuid in self._conn.execute(q, (streams,))}

    # -- retention and size -------------------------------------------------------------------

    def drop_days_before(self, day: date) -> int:
        self._parts = {t: {} for t in ddl.TABLES}
        return len(ddl.drop_before(self._conn, self.schema, (day - _EPOCH).days))

    def raw_days(self) -> list[date]:
        """The UTC days that have a day partition (of GPU or host intervals; made ahead ones too)."""
        found = {d for t in ddl.TABLES for d in ddl.days(self._conn, self.schema, t)}
        return [date.fromordinal(_EPOCH.toordinal() + d) for d in sorted(found)]

    def bytes_at_rest(self) -> int:
        """The GPU intervals' day partitions (heap, indexes, TOAST) and the key tables they need."""
        names = list(ddl.days(self._conn, self.schema, "gpu_iv").values())
        names += ["gpu_keys", "run_keys", "streams", "shapes"]
        q = "SELECT coalesce(sum(pg_total_relation_size(to_regclass(n))), 0) FROM unnest(%s::text[]) AS n"
        row = self._conn.execute(q, ([f"{self.schema}.{n}" for n in names],)).fetchone()
        return int(row[0]) if row else 0

    def close(self) -> None:
        self._conn.close()


__all__ = ["DAY_MS", "PostgresSeries", "gpu_run_query", "gpu_window_query", "host_window_query", "window_params"]
