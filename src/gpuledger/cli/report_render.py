"""Terminal renderings of the report commands (rich tables on stdout)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.text import Text

from gpuledger.cli.render import console as terminal
from gpuledger.cli.render import plain, print_lines, print_table
from gpuledger.cli.table_fit import GAP, Column, Layout, clean, cut, fit, fitted_lines, hidden_note
from gpuledger.core.units import NA, fmt_number

_VERDICT = {"better": "green", "worse": "red"}


def compare_table(model: dict[str, Any], console: Console | None = None) -> None:
    """Figures down, runs across, each cell with its difference against the first run (green when
    better, red when worse); the same fitting rule as every table: runs on the right give way."""
    out = console or terminal()
    n = len(model["runs"])
    columns = [Column("figure", "key")] + [
        Column(_run_header(run), "number", priority=n - i, right=True) for i, run in enumerate(model["runs"])
    ]
    rows = [
        [row["label"]] + [c["text"] + (f" ({c['diff']})" if c.get("diff") else "") for c in row["cells"]]
        for row in model["rows"]
    ]
    title = "gpuledger compare (differences against the first run)"
    width = out.width if out.is_terminal else None
    layout = None if width is None else fit(columns, [[clean(c) for c in r] for r in rows], width)
    if layout is None:  # piped, or narrower than the figure names: plain lines
        print_table(columns, rows, title=title, out=out)
    else:
        print_lines(out, [cut(title, width or 0)])
        lines = fitted_lines(columns, [[clean(c) for c in r] for r in rows], layout)
        print_lines(out, lines[:1], bold_first=True)
        for row, line in zip(model["rows"], lines[1:], strict=True):
            out.print(_coloured(line, row["cells"], layout), soft_wrap=True)
        print_lines(out, hidden_note(columns, layout, width or 0))
    for note in model.get("notes") or []:
        out.print(f"[dim]{plain(note)}[/dim]")  # prose: wrapped at words on a terminal


def _run_header(run: dict[str, Any]) -> str:
    """A run's column: its short id first (whole), then its name, cut (a 10 kB name is not a header)."""
    from gpuledger.core.ids import short_id

    sid = short_id(str(run["id"]))
    return sid if not run.get("name") else f"{sid} {cut(clean(run['name']), 24)}"


def _coloured(line: str, cells: list[dict[str, Any]], layout: Layout) -> Text:
    """A fitted row with each shown difference in its verdict's colour (figures are right-aligned
    and never cut, so a difference ends where its column ends)."""
    text = Text(line)
    start = 0
    for i, w in zip(layout.shown, layout.widths, strict=True):
        end = start + w
        cell = cells[i - 1] if i else {}
        if cell.get("diff"):
            diff = f"({cell['diff']})"
            text.stylize(_VERDICT.get(cell.get("verdict") or "", "dim"), end - len(diff), end)
        start = end + GAP
    return text


def rows_table(
    title: str,
    columns: list[tuple[str, str]],
    rows: list[dict[str, Any]],
    console: Console | None = None,
    whole: tuple[str, ...] = (),
) -> None:
    """A table of dict rows: ``columns`` = [(key, header)], most important first; numbers
    right-aligned. Columns in ``whole`` (ids, statuses) and numbers are never cut: on a narrow
    terminal text columns are cut, then the last ones left out (cli/table_fit.py)."""
    if not rows:  # a header with nothing under it reads like a broken table
        (console or terminal()).print(plain(f"{title}: none"), soft_wrap=True)
        return
    numeric = {k for k, _ in columns if any(isinstance(r.get(k), int | float) for r in rows)}
    n = len(columns)
    spec = [
        Column(
            header,
            "key" if key in whole else "number" if key in numeric else "text",
            priority=n - i,
            min_width=8,
            right=key in numeric,
        )
        for i, (key, header) in enumerate(columns)
    ]
    print_table(spec, [[_cell(r.get(k)) for k, _ in columns] for r in rows], title=title, out=console or terminal())


def _cell(value: Any) -> str:
    if value is None:
        return NA
    if isinstance(value, float):
        return fmt_number(value)
    if isinstance(value, list | tuple):
        return ", ".join(str(v) for v in value)
    return str(value)
