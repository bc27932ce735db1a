"""FOCUS rows as files: CSV (decimal strings, ISO 8601 UTC times) and Parquet (decimal128, UTC
timestamps). Both carry exactly the columns given (default ``focus_columns.COLUMNS``, FOCUS 1.0;
``focus_v13.columns_for("1.3")`` for 1.3), in that order; a null is an empty CSV cell and a Parquet
null."""

from __future__ import annotations

import datetime as dt
import io
from collections.abc import Sequence
from decimal import Decimal
from typing import Any, BinaryIO

from gpuledger.core.chargeback.focus import FocusExport
from gpuledger.core.chargeback.focus_columns import COLUMNS, FocusColumn
from gpuledger.reports.safe_csv import SafeCsvWriter

__all__ = ["focus_csv", "is_parquet_path", "write_focus_parquet"]

_DECIMAL_PRECISION = 38  # decimal128


def is_parquet_path(path: str | None) -> bool:
    return bool(path) and str(path).lower().endswith(".parquet")


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, Decimal):
        return format(value, "f")
    if isinstance(value, dt.datetime):
        return value.strftime("%Y-%m-%dT%H:%M:%SZ")
    return str(value)


def focus_csv(export: FocusExport, columns: Sequence[FocusColumn] = COLUMNS) -> str:
    """A string cell (a team, user or run name in a tag or a name) that a spreadsheet would take as a
    formula is neutralised (reports/safe_csv.py); decimal columns keep their numbers, negative ones too."""
    out = io.StringIO()
    names = [c.name for c in columns]
    writer = SafeCsvWriter(out, names, frozenset(c.name for c in columns if c.kind == "decimal"))
    writer.writerows([_cell(row[n]) for n in names] for row in export.rows)
    return out.getvalue()


def _arrow_type(pa: Any, column: FocusColumn) -> Any:
    if column.kind == "decimal":
        return pa.decimal128(_DECIMAL_PRECISION, column.places)
    if column.kind == "datetime":
        return pa.timestamp("s", tz="UTC")
    return pa.string()


def write_focus_parquet(export: FocusExport, path: str | BinaryIO, columns: Sequence[FocusColumn] = COLUMNS) -> None:
    """Write the rows to ``path``; decimals keep every place (pyarrow refuses to round one)."""
    from gpuledger.extras import require

    pa = require("pyarrow", extra="parquet", purpose="FOCUS Parquet output")
    pq = require("pyarrow.parquet", extra="parquet", purpose="FOCUS Parquet output")
    schema = pa.schema([pa.field(c.name, _arrow_type(pa, c)) for c in columns])
    table = pa.table({c.name: [row[c.name] for row in export.rows] for c in columns}, schema=schema)
    pq.write_table(table, path)
