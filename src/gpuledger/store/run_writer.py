"""``gpuledger run``'s writes into a local SQLite ledger, with the standard ``sqlite3`` module.

Why: a run's own rows are a handful of short transactions, but loading SQLAlchemy and the schema
to write them costs about a quarter of a second of CPU, most of the fixed cost of metering a
quick command (BENCHMARKS.md, "Wrapper overhead"). So, for a ledger that is a plain SQLite file
already at this gpuledger's schema version (checked with ``sqlite3`` first) and is not a team
server's, ``RunWriter`` writes what a recording run writes: its row and labels, its GPUs, the
intervals, events and metrics of the open run, changes to its fields, and its log. The SQL is the
statements ``Ledger`` runs (store/writes.py, store/flush.py), with the same values bound (JSON text
from store/json_text.py, a NaN metric as 'NaN', a NaN measurement as NULL): the stored rows are the
same either way (tests/test_run_writer.py compares them row for row).

Anything else is not done here but handed to a ``Ledger`` opened on the same file when first
needed (and every read goes there): a ledger to create or migrate, a team ledger (which ``Ledger``
refuses), a run that ended or was rolled up (stale rollups to drop), integration metadata that
names model weights (lineage rows), a run that is not there (``RunNotFound`` as ``Ledger`` says it).
"""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import os
import random
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from gpuledger.core.model import Event, GpuIdentity, GpuInterval, HostInterval, Metric, RunRecord, run_is_open
from gpuledger.store import log_codec, sqlite_conn
from gpuledger.store.codec import label_rows, run_row, run_update_values, to_row
from gpuledger.store.errors import LedgerLocked, LedgerUnavailable
from gpuledger.store.json_text import dumps
from gpuledger.store.url import default_url, normalise_url
from gpuledger.store.version import LATEST

T = TypeVar("T")

_SQLITE_URL = "sqlite:///"
# Columns stored as JSON text, per table (schema.Json); every other value is bound as it is.
_JSON = {
    "runs": frozenset({"command", "labels", "git", "versions", "meta"}),
    "events": frozenset({"payload"}),
    "gpu_intervals": frozenset({"throttle_s"}),
}
_EVENT_KEY = ("t", "kind", "message")  # as writes._EVENT_KEY (metrics: _insert_metrics)


class _Decline(Exception):
    """Not a case for this writer: rolled back, and the full ``Ledger`` does it."""


def open_run_ledger(url: str | None, *, busy_timeout_s: float = 30.0, retries: int = 4) -> Any:
    """The ledger a recording run writes to: a ``RunWriter`` where it can be one, else ``Ledger``."""
    writer = RunWriter.open(url, busy_timeout_s=busy_timeout_s, retries=retries)
    if writer is not None:
        return writer
    from gpuledger.store.ledger import Ledger

    return Ledger(url, busy_timeout_s=busy_timeout_s, retries=retries)


def plain_sqlite_file(url: str) -> str | None:
    """The file a ``sqlite:///PATH`` URL names; None for anything ``sqlite3.connect`` would not
    open the same way as SQLAlchemy (another driver, a query string, a URI, in memory, escapes)."""
    if not url.startswith(_SQLITE_URL):
        return None
    path = url[len(_SQLITE_URL) :]
    if not path or path == ":memory:" or path.startswith("file:") or any(c in path for c in "?%#"):
        return None
    return path


