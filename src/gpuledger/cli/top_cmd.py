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
from gpuledger.core.ids import short_id
from gpuledger.core.units import (
    NA,
    fmt_bytes,
    fmt_celsius,
    fmt_count,
    fmt_duration,
    fmt_number,
    fmt_pct,
    fmt_watts,
)

HEADERS = (("run", "left"), ("user", "left"), ("epoch", "right"), ("ETA", "right"), ("GPU", "left"),
           ("util", "right"), ("VRAM (run)", "right"), ("power", "right"), ("temp", "right"), ("CPU", "right"),
           ("data age", "right"))  # fmt: skip


def _title(rows: list[dict[str, Any]], now: float) -> str:
    recording = fmt_count(len(rows), "run")
    return f"gpuledger top · {time.strftime('%H:%M:%S', time.localtime(now))} · {recording} recording on this machine"


def cells(rows: list[dict[str, Any]]) -> list[list[str]]:
    """One line of text cells per GPU of each live run (a run without GPUs gets one line)."""
    out = []
    for r in rows:
        epoch = "-" if r["epoch"] is None else f"{r['epoch']}/{r['epochs'] or '?'}"
        label = short_id(r["id"]) + (f" {r['name']}" if r["name"] else "") + (" (replayed)" if r["replayed"] else "")
        for i, g in enumerate(r["gpus"] or [None]):
            head = (
                [label, r["user"], epoch, fmt_duration(r["eta_s"]) if r["eta_s"] is not None else "-"]
                if i == 0
                else ["", "", "", ""]
            )
            if g is None:
                gpu = ["no GPU", "-", "-", "-", "-"]
            else:
                vram = f"{fmt_bytes(g['mem_used_b'])}/{fmt_bytes(g['mem_total_b'])} ({fmt_bytes(g['proc_mem_b'])})"
                power, temp = fmt_watts(g["power_w"]), fmt_celsius(g["temp_c"])
                gpu = [f"{g['index']}: {g['name']}", fmt_pct(g["util"]), vram, power, temp]
            cpu = (NA if r["cpu_cores"] is None else f"{fmt_number(r['cpu_cores'])} cores") if i == 0 else ""
            age = "" if g is None else f"{g['age_s']:.0f} s"
            out.append([*head, *gpu, cpu, age])
    return out


def frame(rows: list[dict[str, Any]], now: float) -> Any:
    """A rich renderable for the terminal: the run column (its short id) is never cut."""
    from rich.markup import escape
    from rich.table import Table

    lines = cells(rows)
    table = Table(title=_title(rows, now), expand=False)
    for n, (header, justify) in enumerate(HEADERS):
        whole = {"no_wrap": True, "min_width": max([len(header), *(len(c[n]) for c in lines)])} if n == 0 else {}
        table.add_column(header, justify=justify, **whole)  # type: ignore[arg-type]
    if not rows:
        table.add_row("no run is recording here", *[""] * (len(HEADERS) - 1))
    for line in lines:
        table.add_row(*(escape(c) for c in line))
    return table


def plain_frame(rows: list[dict[str, Any]], now: float) -> str:
    """The same frame as plain text: aligned columns, nothing cut, no colours or box drawing."""
    lines = cells(rows)
    table = [[h for h, _ in HEADERS], *lines]
    widths = [max(len(line[i]) for line in table) for i in range(len(HEADERS))]
    text = [_title(rows, now)]
    for line in table:
        text.append(
            "  ".join(
                c.rjust(w) if HEADERS[i][1] == "right" else c.ljust(w)
                for i, (c, w) in enumerate(zip(line, widths, strict=True))
            ).rstrip()
        )
    if not rows:
        text.append("no run is recording here")
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
