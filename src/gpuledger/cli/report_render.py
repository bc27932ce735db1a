"""Terminal renderings of the report commands (rich tables on stdout)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

_VERDICT = {"better": "green", "worse": "red"}


def compare_table(model: dict[str, Any], console: Console | None = None) -> None:
    console = console or Console()
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


def rows_table(title: str, columns: list[tuple[str, str]], rows: list[dict[str, Any]],
               console: Console | None = None) -> None:
    """A plain table of dict rows: ``columns`` = [(key, header)]; numbers right-aligned."""
    console = console or Console()
    table = Table(title=title)
    numeric = {k for k, _ in columns if any(isinstance(r.get(k), int | float) for r in rows)}
    for key, header in columns:
        table.add_column(header, justify="right" if key in numeric else "left")
    for r in rows:
        table.add_row(*(_cell(r.get(k)) for k, _ in columns))
    console.print(table)


def _cell(value: Any) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:,.2f}" if abs(value) >= 0.01 or value == 0 else f"{value:.2g}"
    if isinstance(value, list | tuple):
        return ", ".join(str(v) for v in value)
    return str(value)