class RunWriter:
    """A recording run's writes into one SQLite ledger file; other calls go to ``Ledger``."""

    dialect = "sqlite"

    def __init__(self, url: str, conn: sqlite3.Connection, busy_timeout_s: float, retries: int) -> None:
        self._url = url
        self._conn = conn
        self._busy_timeout_s = busy_timeout_s
        self._retries = retries
        self._lock = threading.Lock()  # the recorder thread flushes, the main thread ends the run
        self._ledger: Any = None  # the full Ledger, opened on first need

    @classmethod
    def open(cls, url: str | None, *, busy_timeout_s: float = 30.0, retries: int = 4) -> RunWriter | None:
        """A writer for the ledger at ``url`` (None: the default one), or None when it is not a
        SQLite file at the current schema version that is not a team ledger."""
        url = default_url() if url is None else normalise_url(url)
        path = plain_sqlite_file(url)
        if path is None or not os.path.isfile(path):
            return None  # Ledger creates it (and says why it cannot)
        try:
            conn = sqlite3.connect(path, timeout=busy_timeout_s, check_same_thread=False)
        except sqlite3.Error:
            return None
        try:
            sqlite_conn.set_up(conn, int(busy_timeout_s * 1000), wal=True)
            version = conn.execute("SELECT max(version) FROM schema_version").fetchone()[0]
            team = conn.execute("SELECT id FROM api_tokens LIMIT 1").fetchone() is not None
        except sqlite3.Error:  # locked, damaged, not a ledger: Ledger waits, migrates or says so
            conn.close()
            return None
        if version != LATEST or team:
            conn.close()
            return None
        return cls(url, conn, busy_timeout_s, retries)

    @property
    def url(self) -> str:
        return self._url  # a SQLite URL holds no password

    def _full(self) -> Any:
        with self._lock:
            if self._ledger is None:
                from gpuledger.store.ledger import Ledger

                self._ledger = Ledger(self._url, busy_timeout_s=self._busy_timeout_s, retries=self._retries)
            return self._ledger

    def __getattr__(self, name: str) -> Any:
        # Reads (get_run, the run's totals for its summary, ...) and rare writes: the full Ledger.
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._full(), name)

    def close(self) -> None:
        with self._lock:
            self._conn.close()
            ledger, self._ledger = self._ledger, None
        if ledger is not None:
            ledger.close()

    def __enter__(self) -> RunWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the writes of a recording run ---------------------------------------------------------

    def create_run(self, run: RunRecord) -> bool:
        """As ``Ledger.create_run``: False (nothing changed) when the run is there already."""
        if run.meta:  # may name weights: run_lineage rows (store/lineage.py)
            return self._full().create_run(run)
        row = run_row(run)
        row["rolled_up"] = False  # the column's default, which SQLAlchemy binds on insert

        def tx(c: sqlite3.Connection) -> bool:
            if c.execute("SELECT id FROM api_tokens LIMIT 1").fetchone() is not None:
                raise _Decline  # a team ledger: Ledger refuses, saying why
            sql = _insert_sql("runs", row.keys(), "ON CONFLICT (id) DO NOTHING RETURNING id")
            if c.execute(sql, _values("runs", row)).fetchone() is None:
                return False  # a replay
            _replace_labels(c, run.id, row["labels"])
            c.execute("DELETE FROM run_lineage WHERE run_id = ?", (run.id,))  # lineage.sync of no meta
            return True

        return self._write(tx, lambda: self._full().create_run(run))

    def add_devices(self, run_id: str, devices: Sequence[GpuIdentity]) -> None:
        """As ``Ledger.add_devices``, for a run that has none stored yet."""

        def tx(c: sqlite3.Connection) -> None:
            state = c.execute("SELECT rolled_up FROM runs WHERE id = ?", (run_id,)).fetchone()
            if state is None or state[0]:
                raise _Decline  # RunNotFound, or rollups to drop
            if not devices:
                return
            if c.execute("SELECT 1 FROM devices WHERE run_id = ? LIMIT 1", (run_id,)).fetchone() is not None:
                raise _Decline  # compared with what is stored first (writes.upsert_devices)
            rows = [to_row(d, run_id=run_id) for d in devices]
            keys = rows[0].keys()
            update = ", ".join(f'"{k}" = excluded."{k}"' for k in keys if k not in ("run_id", "uuid"))
            sql = _insert_sql("devices", keys, f"ON CONFLICT (run_id, uuid) DO UPDATE SET {update}")
            c.executemany(sql, [_values("devices", r) for r in rows])

        self._write(tx, lambda: self._full().add_devices(run_id, devices))

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
        """As ``Ledger.append``, for a run still open (nothing of it can have been rolled up)."""
        if not (gpu or host or events or metrics):
            return

        def tx(c: sqlite3.Connection) -> None:
            state = c.execute("SELECT status, ended_at FROM runs WHERE id = ?", (run_id,)).fetchone()
            if state is None or not run_is_open(state[0], state[1]):
                raise _Decline
            _insert_new(c, "gpu_intervals", [to_row(i, run_id=run_id) for i in gpu])
            _insert_new(c, "host_intervals", [to_row(i, run_id=run_id) for i in host])
            if events:
                rows = [to_row(e, run_id=run_id) for e in events]
                for row in rows:
                    row["payload"] = dict(row["payload"] or {})
                _insert_new(c, "events", _numbered(c, "events", run_id, rows, event_seq, _EVENT_KEY))
            if metrics:
                _insert_metrics(c, run_id, metrics, metric_seq)

        self._write(
            tx,
            lambda: self._full().append(run_id, gpu, host, events, metrics, event_seq=event_seq, metric_seq=metric_seq),
        )

    def update_run(self, run_id: str, **fields: Any) -> None:
        """As ``Ledger.update_run``, for a run not rolled up whose metadata names no weights."""
        values = run_update_values(fields)
        if not values:
            return
        if values.get("meta"):  # lineage rows (store/lineage.py)
            self._full().update_run(run_id, **fields)
            return

        def tx(c: sqlite3.Connection) -> None:
            state = c.execute("SELECT rolled_up FROM runs WHERE id = ?", (run_id,)).fetchone()
            if state is None or state[0]:
                raise _Decline  # RunNotFound, or rollups to drop
            sets = ", ".join(f'"{k}" = ?' for k in values)
            c.execute(f"UPDATE runs SET {sets} WHERE id = ?", (*_values("runs", values), run_id))
            if "labels" in values:
                _replace_labels(c, run_id, values["labels"])
            if "meta" in values:
                c.execute("DELETE FROM run_lineage WHERE run_id = ?", (run_id,))

        self._write(tx, lambda: self._full().update_run(run_id, **fields))

    def set_log(self, run_id: str, data: bytes | mmap.mmap, *, truncated: bool = False) -> None:
        """As ``Ledger.set_log``: the run's output, stored compressed when that is shorter. ``data``
        may be the log file mapped (recorder/wrap.py): hashed and compressed without a copy."""
        if not isinstance(data, (bytes, mmap.mmap)):
            data = bytes(data)
        row = {
            "run_id": run_id,
            "data": log_codec.encode(data),
            "sha256": hashlib.sha256(data).hexdigest(),
            "size_b": len(data),
            "truncated": truncated,
        }
        update = ", ".join(f'"{k}" = excluded."{k}"' for k in row if k != "run_id")

        def tx(c: sqlite3.Connection) -> None:
            if c.execute("SELECT 1 FROM runs WHERE id = ?", (run_id,)).fetchone() is None:
                raise _Decline  # RunNotFound
            c.execute(
                _insert_sql("logs", row.keys(), f"ON CONFLICT (run_id) DO UPDATE SET {update}"), tuple(row.values())
            )

        self._write(tx, lambda: self._full().set_log(run_id, data, truncated=truncated))

    # -- transactions --------------------------------------------------------------------------

    def _write(self, tx: Callable[[sqlite3.Connection], T], otherwise: Callable[[], T]) -> T:
        try:
            return self._transaction(tx)
        except _Decline:
            return otherwise()

    def _transaction(self, tx: Callable[[sqlite3.Connection], T]) -> T:
        """``tx`` in one BEGIN IMMEDIATE transaction, retried with backoff while another writer
        holds the lock past the busy timeout (then LedgerLocked), as ``Database.write`` does."""
        delay = 0.05
        for attempt in range(self._retries + 1):
            try:
                with self._lock:
                    return self._once(tx)
            except sqlite3.OperationalError as exc:
                if not sqlite_conn.is_locked(str(exc)):
                    raise self._translated(exc) from exc
                if attempt == self._retries:
                    raise LedgerLocked(
                        f"the ledger {self._url} stayed locked by other writers ({self._busy_timeout_s:g} s wait, "
                        f"{self._retries} retries); nothing was written. Keep the data and retry later; if this "
                        "persists, look for a process holding a long transaction on it"
                    ) from exc
            except sqlite3.Error as exc:
                raise self._translated(exc) from exc
            time.sleep(delay * (1 + random.random()))  # jitter: waiting writers do not collide
            delay *= 2
        raise AssertionError("unreachable")

    def _once(self, tx: Callable[[sqlite3.Connection], T]) -> T:
        c = self._conn
        c.execute("BEGIN IMMEDIATE")  # the connection is in autocommit mode (sqlite_conn.set_up)
        try:
            result = tx(c)
            c.execute("COMMIT")
            return result
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                c.execute("ROLLBACK")
            raise

    def _translated(self, exc: sqlite3.Error) -> Exception:
        text = str(exc).strip()
        if not sqlite_conn.is_unavailable(text):
            return exc
        first = text.splitlines()[0] if text else type(exc).__name__
        return LedgerUnavailable(
            f"cannot open the ledger {self._url}: {first}; check the file and folder permissions "
            "and free space, or set GPULEDGER_DB to another path"
        )


