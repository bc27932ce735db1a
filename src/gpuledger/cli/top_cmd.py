"""``gpuledger top``: a live terminal view of the runs recording on this machine (reports/top.py)."""

from __future__ import annotations

import time
from typing import Any

import click

from gpuledger.cli.common import db_option, open_ledger
from gpuledger.core.units import fmt_bytes, fmt_duration


def frame(rows: list[dict[str, Any]], now: float) -> Any:
    """A rich renderable: one line per GPU of each live run."""
    from rich.table import Table

    table = Table(title=f"gpuledger top · {time.strftime('%H:%M:%S', time.localtime(now))} · "
                        f"{len(rows)} run(s) recording on this machine", expand=False)
    for header, justify in (("run", "left"), ("user", "left"), ("epoch", "right"), ("ETA", "right"),
                            ("GPU", "left"), ("util", "right"), ("VRAM (run)", "right"), ("power", "right"),
                            ("temp", "right"), ("CPU", "right"), ("data age", "right")):
        table.add_column(header, justify=justify)  # type: ignore[arg-type]
    if not rows:
        table.add_row("no run is recording here", *[""] * 10)
    for r in rows:
        epoch = "-" if r["epoch"] is None else f"{r['epoch']}/{r['epochs'] or '?'}"
        label = (r["name"] or r["id"][:13]) + (" (replay)" if r["replayed"] else "")
        gpus = r["gpus"] or [None]
        for i, g in enumerate(gpus):
            head = [label, r["user"], epoch, fmt_duration(r["eta_s"]) if r["eta_s"] is not None else "-"] if i == 0 \
                else ["", "", "", ""]
            if g is None:
                cells = ["no GPU", "-", "-", "-", "-"]
            else:
                util = "n/a" if g["util"] is None else f"{g['util'] * 100:.0f}%"
                vram = f"{fmt_bytes(g['mem_used_b'])}/{fmt_bytes(g['mem_total_b'])} ({fmt_bytes(g['proc_mem_b'])})"
                power = "n/a" if g["power_w"] is None else f"{g['power_w']:.0f} W"
                temp = "n/a" if g["temp_c"] is None else f"{g['temp_c']:.0f} °C"
                cells = [f"{g['index']}: {g['name']}", util, vram, power, temp]
            cpu = ("n/a" if r["cpu_cores"] is None else f"{r['cpu_cores']:.1f} cores") if i == 0 else ""
            age = "" if g is None else f"{g['age_s']:.0f} s"
            table.add_row(*head, *cells, cpu, age)
    return table


@click.command("top")
@click.option("--once", is_flag=True, help="Print one frame and exit (for scripts and tests).")
@click.option("--interval", type=click.FloatRange(0.5), default=2.0, show_default=True,
              help="Seconds between refreshes.")
@click.option("--json", "as_json", is_flag=True, help="With --once: print the frame's data as JSON.")
@db_option
def top_cmd(once: bool, interval: float, as_json: bool, db: str | None) -> None:
    """Live view of the runs recording on this machine: per run and GPU, utilisation, VRAM, power,
    epoch and ETA. Ctrl-C to leave."""
    from rich.console import Console
    from rich.live import Live

    from gpuledger.reports.top import snapshot

    ledger = open_ledger(db)
    if once or as_json:
        now = time.time()
        rows = snapshot(ledger, now)
        if as_json:
            from gpuledger.cli.common import echo_json

            echo_json(rows)
        else:
            Console().print(frame(rows, now))
        return
    with Live(frame(snapshot(ledger, time.time()), time.time()), refresh_per_second=4, screen=False) as live:
        try:
            while True:
                time.sleep(interval)
                now = time.time()
                live.update(frame(snapshot(ledger, now), now))
        except KeyboardInterrupt:
            pass
