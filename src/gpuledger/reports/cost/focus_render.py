"""FOCUS rows as files: CSV (decimal strings, ISO 8601 UTC times) and Parquet (decimal128, UTC
timestamps). Both carry exactly the columns given (``focus_v13.columns_for(version)``), in that
order; a null is an empty CSV cell and a Parquet null. Without columns, FOCUS 1.3 as the CLI's
``--format focus`` writes by default: a 1.0 export (``chargeback_focus``, ``capacity_focus``) is
converted first (``focus_v13.to_v13``); pass ``columns_for("1.0")`` for a 1.0 file."""

from __future__ import annotations

import datetime as dt
import io
from collections.abc import Sequence
from decimal import Decimal
from typing import Any, BinaryIO

from gpuledger.core.chargeback.focus import FocusExport
from gpuledger.core.chargeback.focus_columns import FocusColumn
from gpuledger.core.chargeback.focus_v13 import columns_for, to_v13
from gpuledger.reports.safe_csv import SafeCsvWriter

__all__ = ["DEFAULT_FOCUS_VERSION", "focus_csv", "is_parquet_path", "write_focus_parquet"]

DEFAULT_FOCUS_VERSION = "1.3"  # the CLI's --focus-version default (cli/focus_output.py), kept equal by a test

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


def _dataset(export: FocusExport, columns: Sequence[FocusColumn] | None) -> tuple[FocusExport, Sequence[FocusColumn]]:
    """The rows and columns to write: those given, or the default version's, converting a 1.0 export."""
    if columns is not None:
        return export, columns
    columns = columns_for(DEFAULT_FOCUS_VERSION)
    if export.rows and any(c.name not in export.rows[0] for c in columns):
        export = to_v13(export)  # a ValueError for shared idle rows: their allocations need the chargeback
    return export, columns


def focus_csv(export: FocusExport, columns: Sequence[FocusColumn] | None = None) -> str:
    """A string cell (a team, user or run name in a tag or a name) that a spreadsheet would take as a
    formula is neutralised (reports/safe_csv.py); decimal columns keep their numbers, negative ones too."""
    export, columns = _dataset(export, columns)
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


def write_focus_parquet(
    export: FocusExport, path: str | BinaryIO, columns: Sequence[FocusColumn] | None = None
) -> None:
    """Write the rows to ``path``; decimals keep every place (pyarrow refuses to round one)."""
    export, columns = _dataset(export, columns)
    from gpuledger.extras import require

    pa = require("pyarrow", extra="parquet", purpose="FOCUS Parquet output")
    pq = require("pyarrow.parquet", extra="parquet", purpose="FOCUS Parquet output")
    schema = pa.schema([pa.field(c.name, _arrow_type(pa, c)) for c in columns])
    table = pa.table({c.name: [row[c.name] for row in export.rows] for c in columns}, schema=schema)
    pq.write_table(table, path)
