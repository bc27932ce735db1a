"""The report commands' text tables (cost, chargeback, capacity, fleet) fitted to the terminal.

The report renderers build their tables as rows of text cells and take the function that lays
them out (reports/cost/render.py, reports/capacity/render.py); on a terminal the CLI passes
``grid_fitter``: the same rule as every CLI table (cli/table_fit.py). What each column holds is
read from the table itself: the first column names the row (a run, a team, a host) and is kept
whole with ids, GPU indexes and statuses; a column of figures is a number; the rest is text.
Piped, the renderers keep their plain aligned text.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Callable

from gpuledger.cli.table_fit import Column, table_lines

KEY_HEADERS = frozenset({"RUN_ID", "RUN ID", "RUN", "ID", "GPU", "STATUS", "RANK"})
# Figures a reader looks for first, most important first; the others keep their order.
FIRST = ("COST", "FLEET COST", "TOTAL", "WITH IDLE", "IDLE COST", "BILLED", "SHARED IDLE", "GPUS", "BUSY",
         "UTIL", "BUSY GPU-H", "ALLOC GPU-H", "FLEET GPU-H", "IDLE GPU-H", "RUNS", "SHARE")  # fmt: skip
LAST = frozenset({"FLAGS"})  # a note on the row, given way first
# A figure as core/units.py writes them: 0.0123, 1,234.56, <0.01, -3.5, 62%, +12%, n/a; a short id
# that starts with a digit (3q2861m5) is not one.
_FIGURE = re.compile(r"^(?:[<>]?[-+]?[\d,]*\.?\d+%?|n/a|-|—)$")
INDENT = "  "


def _is_figure(cell: str) -> bool:
    return cell == "" or bool(_FIGURE.match(cell))


def columns_of(table: list[list[str]]) -> list[Column]:
    """Column kinds and priorities read from a table whose first row is the header."""
    header, rows = table[0], table[1:]
    n = len(header)
    out = []
    for i, name in enumerate(header):
        cells = [r[i] for r in rows]
        figure = bool(rows) and all(_is_figure(c) for c in cells) and any(cells)
        if i == 0 or name in KEY_HEADERS:
            kind = "key"
        elif figure:
            kind = "number"
        else:
            kind = "text"
        # Named figures first, then text (models, users) before unnamed figures, left before right.
        rank = FIRST.index(name) if name in FIRST else None
        priority = 3 * n + len(FIRST) - rank if rank is not None else (2 * n - i if kind == "text" else n - i)
        if name in LAST:
            priority = 0
        out.append(Column(name, kind, priority=priority, min_width=8, right=figure and i > 0))  # type: ignore[arg-type]
    return out


def grid_fitter(width: int) -> Callable[[list[list[str]]], str]:
    """A table's text at most ``width`` wide, indented as the reports indent their tables."""

    def render(table: list[list[str]]) -> str:
        lines = table_lines(columns_of(table), table[1:], width - len(INDENT))
        return "\n".join((INDENT + line).rstrip() for line in lines)

    return render


def grid_lines(width: int) -> Callable[[list[list[str]]], list[str]]:
    """As ``grid_fitter`` without the indent, as lines (``gpuledger show``'s epoch table)."""
    return lambda table: table_lines(columns_of(table), table[1:], width)


def fit_prose(text: str, width: int) -> str:
    """Titles and notes around the tables: a line longer than the terminal is wrapped at spaces,
    its continuation indented (table lines are already fitted and stay as they are)."""
    out = []
    for line in text.split("\n"):
        if len(line) <= width:
            out.append(line)
            continue
        lead = line[: len(line) - len(line.lstrip())]
        out += textwrap.wrap(
            line, width, initial_indent="", subsequent_indent=lead + "  ", break_long_words=True, drop_whitespace=True
        )
    return "\n".join(out)


def terminal_width() -> int | None:
    """The width of the terminal stdout is, or None when it is piped or a file."""
    from gpuledger.cli.render import console

    out = console()
    return out.width if out.is_terminal else None


def terminal_text(fitted: Callable[[Callable[[list[list[str]]], str]], str], piped: Callable[[], str]) -> str:
    """A report's text for stdout: ``fitted(grid_fitter(width))`` with its prose wrapped on a
    terminal, ``piped()`` (plain aligned text, nothing cut) otherwise."""
    width = terminal_width()
    if width is None:
        return piped()
    return fit_prose(fitted(grid_fitter(width)), width)
