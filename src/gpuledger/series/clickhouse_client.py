"""The two ways gpuledger talks to ClickHouse, behind one small adapter (docs/SCALE.md, step 3):

- ``chdb:///abs/path``: the real engine in-process (PyPI ``chdb``), its data in a folder: tests, one
  machine, benchmarks;
- ``clickhouse://user:password@host:8123/db``: a server or cluster over HTTP (``clickhouse-connect``).

Both take the same SQL and the same JSONEachRow rows, so everything above this module runs the same
statements on either; only the transport differs.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Mapping, Sequence
from typing import Any, Protocol
from urllib.parse import unquote, urlsplit

EXTRA_HINT = "pip install 'gpuledger[clickhouse]'"
CHDB_DATABASE = "gpuledger"  # the database inside a chdb folder


class ClickHouseError(RuntimeError):
    """A bad URL, a missing client package or a statement the engine refused."""


class Client(Protocol):
    database: str
    # Whether insert() and insert_columns() say how many blocks the engine dropped as already
    # stored (their token seen before); a client that cannot tell returns None from both.
    tells_duplicates: bool

    def command(self, sql: str, settings: Mapping[str, Any] | None = None) -> None:
        """Run a statement that returns nothing (DDL, ALTER, OPTIMIZE)."""

    def insert(
        self, table: str, rows: Sequence[Mapping[str, Any]], columns: Sequence[str], settings: Mapping[str, Any]
    ) -> int | None:
        """Insert ``rows`` (dicts of JSON-ready values) as one INSERT with ``settings``; the blocks
        dropped as duplicates (its views' included), or None (``tells_duplicates``)."""

    def insert_columns(
        self, table: str, columns: Mapping[str, Sequence[Any]], settings: Mapping[str, Any]
    ) -> int | None:
        """Insert a block given column by column (JSONColumns: one JSON object of lists, no per-row
        objects to build or encode) as one INSERT with ``settings``; as ``insert``."""

    def query(self, sql: str, params: Mapping[str, Any] | None = None) -> list[list[Any]]:
        """Rows of a SELECT; ``{name:Type}`` placeholders bound from ``params`` by the engine."""

    def close(self) -> None: ...


# 64-bit integers as JSON numbers (ClickHouse quotes them by default), so hashes come back as ints.
_READ_SETTINGS = {"output_format_json_quote_64bit_integers": 0}


def _literal(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int | float):
        return repr(value)
    return "'" + str(value).replace("\\", "\\\\").replace("'", "\\'") + "'"


def settings_clause(settings: Mapping[str, Any] | None) -> str:
    if not settings:
        return ""
    for key in settings:
        if not key.replace("_", "").isalnum():
            raise ClickHouseError(f"not a ClickHouse setting name: {key!r}")
    return " SETTINGS " + ", ".join(f"{k} = {_literal(v)}" for k, v in settings.items())


def json_rows(rows: Sequence[Mapping[str, Any]]) -> str:
    return "\n".join(json.dumps(r, separators=(",", ":"), allow_nan=False) for r in rows)


def json_columns(columns: Mapping[str, Sequence[Any]]) -> str:
    return json.dumps(columns, separators=(",", ":"), allow_nan=False)


def _param_text(value: Any, nested: bool = False) -> str:
    """A query parameter in ClickHouse's text form (what the HTTP interface's param_* carry):
    arrays as [..] of quoted literals, strings with their backslashes escaped."""
    if isinstance(value, list | tuple):
        return "[" + ",".join(_param_text(v, nested=True) for v in value) + "]"
    if isinstance(value, str):
        escaped = value.replace("\\", "\\\\")
        return "'" + escaped.replace("'", "\\'") + "'" if nested else escaped.replace("\t", "\\t").replace("\n", "\\n")
    return _literal(value)


def _decode(text: str | bytes) -> list[list[Any]]:
    if not text:
        return []
    return json.loads(text)["data"]


class ChdbClient:
    """The engine in-process. chDB holds one open folder per process: open one store at a time.
    Its session is one connection whose query parameters are session state, so calls from several
    threads take turns (a lock): without it, one thread's parameters vanish under another's query.

    It tells duplicates: the engine is this process's alone, so the process's count of dropped
    blocks (``DuplicatedInsertedBlocks``), read just before and after an insert under the lock, moves
    only by that insert. The count read after one insert serves as the count before the next, as
    long as no other statement ran between them (a read costs about 3 ms here, as much as counting
    a batch's rows), so a stream of inserts pays one read each."""

    tells_duplicates = True
    _DUPLICATES = "SELECT sum(value) FROM system.events WHERE event = 'DuplicatedInsertedBlocks'"

    def __init__(self, path: str) -> None:
        try:
            from chdb import session
        except ImportError as e:
            raise ClickHouseError(f"chdb:// needs the chdb package: {EXTRA_HINT}") from e
        self.database = CHDB_DATABASE
        self.path = path
        self._lock = threading.Lock()
        self._dups: int | None = None  # the dropped-block count after the last statement, if an insert
        try:
            self._session = session.Session(path)
        except Exception as e:  # chdb raises its own errors, not one base class
            raise ClickHouseError(f"cannot open the chdb folder {path} (one per process at a time): {e}") from e
        self.command(f"CREATE DATABASE IF NOT EXISTS {self.database}")

    def _run(self, sql: str, fmt: str = "CSV", params: Mapping[str, Any] | None = None) -> Any:
        try:
            text = {k: _param_text(v) for k, v in params.items()} if params else None
            with self._lock:
                self._dups = None  # any statement may insert (INSERT ... SELECT): the next insert reads anew
                return self._session.query(sql, fmt, params=text)
        except RuntimeError as e:
            raise ClickHouseError(f"ClickHouse (chdb) refused: {e}") from e

    def _insert(self, sql: str) -> int:
        """Run an INSERT; the blocks the engine dropped as duplicates meanwhile."""
        with self._lock:
            before, self._dups = self._dups, None
            try:
                if before is None:
                    before = self._duplicates()
                self._session.query(sql, "CSV")
                self._dups = self._duplicates()
            except RuntimeError as e:
                raise ClickHouseError(f"ClickHouse (chdb) refused: {e}") from e
            return self._dups - before

    def _duplicates(self) -> int:
        return int(str(self._session.query(self._DUPLICATES, "CSV")).strip() or 0)

    def command(self, sql: str, settings: Mapping[str, Any] | None = None) -> None:
        self._run(sql + settings_clause(settings))

    def insert(
        self, table: str, rows: Sequence[Mapping[str, Any]], columns: Sequence[str], settings: Mapping[str, Any]
    ) -> int | None:
        if not rows:
            return 0
        head = f"INSERT INTO {table} ({', '.join(columns)}){settings_clause(settings)} FORMAT JSONEachRow\n"
        return self._insert(head + json_rows(rows))

    def insert_columns(
        self, table: str, columns: Mapping[str, Sequence[Any]], settings: Mapping[str, Any]
    ) -> int | None:
        head = f"INSERT INTO {table} ({', '.join(columns)}){settings_clause(settings)} FORMAT JSONColumns\n"
        return self._insert(head + json_columns(columns))

    def query(self, sql: str, params: Mapping[str, Any] | None = None) -> list[list[Any]]:
        res = self._run(sql + settings_clause(_READ_SETTINGS), "JSONCompact", params)
        return _decode(res.bytes() if hasattr(res, "bytes") else str(res))

    def close(self) -> None:
        self._session.close()


class HttpClient:
    """A ClickHouse server (or a cluster's load balancer) over HTTP. It cannot tell duplicates:
    the server's counters move with every client's inserts."""

    tells_duplicates = False

    def __init__(self, host: str, port: int, user: str, password: str, database: str) -> None:
        try:
            import clickhouse_connect
            from clickhouse_connect.driver.exceptions import Error
        except ImportError as e:
            raise ClickHouseError(f"clickhouse:// needs clickhouse-connect: {EXTRA_HINT}") from e
        self.database = database
        self._errors = Error
        try:
            self._client = clickhouse_connect.get_client(
                host=host, port=port, username=user, password=password, database=database
            )
        except Error as e:
            raise ClickHouseError(f"cannot reach ClickHouse at {host}:{port} as {user!r}: {e}") from e

    def _call(self, method: str, *args: Any, **kw: Any) -> Any:
        try:
            return getattr(self._client, method)(*args, **kw)
        except self._errors as e:
            raise ClickHouseError(f"ClickHouse refused: {e}") from e

    def command(self, sql: str, settings: Mapping[str, Any] | None = None) -> None:
        self._call("command", sql, settings=dict(settings or {}))

    def insert(
        self, table: str, rows: Sequence[Mapping[str, Any]], columns: Sequence[str], settings: Mapping[str, Any]
    ) -> int | None:
        if rows:
            block = json_rows(rows).encode()
            self._call("raw_insert", table, list(columns), block, settings=dict(settings), fmt="JSONEachRow")
        return None

    def insert_columns(
        self, table: str, columns: Mapping[str, Sequence[Any]], settings: Mapping[str, Any]
    ) -> int | None:
        block = json_columns(columns).encode()
        self._call("raw_insert", table, list(columns), block, settings=dict(settings), fmt="JSONColumns")
        return None

    def query(self, sql: str, params: Mapping[str, Any] | None = None) -> list[list[Any]]:
        return _decode(
            self._call("raw_query", sql, parameters=dict(params or {}), settings=_READ_SETTINGS, fmt="JSONCompact")
        )

    def close(self) -> None:
        self._client.close()


def _redacted(url: str) -> str:
    """``url`` without its password, for error messages."""
    return re.sub(r"//([^:/@]*):[^@/]*@", r"//\1:***@", url)


def connect(url: str) -> Client:
    """A client for ``url``: ``chdb:///abs/folder`` or ``clickhouse://user:password@host:port/db``."""
    parts = urlsplit(url)
    if parts.scheme == "chdb":
        if parts.netloc or not parts.path.startswith("/"):
            raise ClickHouseError(f"a chdb URL names an absolute folder, chdb:///abs/path; got {_redacted(url)!r}")
        return ChdbClient(unquote(parts.path))
    if parts.scheme == "clickhouse":
        database = parts.path.strip("/")
        if not parts.hostname or not database or "/" in database:
            shape = "clickhouse://user:password@host:8123/database"
            raise ClickHouseError(f"a ClickHouse URL is {shape}; got {_redacted(url)!r}")
        return HttpClient(
            parts.hostname,
            parts.port or 8123,
            unquote(parts.username or "default"),
            unquote(parts.password or ""),
            database,
        )
    shapes = "chdb:///abs/path or clickhouse://user:password@host:8123/db"
    raise ClickHouseError(f"not a ClickHouse series URL ({shapes}): {_redacted(url)!r}")