def _insert_sql(table: str, columns: Iterable[str], tail: str) -> str:
    names = list(columns)
    cols = ", ".join(f'"{n}"' for n in names)
    return f"INSERT INTO {table} ({cols}) VALUES ({', '.join('?' * len(names))}) {tail}"


def _values(table: str, row: Mapping[str, Any]) -> tuple[Any, ...]:
    """The row's values as SQLAlchemy binds them on SQLite (schema.py's column types)."""
    json_cols = _JSON.get(table, frozenset())
    out = []
    for name, value in row.items():
        if name in json_cols:
            value = None if value is None else dumps(value)  # Json(none_as_null=True)
        out.append(value)  # a NaN measurement: SQLite stores NULL, as schema.Measured wants
    return tuple(out)


def _insert_new(c: sqlite3.Connection, table: str, rows: list[dict[str, Any]]) -> None:
    """``INSERT ... ON CONFLICT DO NOTHING`` of rows (one column set): a resent batch is skipped."""
    if rows:
        c.executemany(_insert_sql(table, rows[0].keys(), "ON CONFLICT DO NOTHING"), [_values(table, r) for r in rows])


_METRICS_INSERT = (
    'INSERT INTO metrics (run_id, seq, t, "key", value, epoch, step) VALUES (?, ?, ?, ?, ?, ?, ?) '
    "ON CONFLICT DO NOTHING"
)


