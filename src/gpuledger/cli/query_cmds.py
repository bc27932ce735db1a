"""``gpuledger query ...``: audit questions over the whole ledger (store/audit_queries.py).

Tables on stdout, ``--format json`` (or ``--json``) for machines; a progress bar on stderr while a
big ledger is read (shown only on a terminal, so scripts and pipes get clean output).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import click

from gpuledger.cli.common import (
    FiniteFloat,
    cli_errors,
    db_option,
    echo_json,
    format_option,
    include_replayed_option,
    open_ledger,
)

F = TypeVar("F", bound=Callable[..., Any])


def _range_options(func: F) -> F:
    func = click.option("--to", "until", metavar="WHEN", help="Until (exclusive): a date, timestamp or 3d.")(func)
    func = click.option("--from", "since", metavar="WHEN", help="From: a date (2026-11-01), timestamp or 30d.")(func)
    return func


def _time(text: str | None, param: str) -> float | None:
    if text is None:
        return None
    from gpuledger.runs.view import parse_since

    try:
        return parse_since(text)
    except ValueError as exc:
        raise click.BadParameter(str(exc).replace("--since", param), param_hint=param) from exc


def _when(t: float | None) -> str | None:
    """A time for a table: "2026-11-20 14:03:07" (UTC; a space lets a narrow terminal wrap it)."""
    from gpuledger.runs.view import iso

    stamp = iso(t)
    return None if stamp is None else stamp.replace("T", " ").removesuffix("Z")


@contextlib.contextmanager
def progress_bar(label: str) -> Iterator[Callable[[int, int], None]]:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    columns = (TextColumn(label), BarColumn(), MofNCompleteColumn(), TextColumn("runs"), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True, disable=not console.is_terminal) as bar:
        task = bar.add_task(label, total=None)

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield update


@click.group("query")
def query_group() -> None:
    """Audit queries over the whole ledger: GPU-hours, failures, configurations, GPU users."""


@query_group.command("gpu-hours")
@click.option("--by", type=click.Choice(["user", "team", "project"]), default="user", show_default=True)
@click.option("--per", type=click.Choice(["week", "month"]), default="month", show_default=True)
@_range_options
@include_replayed_option
@format_option("table", "json")
@db_option
@cli_errors
def gpu_hours_cmd(
    by: str, per: str, since: str | None, until: str | None, include_replayed: bool, fmt: str, db: str | None
) -> None:
    """Allocated, busy and idle GPU-hours per user, team or project, per ISO week or month (UTC)."""
    from gpuledger.store.audit_queries import gpu_hours, replayed_between

    ledger = open_ledger(db)
    start, end = _time(since, "--from"), _time(until, "--to")
    with progress_bar("reading intervals") as progress:
        rows = gpu_hours(
            ledger, by=by, per=per, start=start, end=end, progress=progress, include_replayed=include_replayed
        )
    left_out = 0 if include_replayed else replayed_between(ledger, start, end)
    if left_out:  # the hours differ from what the runs list shows: say why, on stderr (stdout stays data)
        click.echo(f"gpuledger: {left_out} run(s) metered from a replayed GPU trace left out "
                   "(--include-replayed counts them)", err=True)  # fmt: skip
    if fmt == "json":
        echo_json(rows)
        return
    from gpuledger.cli.report_render import rows_table

    columns = [
        ("period", per),
        (by, by),
        ("runs", "runs"),
        ("allocated_gpu_hours", "allocated GPU-h"),
        ("busy_gpu_hours", "busy GPU-h"),
        ("idle_gpu_hours", "idle GPU-h"),
        ("energy_kwh", "energy kWh"),
    ]
    if include_replayed:
        columns.insert(3, ("replayed_runs", "replayed"))
    rows_table(f"GPU-hours per {by} per {per}", columns, rows)


@query_group.command("failures")
@_range_options
@click.option(
    "--short",
    "short_s",
    type=FiniteFloat(0),
    default=300.0,
    show_default=True,
    help="Succeeded runs shorter than this many seconds are listed as short runs (not as waste).",
)
@format_option("table", "json")
@db_option
@cli_errors
def failures_cmd(since: str | None, until: str | None, short_s: float, fmt: str, db: str | None) -> None:
    """Failed, killed and lost runs: how many, the GPU-hours they wasted, the commonest causes; and
    succeeded runs shorter than --short, listed apart (a short success is not waste)."""
    from gpuledger.core.units import fmt_count, fmt_duration, fmt_hours
    from gpuledger.reports.run.query_views import failure_report
    from gpuledger.store.audit_queries import failures

    ledger = open_ledger(db)
    with progress_bar("reading events") as progress:
        result = failure_report(failures(ledger, _time(since, "--from"), _time(until, "--to"), short_s, progress))
    if fmt == "json":
        echo_json(result)
        return
    from gpuledger.cli.report_render import rows_table

    statuses = ", ".join(f"{k} {v}" for k, v in sorted(result["by_status"].items())) or "none"
    click.echo(
        f"{fmt_count(result['runs'], 'failed run')} ({statuses}); "
        f"{fmt_hours(result['wasted_gpu_hours'])} allocated GPU-hours wasted"
    )
    short = result["short_runs"]
    if short["runs"]:
        click.echo(
            f"{fmt_count(short['runs'], 'succeeded run')} shorter than {fmt_duration(short_s)} "
            f"({fmt_hours(short['allocated_gpu_hours'])} allocated GPU-hours), not counted as waste"
        )
    if result["causes"]:
        rows_table("Causes", [("cause", "cause"), ("runs", "runs"), ("gpu_hours", "GPU-hours")], result["causes"])


@query_group.command("configs")
@_range_options
@format_option("table", "json")
@db_option
@cli_errors
def configs_cmd(since: str | None, until: str | None, fmt: str, db: str | None) -> None:
    """Configurations (model, imgsz, batch, workers) ranked by mAP points per busy GPU-hour."""
    from gpuledger.store.audit_queries import configs

    ledger = open_ledger(db)
    with progress_bar("reading metrics") as progress:
        rows = configs(ledger, _time(since, "--from"), _time(until, "--to"), progress)
    if fmt == "json":
        echo_json(rows)
        return
    from gpuledger.cli.report_render import rows_table

    rows_table(
        "mAP per busy GPU-hour",
        [
            ("model", "model"),
            ("imgsz", "imgsz"),
            ("batch", "batch"),
            ("workers", "workers"),
            ("runs", "runs"),
            ("best_map", "best mAP50-95"),
            ("busy_gpu_hours", "busy GPU-h"),
            ("map_points_per_busy_gpu_hour", "mAP points / busy GPU-h"),
        ],
        rows,
    )


@query_group.command("gpu")
@click.argument("uuid")
@_range_options
@format_option("table", "json")
@db_option
@cli_errors
def gpu_cmd(uuid: str, since: str | None, until: str | None, fmt: str, db: str | None) -> None:
    """Who ran on GPU UUID (or a MIG slice of it) in a time range."""
    from gpuledger.reports.run.query_views import mark_replayed
    from gpuledger.store.audit_queries import gpu_users

    ledger = open_ledger(db)
    rows = mark_replayed(ledger, gpu_users(ledger, uuid, _time(since, "--from"), _time(until, "--to")))
    if fmt == "json":
        echo_json(rows)
        return
    from gpuledger.cli.report_render import rows_table

    shown = [
        {
            **r,
            "run": r["short_id"] + (" (replayed)" if r["replayed"] else ""),
            "started": _when(r["started_at"]),
            "ended": _when(r["ended_at"]),
        }
        for r in rows
    ]
    rows_table(
        f"Runs on {uuid}",
        [
            ("run", "run"),
            ("user", "user"),
            ("team", "team"),
            ("project", "project"),
            ("host", "host"),
            ("started", "started (UTC)"),
            ("ended", "ended"),
            ("status", "status"),
            ("busy_gpu_hours", "busy GPU-h"),
        ],
        shown,
        whole=("run", "status"),
    )
