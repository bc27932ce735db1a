"""One SQLAlchemy Engine per ledger, set up per backend, and the transaction helpers.

SQLite: WAL (readers never wait for the writer), ``synchronous=NORMAL`` (no fsync per commit; a
power cut may lose the last commits but never corrupts), foreign keys on, and a busy timeout.
Write transactions start with ``BEGIN IMMEDIATE`` so a writer takes the lock up front and waits for
it in SQLite's busy handler, instead of failing half-way when upgrading a read lock.
Driver errors are translated here into the ledger's own exceptions (errors.py).
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Callable
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import URL, Connection
from sqlalchemy.pool import StaticPool

from gpuledger.store import sqlite_conn
from gpuledger.store.direct_insert import DirectInserts
from gpuledger.store.errors import LedgerDenied, LedgerError, LedgerLocked, LedgerUnavailable, PrepareFirst
from gpuledger.store.json_text import dumps
from gpuledger.store.url import display_url, parse, sqlite_path

T = TypeVar("T")
C = TypeVar("C")

SUPPORTED = ("sqlite", "postgresql")
# PostgreSQL: serialization failure, deadlock, and a check violation, which only a partition's
# bound raises (the ledger has no CHECK of its own): a row routed to the default partition while the
# server attached its day's partition (store/partitions.py). Safe to retry: our transactions are idempotent.
_PG_RETRY = frozenset({"40001", "40P01", "23514"})
_BEGIN_OPTION = "gpuledger_begin"
# PostgreSQL: the server shut down or is starting (class 08, connection exceptions, is checked too).
_PG_GONE = frozenset({"57P01", "57P02", "57P03"})
# PostgreSQL: insufficient privilege, and no schema to create in (a search_path naming none that
# exists or that the user may use): the user's grants or the URL to fix, not a bug (LedgerDenied).
_PG_DENIED = frozenset({"42501", "3F000"})
# PrepareFirst rounds one transaction may ask for (each settles what it asked for: one per table's
# new days in practice); more is a bug, raised rather than looped on.
_PREPARES = 8


class Database:
    """The engine of one ledger plus retrying, error-translating transaction helpers."""

    def __init__(self, url: str, *, busy_timeout_s: float = 30.0, retries: int = 4) -> None:
        self._insert_new: dict[str, Any] = {}  # insert_new's statements, by table
        try:
            self.url: URL = parse(url)
        except sa.exc.ArgumentError as exc:
            raise LedgerUnavailable(
                f"{url!r} is not a database URL or path: give a file path, sqlite:///PATH or postgresql://USER@HOST/DB"
            ) from exc
        self.display = display_url(self.url)
        self.dialect = self.url.get_backend_name()
        if self.dialect not in SUPPORTED:
            raise LedgerError(f"unsupported database {self.display}: use SQLite or PostgreSQL")
        self.busy_timeout_s = busy_timeout_s
        self.retries = retries
        self.engine = self._create_engine()
        # Writes go through an engine view whose transactions begin IMMEDIATE on SQLite.
        self._writer = self.engine.execution_options(**{_BEGIN_OPTION: "IMMEDIATE"})
        self.direct = DirectInserts(self.engine.dialect)

    def _create_engine(self) -> sa.Engine:
        try:
            if self.dialect == "sqlite":
                return self._sqlite_engine()
            return self._postgres_engine()
        except ImportError as exc:
            raise LedgerUnavailable(
                f"cannot open {self.display}: the database driver is not installed ({exc}); "
                "for PostgreSQL run: pip install 'gpuledger[postgres]'"
            ) from exc
        except sa.exc.NoSuchModuleError as exc:  # a driver name SQLAlchemy does not know
            raise LedgerUnavailable(
                f"cannot open {self.display}: unknown database driver ({exc}); "
                "use sqlite:///PATH or postgresql://USER@HOST/DB"
            ) from exc

    def _sqlite_engine(self) -> sa.Engine:
        path = sqlite_path(self.url)
        kwargs: dict[str, Any] = {"connect_args": {"check_same_thread": False}}
        if path is None:  # in memory: one shared connection, or every checkout sees an empty DB
            kwargs["poolclass"] = StaticPool
        else:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise LedgerUnavailable(
                    f"cannot create the folder of the ledger {path}: {exc}; "
                    "set GPULEDGER_DB or GPULEDGER_HOME to a writable place"
                ) from exc
        engine = sa.create_engine(self.url, json_serializer=dumps, **kwargs)
        busy_ms = int(self.busy_timeout_s * 1000)
        wal = path is not None

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn: Any, _record: Any) -> None:
            sqlite_conn.set_up(dbapi_conn, busy_ms, wal)  # as gpuledger run's own writer does

        @event.listens_for(engine, "begin")
        def _on_begin(conn: Connection) -> None:
            mode = conn.get_execution_options().get(_BEGIN_OPTION, "DEFERRED")
            conn.exec_driver_sql(f"BEGIN {mode}")

        return engine

    def _postgres_engine(self) -> sa.Engine:
        query = self.url.query
        connect_args: dict[str, Any] = {}
        if "connect_timeout" not in query:
            connect_args["connect_timeout"] = 10  # fail fast on a black-holed host
        if "application_name" not in query:
            connect_args["application_name"] = "gpuledger"
        return sa.create_engine(
            self.url,
            json_serializer=dumps,
            pool_pre_ping=True,
            pool_size=4,
            max_overflow=4,
            connect_args=connect_args,
        )

    def insert(self, table: sa.Table) -> Any:
        """An INSERT that supports ON CONFLICT for this backend."""
        return (sqlite.insert if self.dialect == "sqlite" else postgresql.insert)(table)

    def insert_new(self, table: sa.Table) -> Any:
        """``INSERT ... ON CONFLICT DO NOTHING`` (a row already there stays as it is), built once per
        table: every flush and ingest batch runs one, and a built statement skips SQLAlchemy's
        construction and cache-key walk."""
        stmt = self._insert_new.get(table.name)
        if stmt is None:
            stmt = self._insert_new[table.name] = self.insert(table).on_conflict_do_nothing()
        return stmt

    def insert_new_rows(self, conn: Connection, table: sa.Table, rows: list[dict[str, Any]]) -> None:
        """``insert_new(table)`` of ``rows`` (one column set) in ``conn``'s transaction; on SQLite on
        the DBAPI cursor, with SQLAlchemy's statement and bind processors (direct_insert.py)."""
        if rows:
            self.direct.execute(conn, self.insert_new(table), table, rows)

    def read(self, fn: Callable[[Connection], T]) -> T:
        """Run ``fn`` on a connection (SQLite: in a deferred read transaction, one snapshot)."""
        return self._retrying(self.engine, fn)

    def write(self, fn: Callable[[Connection], T]) -> T:
        """Run ``fn`` in one short write transaction (committed when it returns)."""
        return self._retrying(self._writer, fn)

    def write_dbapi(self, fn: Callable[[Any], T]) -> T:
        """SQLite: ``fn(cursor)`` in one ``BEGIN IMMEDIATE`` transaction on a pooled DBAPI connection,
        retried and translated as ``write`` does; for the recorder's flush (flush.py), where
        SQLAlchemy's connection and statement machinery cost more CPU than the writes."""
        if self.dialect != "sqlite":
            raise LedgerError("write_dbapi is for SQLite ledgers")
        return self._retrying_attempts(lambda: self._dbapi_transaction(fn))

    def _dbapi_transaction(self, fn: Callable[[Any], T]) -> T:
        dbapi_error = self.engine.dialect.loaded_dbapi.Error
        raw = self._connect(self.engine.raw_connection)
        try:
            cursor = raw.cursor()
            try:
                cursor.execute("BEGIN IMMEDIATE")  # the connection is in autocommit mode (_on_connect)
                result = fn(cursor)
                raw.commit()
                return result
            except BaseException:
                with contextlib.suppress(dbapi_error):
                    raw.rollback()
                raise
            finally:
                cursor.close()
        except dbapi_error as exc:  # as SQLAlchemy raises it, so retrying and translating apply
            raise sa.exc.DBAPIError.instance(None, None, exc, dbapi_error) from exc
        finally:
            raw.close()  # back to the pool

    def _retrying(self, engine: sa.Engine, fn: Callable[[Connection], T]) -> T:
        """``fn`` in a transaction, retried as ``_retrying_attempts`` says; a transaction that
        raises PrepareFirst (rolled back) is run again after what it asked for was done."""
        asked = ""
        for _ in range(_PREPARES):
            try:
                return self._retrying_attempts(lambda: self._transaction(engine, fn))
            except PrepareFirst as need:
                asked = str(need)
                need.first()
        raise LedgerError(
            f"a write on {self.display} asked {_PREPARES} times for work before it (last: {asked}); nothing "
            "was written. This is a bug in gpuledger: please report it"
        )

    def _transaction(self, engine: sa.Engine, fn: Callable[[Connection], T]) -> T:
        with self._connect(engine.connect) as conn, conn.begin():
            return fn(conn)

    def _retrying_attempts(self, attempt_once: Callable[[], T]) -> T:
        """Retry with backoff while the database is locked (SQLite, after its busy timeout) or on a
        deadlock / serialisation failure (PostgreSQL); then LedgerLocked. Each attempt is one
        transaction and must be safe to rerun: a failed attempt was rolled back."""
        delay = 0.05
        for attempt in range(self.retries + 1):
            try:
                return attempt_once()
            except sa.exc.DBAPIError as exc:
                if not self._retryable(exc):
                    raise self._translate(exc) from exc
                if attempt == self.retries:
                    waited = f"{self.busy_timeout_s:g} s wait, " if self.dialect == "sqlite" else ""
                    raise LedgerLocked(
                        f"the ledger {self.display} stayed locked by other writers ({waited}{self.retries} "
                        "retries); nothing was written. Keep the data and retry later; if this persists, "
                        "look for a process holding a long transaction on it"
                    ) from exc
                time.sleep(delay * (1 + random.random()))  # jitter: waiting writers do not collide
                delay *= 2
        raise AssertionError("unreachable")

    def _connect(self, open_connection: Callable[[], C]) -> C:
        """A connection (``engine.connect`` or the pool's DBAPI ``raw_connection``); any failure to
        get one (other than a lock to wait out) is LedgerUnavailable."""
        try:
            return open_connection()
        except sa.exc.DBAPIError as exc:
            if self._retryable(exc):
                raise
            raise LedgerUnavailable(self._unavailable_message(exc)) from exc

    def _retryable(self, exc: sa.exc.DBAPIError) -> bool:
        if self.dialect == "sqlite":
            return isinstance(exc, sa.exc.OperationalError) and sqlite_conn.is_locked(str(exc.orig))
        return getattr(exc.orig, "sqlstate", None) in _PG_RETRY

    def _translate(self, exc: sa.exc.DBAPIError) -> Exception:
        """LedgerUnavailable for a database that cannot be reached or opened; else the error as is."""
        if self.dialect == "sqlite":
            if sqlite_conn.is_unavailable(str(exc.orig)):
                return LedgerUnavailable(self._unavailable_message(exc))
            return exc
        sqlstate = getattr(exc.orig, "sqlstate", None) or ""
        if exc.connection_invalidated or sqlstate.startswith("08") or sqlstate in _PG_GONE:
            return LedgerUnavailable(self._unavailable_message(exc))
        if sqlstate in _PG_DENIED:
            return LedgerDenied(denied_message(self.display, str(exc.orig)))
        return exc

    def _unavailable_message(self, exc: sa.exc.DBAPIError) -> str:
        text = str(exc.orig).strip()
        first = text.splitlines()[0] if text else type(exc.orig).__name__
        if self.dialect == "sqlite":
            return (
                f"cannot open the ledger {self.display}: {first}; check the file and folder permissions "
                "and free space, or set GPULEDGER_DB to another path"
            )
        return (
            f"cannot reach the ledger database {self.display}: {first}. Check that the server is "
            "running and reachable from here and that the URL and credentials are right "
            "(GPULEDGER_DB or --db)"
        )

    def close(self) -> None:
        self.engine.dispose()


def denied_message(display: str, error: str) -> str:
    """One line for a PostgreSQL refusal of this user (``error``: the driver's text, first line kept)."""
    first = error.strip().splitlines()[0] if error.strip() else "permission denied"
    return (
        f"the ledger database {display} refused this user: {first}. The schema the URL names "
        "(options=-csearch_path=NAME, else public) must exist, and the user needs USAGE and CREATE on it "
        "for gpuledger db migrate, and read and write on its tables for the other commands"
    )
