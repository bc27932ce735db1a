"""Terminal rendering of lists and tables (rich), kept apart from the commands."""

from __future__ import annotations

import re

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from gpuledger.core.units import fmt_duration

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def plain(text: object) -> str:
    """User text for the terminal: no rich markup and no control characters (escape sequences)."""
    return escape(_CONTROL.sub("?", str(text)))


def runs_table(rows: list[dict]) -> None:
    import sys

    # A pipe gets a wide table rather than rich's 80-column default: ids and commands stay whole.
    console = Console(width=None if sys.stdout.isatty() else 200)
    if not rows:
        console.print("no runs yet: record one with [bold]gpuledger run -- COMMAND[/bold]")
        return
    table = Table(box=None, header_style="bold")
    for col in ("ID", "STATUS", "STARTED (UTC)", "WALL", "GPUS", "BUSY GPU-H", "PROJECT", "TEAM", "USER"):
        table.add_column(col, no_wrap=True, min_width=len(col))
    table.add_column("NAME / COMMAND", overflow="ellipsis", no_wrap=True, ratio=1)
    for r in rows:
        busy = "—" if r["busy_gpu_hours"] is None else f"{r['busy_gpu_hours']:.3f}"
        label = plain(r["name"] or " ".join(r["command"]))
        if r["replayed"]:
            label = f"\\[replayed] {label}"
        table.add_row(
            r["id"][:13],
            r["status"],
            (r["started_at"] or "")[:16].replace("T", " "),
            fmt_duration(r["wall_seconds"]),
            str(r["gpus"]),
            busy,
            plain(r["project"] or ""),
            plain(r["team"] or ""),
            plain(r["user"]),
            label,
        )
    console.print(table)
