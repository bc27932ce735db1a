"""Terminal rendering of the CLI's tables: one renderer that knows the terminal width (table_fit.py
decides the layout, rich knows the terminal), kept apart from the commands."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from rich.console import Console
from rich.markup import escape
from rich.text import Text

from gpuledger.cli.table_fit import Column, clean, cut, table_lines
from gpuledger.core.units import NA, fmt_duration, fmt_hours

PIPE_WIDTH = 100_000  # a pipe or file gets whole lines: nothing is cut for a script to miss


def plain(text: object) -> str:
    """User text for the terminal: no rich markup and no control characters (escape sequences)."""
    return escape(clean(text))


class _Stdout(Console):
    def on_broken_pipe(self) -> None:
        # rich would exit 1 here; the CLI ends a stopped reader (| head) quietly with 0 (cli/main.py)
        raise BrokenPipeError


def console() -> Console:
    """stdout as rich sees it: the terminal's width, or a pipe that cuts nothing."""
    return _Stdout(width=None if sys.stdout.isatty() else PIPE_WIDTH)


def print_lines(out: Console, lines: Sequence[str], bold_first: bool = False) -> None:
    """Lines already fitted: printed as they are, never wrapped or cropped again by rich."""
    for n, line in enumerate(lines):
        style = "bold" if bold_first and n == 0 and out.is_terminal else ""
        out.print(Text(line, style=style), soft_wrap=True)


def print_table(
    columns: Sequence[Column],
    rows: Sequence[Sequence[str]],
    title: str | None = None,
    out: Console | None = None,
) -> None:
    """A table on stdout: fitted to the terminal's width, or whole and unpadded when piped."""
    out = out or console()
    width = out.width if out.is_terminal else None
    if title:
        print_lines(out, [clean(title) if width is None else cut(clean(title), width)])
    print_lines(out, table_lines(columns, rows, width), bold_first=bool(rows))


RUN_COLUMNS = (
    Column("ID", "key"),
    Column("STATUS", "key"),
    Column("STARTED (UTC)", "number", priority=4),
    Column("WALL", "number", priority=6, right=True),
    Column("GPUS", "number", priority=5, right=True),
    Column("BUSY GPU-H", "number", priority=7, right=True),
    Column("PROJECT", "text", priority=3, min_width=7),
    Column("TEAM", "text", priority=2, min_width=6),
    Column("USER", "text", priority=8, min_width=6),
    Column("NAME / COMMAND", "text", priority=9, min_width=12),
)


def run_cells(r: dict) -> list[str]:
    label = ("[replayed] " if r["replayed"] else "") + (r["name"] or " ".join(r["command"]))
    return [
        r.get("short_id") or r["id"],
        r["status"],
        (r["started_at"] or "")[:16].replace("T", " "),
        fmt_duration(r["wall_seconds"]),
        str(r["gpus"]),
        NA if r["busy_gpu_hours"] is None else fmt_hours(r["busy_gpu_hours"]),
        str(r.get("project") or ""),
        str(r.get("team") or ""),
        str(r.get("user") or ""),
        label,
    ]


def runs_table(rows: list[dict]) -> None:
    """``gpuledger runs``: ids (short ids) and statuses are never cut; on a terminal too narrow for
    everything, team and project give way first, then the start time; the user and the name or
    command stay (cut) so that rows can be told apart."""
    print_table(RUN_COLUMNS, [run_cells(r) for r in rows])
