"""Terminal renderings of the report commands (rich tables on stdout)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from gpuledger.cli.render import console as terminal
from gpuledger.cli.render import plain, print_table
from gpuledger.cli.table_fit import Column
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