def _insert_metrics(c: sqlite3.Connection, run_id: str, metrics: Sequence[Metric], first_seq: int | None) -> None:
    """The metric rows as ``_numbered`` and ``_insert_new`` would write them, built as tuples
    straight from the records: a chatty run's end parses thousands of metrics from its log, and a
    dict per row, then a tuple from the dict, cost more than the insert itself."""
    if first_seq is None:
        ts = [m.t for m in metrics]
        q = 'SELECT t, "key", epoch, step FROM metrics WHERE run_id = ? AND t >= ? AND t <= ?'
        stored = c.execute(q, (run_id, min(ts), max(ts)))
        seen = {tuple(r) for r in stored}
        if seen:  # a resent batch: rows already stored (same t, key, epoch, step) are dropped
            metrics = [m for m in metrics if (m.t, m.key, m.epoch, m.step) not in seen]
        last = c.execute("SELECT max(seq) FROM metrics WHERE run_id = ?", (run_id,)).fetchone()[0]
        first_seq = 0 if last is None else last + 1
    # schema.MetricValue: a NaN loss is a result, stored as 'NaN' (SQLite would store NULL)
    rows = [
        (run_id, first_seq + i, m.t, m.key, "NaN" if isinstance(v := m.value, float) and v != v else v, m.epoch, m.step)
        for i, m in enumerate(metrics)
    ]
    if rows:
        c.executemany(_METRICS_INSERT, rows)


def _replace_labels(c: sqlite3.Connection, run_id: str, labels: Mapping[str, Any]) -> None:
    c.execute("DELETE FROM run_labels WHERE run_id = ?", (run_id,))
    rows = label_rows(run_id, labels)
    if rows:
        c.executemany(
            'INSERT INTO run_labels (run_id, "key", value) VALUES (?, ?, ?)', [tuple(r.values()) for r in rows]
        )


def _numbered(
    c: sqlite3.Connection,
    table: str,
    run_id: str,
    rows: list[dict[str, Any]],
    first_seq: int | None,
    key: tuple[str, ...],
) -> list[dict[str, Any]]:
    """As writes._numbered: ``first_seq``, +1, ... when given; otherwise rows already stored (same
    ``key``) are dropped and the rest continue after the run's last seq."""
    if first_seq is not None:
        for i, row in enumerate(rows):
            row["seq"] = first_seq + i
        return rows
    ts = [row["t"] for row in rows]
    cols = ", ".join(f'"{k}"' for k in key)
    stored = c.execute(f"SELECT {cols} FROM {table} WHERE run_id = ? AND t >= ? AND t <= ?", (run_id, min(ts), max(ts)))
    seen = {tuple(r) for r in stored}
    fresh = [row for row in rows if tuple(row[k] for k in key) not in seen]
    last = c.execute(f"SELECT max(seq) FROM {table} WHERE run_id = ?", (run_id,)).fetchone()[0]
    start = 0 if last is None else last + 1
    for i, row in enumerate(fresh):
        row["seq"] = start + i
    return fresh
