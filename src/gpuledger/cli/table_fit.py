"""Fitting a table of text cells to a terminal width: the one layout rule of every CLI table.

Each column says what it holds (``Column.kind``):

- ``key``: ids and statuses. Always shown, never cut.
- ``number``: figures. Never cut; when even cut text does not make room, the least important are
  left out (``priority``), and the table says which under it.
- ``text``: names, commands, users. Cut with ``…`` down to ``min_width``, then left out.

On a terminal (``fit``): every line is at most the width, one line per row. When the key columns
alone do not fit, the table falls back to the narrow layout (``narrow_lines``): one line per cell,
``HEADER: value``, text cut to the width, keys and numbers whole.

Piped (``plain_lines``): whole values, columns two spaces apart and aligned, but a column is not
padded beyond ``PIPE_ALIGN_MAX`` (one 10 kB name must not pad every other line) and no line ends in
spaces.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from rich.cells import cell_len, set_cell_size

GAP = 2  # spaces between columns
ELLIPSIS = "…"
PIPE_ALIGN_MAX = 40  # piped: columns are aligned up to this width, longer cells just push the line
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")

Kind = Literal["key", "number", "text"]


@dataclass(frozen=True)
class Column:
    header: str
    kind: Kind = "text"
    priority: int = 0  # higher: kept longer (a key column is always kept)
    min_width: int = 6  # text: narrowest cut, the ellipsis included
    right: bool = False  # right-aligned (numbers)


@dataclass(frozen=True)
class Layout:
    shown: tuple[int, ...]  # indexes of the columns shown, in table order
    widths: tuple[int, ...]  # one per shown column
    hidden: tuple[int, ...]  # indexes of the columns left out


def clean(text: object) -> str:
    """A cell for a terminal: control characters (escape sequences) become ``?``."""
    return _CONTROL.sub("?", "" if text is None else str(text))


def cells(text: str) -> int:
    """Terminal columns ``text`` takes: a CJK character or an emoji takes two."""
    return cell_len(text)


def cut(text: str, width: int) -> str:
    """``text`` in at most ``width`` terminal columns, a cut one ending in ``…``."""
    if cells(text) <= width:
        return text
    if width <= 0:
        return ""
    # set_cell_size pads with a space where a wide character would straddle the end: drop it
    return set_cell_size(text, width - 1).rstrip(" ") + ELLIPSIS


def _pad(text: str, width: int, right: bool) -> str:
    fill = " " * max(0, width - cells(text))
    return fill + text if right else text + fill


def natural_widths(columns: Sequence[Column], rows: Sequence[Sequence[str]]) -> list[int]:
    return [max([cells(c.header), *(cells(r[i]) for r in rows)]) for i, c in enumerate(columns)]


def _floor(column: Column, natural: int) -> int:
    """The narrowest a column may be: whole for keys and numbers, ``min_width`` for text."""
    return natural if column.kind != "text" else min(natural, max(1, column.min_width))


def _need(widths: Sequence[int]) -> int:
    return sum(widths) + GAP * max(0, len(widths) - 1)


def fit(columns: Sequence[Column], rows: Sequence[Sequence[str]], width: int) -> Layout | None:
    """Which columns to show and how wide, so that every line is at most ``width``; None when the
    key columns alone do not fit (the narrow layout then)."""
    natural = natural_widths(columns, rows)
    floors = [_floor(c, n) for c, n in zip(columns, natural, strict=True)]
    shown = list(range(len(columns)))
    # Leave out the least important non-key column until the floors fit.
    while _need([floors[i] for i in shown]) > width:
        droppable = [i for i in shown if columns[i].kind != "key"]
        if not droppable:
            return None
        shown.remove(min(droppable, key=lambda i: (columns[i].priority, -i)))
    # A wide column left out may have made room for a narrower, less important one: take it back.
    for i in sorted(set(range(len(columns))) - set(shown), key=lambda i: (-columns[i].priority, i)):
        if _need([floors[j] for j in [*shown, i]]) <= width:
            shown = sorted([*shown, i])
    # Then give the room left to the cut text columns, most important first.
    widths = {i: floors[i] for i in shown}
    room = width - _need(list(widths.values()))
    for i in sorted(shown, key=lambda i: (-columns[i].priority, i)):
        extra = min(room, natural[i] - widths[i])
        widths[i] += extra
        room -= extra
    hidden = tuple(i for i in range(len(columns)) if i not in shown)
    return Layout(tuple(shown), tuple(widths[i] for i in shown), hidden)


def _line(row: Sequence[str], widths: Sequence[int], right: Sequence[bool]) -> str:
    parts = [_pad(c, w, r) for c, w, r in zip(row, widths, right, strict=True)]
    return (" " * GAP).join(parts).rstrip()


def fitted_lines(columns: Sequence[Column], rows: Sequence[Sequence[str]], layout: Layout) -> list[str]:
    """The header and one line per row, text cut to the layout's widths."""
    right = [columns[i].right for i in layout.shown]
    table = [[c.header for c in columns], *rows]
    return [
        _line([cut(row[i], w) for i, w in zip(layout.shown, layout.widths, strict=True)], layout.widths, right)
        for row in table
    ]


def narrow_lines(columns: Sequence[Column], rows: Sequence[Sequence[str]], width: int) -> list[str]:
    """The fallback for a terminal too narrow for the key columns: each row a block of
    ``HEADER: value`` lines, text cut to the width, keys and numbers whole; blank line between."""
    out: list[str] = []
    for n, row in enumerate(rows):
        if n:
            out.append("")
        for column, cell in zip(columns, row, strict=True):
            label = f"{column.header}: "
            if column.kind == "text":
                cell = cut(cell, max(1, width - cells(label)))
            out.append((label + cell).rstrip())
    return out


def plain_lines(columns: Sequence[Column], rows: Sequence[Sequence[str]]) -> list[str]:
    """Piped output: whole values, two spaces apart, aligned up to ``PIPE_ALIGN_MAX``."""
    widths = [min(w, PIPE_ALIGN_MAX) for w in natural_widths(columns, rows)]
    right = [c.right for c in columns]
    return [_line(row, widths, right) for row in [[c.header for c in columns], *rows]]


def hidden_note(columns: Sequence[Column], layout: Layout, width: int) -> list[str]:
    """The lines under a table that left columns out, wrapped to the width."""
    if not layout.hidden:
        return []
    names = ", ".join(columns[i].header for i in layout.hidden)
    text = f"not shown at this width: {names} (a wider terminal, or --json)"
    lines = textwrap.wrap(text, max(1, width), subsequent_indent="  " if width > 8 else "", break_long_words=True)
    return [cut(line, width) for line in lines]  # textwrap counts characters, a terminal columns


def table_lines(columns: Sequence[Column], rows: Sequence[Sequence[str]], width: int | None) -> list[str]:
    """The table as lines: fitted to ``width`` (a terminal), or whole values when None (a pipe)."""
    rows = [[clean(c) for c in row] for row in rows]
    if width is None:
        return plain_lines(columns, rows)
    if rows:  # on a terminal a column empty on every row only takes room (no flags, no team)
        kept = [i for i, c in enumerate(columns) if c.kind == "key" or any(r[i] for r in rows)]
        columns = [columns[i] for i in kept]
        rows = [[r[i] for i in kept] for r in rows]
    layout = fit(columns, rows, width)
    if layout is None:
        return narrow_lines(columns, rows, width)
    lines = fitted_lines(columns, rows, layout)
    return lines + hidden_note(columns, layout, width)
