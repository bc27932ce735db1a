"""``gpuledger top``: a live terminal view of the runs recording on this machine (reports/run/top.py).

On a terminal the view redraws in place; piped or redirected, it prints a plain-text frame every
``--interval`` seconds (like ``top -b``), so a log or ``watch`` gets whole lines with whole ids.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import click

from gpuledger.cli.common import FiniteFloat, cli_errors, db_option, echo_json, format_option, open_ledger
from gpuledger.cli.table_fit import Column, cut, table_lines
from gpuledger.core.ids import short_id
from gpuledger.core.units import NA, fmt_count, fmt_duration, fmt_number, fmt_pct

# One line per run, one per GPU under it (as nvitop and htop): on a narrow terminal the user and
# the run or GPU name are cut first, then the least useful figures left out; ids never.
COLUMNS = (
    Column("RUN", "key"),
    Column("USER", "text", priority=7, min_width=4),
    Column("EPOCH", "number", priority=6, right=True),
    Column("ETA", "number", priority=5, right=True),
    Column("CPU", "number", priority=4, right=True),
    Column("UTIL", "number", priority=9, right=True),
    Column("VRAM", "number", priority=8, right=True),
    Column("RUN MEM", "number", priority=3, right=True),
    Column("POWER", "number", priority=2, right=True),
    Column("TEMP", "number", priority=1, right=True),
    Column("AGE", "number", priority=0, right=True),
    Column("NAME / GPU", "text", priority=10, min_width=16),
)


def _title(rows: list[dict[str, Any]], now: float) -> str:
    recording = fmt_count(len(rows), "run")
    return f"gpuledger top · {time.strftime('%H:%M:%S', time.localtime(now))} · {recording} recording on this machine"


def _gib(n: float | None) -> str:
    """Bytes in GiB for a narrow cell: 9.0, 80, 0.5 (the unit follows the pair: 9.0/80G)."""
    if n is None:
        return "-"
    gib = n / 2**30
    return f"{gib:.1f}" if gib < 10 else f"{gib:.0f}"


def _num(value: float | None, unit: str, digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}{unit}"


def cells(rows: list[dict[str, Any]]) -> list[list[str]]:
    """A line of text cells per live run, then one per GPU it uses."""
    out = []
    for r in rows:
        epoch = "-" if r["epoch"] is None else f"{r['epoch']}/{r['epochs'] or '?'}"
        eta = fmt_duration(r["eta_s"]) if r["eta_s"] is not None else "-"
        cpu = NA if r["cpu_cores"] is None else fmt_number(r["cpu_cores"])
        name = ("[replayed] " if r["replayed"] else "") + (r["name"] or "")
        gpus = r["gpus"] or []
        unknown = "no GPU" if r.get("sampled", True) else "no sample yet"  # before the first flush
        note = [] if gpus else [unknown, "", "", "", "", ""]
        out.append([short_id(r["id"]), r["user"] or "", epoch, eta, cpu, *(note or [""] * 6), name])
        for g in gpus:
            index = "?" if g["index"] is None else g["index"]
            out.append(
                [
                    f"  GPU {index}", "", "", "", "",
                    fmt_pct(g["util"]),
                    f"{_gib(g['mem_used_b'])}/{_gib(g['mem_total_b'])}G",
                    _gib(g["proc_mem_b"]) + ("G" if g["proc_mem_b"] is not None else ""),
                    _num(g["power_w"], "W"),
                    _num(g["temp_c"], "°C"),
                    _num(g["age_s"], "s"),
                    str(g["name"] or ""),
                ]
            )  # fmt: skip
    return out


class Frame:
    """The view as rich renders it: fitted to the width it is drawn at (a resized terminal
    redraws fitted), one line per run and per GPU, never wrapped."""

    def __init__(self, rows: list[dict[str, Any]], now: float) -> None:
        self.rows, self.now = rows, now

    def __rich_console__(self, console: Any, options: Any) -> Any:
        from rich.text import Text

        width = options.max_width
        lines = [cut(_title(self.rows, self.now), width)]
        if self.rows:
            lines += table_lines(COLUMNS, cells(self.rows), width)
        else:
            lines.append("no run is recording here")
        text = Text("\n".join(lines), no_wrap=True, overflow="crop")
        if self.rows:
            start = len(lines[0]) + 1
            text.stylize("bold", start, start + len(lines[1]))
        yield text


def frame(rows: list[dict[str, Any]], now: float) -> Frame:
    return Frame(rows, now)


def plain_frame(rows: list[dict[str, Any]], now: float) -> str:
    """The same frame piped: whole values, columns two spaces apart, no colours or box drawing."""
    text = [_title(rows, now)]
    text += table_lines(COLUMNS, cells(rows), None) if rows else ["no run is recording here"]
    return "\n".join(text) + "\n"


@click.command("top")
@click.option("--once", is_flag=True, help="Print one frame and exit (for scripts and tests).")
@click.option("--interval", type=FiniteFloat(0.5), default=2.0, show_default=True, help="Seconds between refreshes.")
@format_option("table", "json")
@db_option
@cli_errors
def top_cmd(once: bool, interval: float, fmt: str, db: str | None) -> None:
    """Live view of the runs recording on this machine: per run and GPU, utilisation, VRAM, power,
    epoch and ETA. Ctrl-C to leave. Piped, it prints a plain-text frame every --interval seconds;
    --format json (or --json) prints one frame's data and exits."""
    from rich.console import Console
    from rich.live import Live

    from gpuledger.reports.run.top import snapshot

    ledger = open_ledger(db)
    if fmt == "json":
        echo_json(snapshot(ledger, time.time()))
        return
    if not sys.stdout.isatty():
        _print_frames(ledger, interval, once)
        return
    if once:
        now = time.time()
        Console().print(frame(snapshot(ledger, now), now))
        return
    with Live(frame(snapshot(ledger, time.time()), time.time()), refresh_per_second=4, screen=False) as live:
        try:
            while True:
                time.sleep(interval)
                now = time.time()
                live.update(frame(snapshot(ledger, now), now))
        except KeyboardInterrupt:
            pass


def _print_frames(ledger: Any, interval: float, once: bool) -> None:
    from gpuledger.reports.run.top import snapshot

    try:
        while True:
            now = time.time()
            sys.stdout.write(plain_frame(snapshot(ledger, now), now))
            sys.stdout.flush()
            if once:
                return
            time.sleep(interval)
            sys.stdout.write("\n")
    except (KeyboardInterrupt, BrokenPipeError):
        pass
