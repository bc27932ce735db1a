"""Terminal renderings of the report commands (rich tables on stdout)."""

from __future__ import annotations

from typing import Any

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from gpuledger.cli.render import console as terminal
from gpuledger.core.units import NA, fmt_number

_VERDICT = {"better": "green", "worse": "red"}


def compare_table(model: dict[str, Any], console: Console | None = None) -> None:
    console = console or terminal()
    table = Table(title="gpuledger compare (differences against the first run)", show_lines=False)
    table.add_column("figure", style="bold")
    for run in model["runs"]:
        table.add_column(run["label"], justify="right")
    for row in model["rows"]:
        cells: list[Any] = [row["label"]]
        for cell in row["cells"]:
            text = Text(cell["text"])
            if cell.get("diff"):
                text.append(f" ({cell['diff']})", style=_VERDICT.get(cell.get("verdict") or "", "dim"))
            cells.append(text)
        table.add_row(*cells)
    console.print(table)
    for note in model.get("notes") or []:
        console.print(f"[dim]{note}[/dim]")


def rows_table(
    title: str,
    columns: list[tuple[str, str]],
    rows: list[dict[str, Any]],
    console: Console | None = None,
    whole: tuple[str, ...] = (),
) -> None:
    """A plain table of dict rows: ``columns`` = [(key, header)]; numbers right-aligned. Columns in
    ``whole`` (ids, statuses) and numbers are never cut or wrapped: text columns give way."""
    console = console or terminal()
    table = Table(title=title, box=box.SIMPLE_HEAD)
    numeric = {k for k, _ in columns if any(isinstance(r.get(k), int | float) for r in rows)}
    cells = [[_cell(r.get(k)) for k, _ in columns] for r in rows]
    for i, (key, header) in enumerate(columns):
        widest = max([len(header), *(len(c[i]) for c in cells)])
        keep = {"no_wrap": True, "min_width": widest} if key in whole or key in numeric else {}
        table.add_column(header, justify="right" if key in numeric else "left", **keep)  # type: ignore[arg-type]
    for row in cells:
        table.add_row(*(escape(c) for c in row))
    console.print(table)


def _cell(value: Any) -> str:
    if value is None:
        return NA
    if isinstance(value, float):
        return fmt_number(value)
    if isinstance(value, list | tuple):
        return ", ".join(str(v) for v in value)
    return str(value)
