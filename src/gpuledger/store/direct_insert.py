"""Many-row inserts on SQLite, run on the DBAPI cursor with SQLAlchemy's own statement and binds.

A recording run flushes its intervals every few seconds. On SQLite most of a flush's CPU was
SQLAlchemy's per-statement machinery (execution context, parameter processing, result set), not
the inserts, and more so in the live recorder, which wakes once a second with cold CPU caches
(BENCHMARKS.md, "recorder CPU per sample"). So here:

* the statement is the one ``Connection.execute`` would run: compiled by SQLAlchemy for the
  dialect and the rows' columns (as it compiles an executemany), once per table and column set;
* each value goes through the bind processor SQLAlchemy gives that column's type (NaN as NULL,
  JSON, booleans, ...), so the stored rows are the same;
* the rows go to the DBAPI cursor's ``executemany`` inside the caller's transaction, which
  ``Database.write`` begins, commits and retries as before; a DBAPI error is raised as
  SQLAlchemy's own exception (``IntegrityError`` for a run deleted meanwhile, ...), so callers
  see what they saw before.

Anything else (PostgreSQL, a named paramstyle, a column the rows do not give, rows with differing
columns) runs through ``Connection.execute`` unchanged.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import sqlalchemy as sa
from sqlalchemy.engine import Connection


class _Plan(NamedTuple):
    sql: str
    values: Callable[[dict[str, Any]], Any]  # a row's values in parameter order (a tuple)
    processors: tuple[tuple[int, Callable[[Any], Any]], ...]  # (parameter index, bind processor)


class DirectInserts:
    """The compiled plans of one SQLite database's many-row inserts, by table and column set."""

    def __init__(self, dialect: sa.Dialect) -> None:
        self._dialect = dialect
        self._plans: dict[tuple[str, tuple[str, ...]], _Plan | None] = {}

    def execute(self, conn: Connection, stmt: Any, table: sa.Table, rows: Sequence[dict[str, Any]]) -> None:
        """``conn.execute(stmt, rows)``, on the DBAPI cursor where that stores the same rows."""
        plan = self._plan_for(stmt, table, rows)
        if plan is None:
            conn.execute(stmt, rows)  # SQLAlchemy's own path (it requires one column set too)
            return
        params = _params(plan, rows)
        cursor = conn.connection.cursor()
        try:
            cursor.executemany(plan.sql, params)
        except self._dialect.loaded_dbapi.Error as exc:  # as SQLAlchemy raises it (IntegrityError, ...)
            raise sa.exc.DBAPIError.instance(plan.sql, params, exc, self._dialect.loaded_dbapi.Error) from exc
        finally:
            cursor.close()

    def execute_on(self, cursor: Any, stmt: Any, table: sa.Table, rows: Sequence[dict[str, Any]]) -> bool:
        """The same on a DBAPI cursor (its errors raised as they come); False: not a case for it."""
        if not rows:
            return True
        plan = self._plan_for(stmt, table, rows)
        if plan is None:
            return False
        cursor.executemany(plan.sql, _params(plan, rows))
        return True

    def _plan_for(self, stmt: Any, table: sa.Table, rows: Sequence[dict[str, Any]]) -> _Plan | None:
        columns = rows[0].keys()
        key = (table.name, tuple(columns))
        if key not in self._plans:
            self._plans[key] = _plan(stmt, key[1], self._dialect)
        plan = self._plans[key]
        if plan is None or any(row.keys() != columns for row in rows):
            return None
        return plan


def _params(plan: _Plan, rows: Sequence[dict[str, Any]]) -> list[tuple[Any, ...]]:
    params = list(map(plan.values, rows))
    if plan.processors:
        params = [_processed(p, plan.processors) for p in params]
    return params


def _processed(values: tuple[Any, ...], processors: tuple[tuple[int, Callable[[Any], Any]], ...]) -> tuple[Any, ...]:
    out = list(values)
    for i, process in processors:
        out[i] = process(out[i])  # every value, None too, as SQLAlchemy calls them
    return tuple(out)


def _plan(stmt: Any, columns: tuple[str, ...], dialect: sa.Dialect) -> _Plan | None:
    """The SQL, its parameters' order and bind processors; None: not a case for the cursor."""
    if dialect.name != "sqlite":
        return None
    compiled = stmt.compile(dialect=dialect, column_keys=list(columns))
    names = compiled.positiontup
    if not names or not set(names) <= set(columns):
        return None  # a named paramstyle, or a column filled by a default: SQLAlchemy's path
    processors = tuple(
        (i, proc)
        for i, name in enumerate(names)
        if (proc := compiled.binds[name].type.dialect_impl(dialect).bind_processor(dialect)) is not None
    )
    values = operator.itemgetter(*names) if len(names) > 1 else (lambda row, name=names[0]: (row[name],))
    return _Plan(compiled.string, values, processors)
