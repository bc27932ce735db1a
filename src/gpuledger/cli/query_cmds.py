"""``gpuledger query ...``: audit questions over the whole ledger (store/audit_queries.py).

Tables on stdout, ``--json`` for machines; a progress bar on stderr while a big ledger is read
(shown only on a terminal, so scripts and pipes get clean output).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import click

from gpuledger.cli.common import db_option, echo_json, open_ledger

F = TypeVar("F", bound=Callable[..., Any])


def _range_options(func: F) -> F:
    func = click.option("--to", "until", metavar="WHEN", help="Until (exclusive): a date, timestamp or 3d.")(func)
    func = click.option("--from", "since", metavar="WHEN", help="From: a date (2026-11-01), timestamp or 30d.")(func)
    return func


def _time(text: str | None, param: str) -> float | None:
    if text is None:
        return None
    from gpuledger.reports.runview import parse_since

    try:
        return parse_since(text)
    except ValueError as exc:
        raise click.BadParameter(str(exc).replace("--since", param), param_hint=param) from exc


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


def _fail(func: F) -> F:
    import functools

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from gpuledger.store import LedgerError

        try:
            return func(*args, **kwargs)
        except LedgerError as exc:
            raise click.ClickException(str(exc)) from exc

    return wrapper  # type: ignore[return-value]


@click.group("query")
def query_group() -> None:
    """Audit queries over the whole ledger: GPU-hours, failures, configurations, GPU users."""


@query_group.command("gpu-hours")
@click.option("--by", type=click.Choice(["user", "team", "project"]), default="user", show_default=True)
@click.option("--per", type=click.Choice(["week", "month"]), default="month", show_default=True)
@_range_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@db_option
@_fail
def gpu_hours_cmd(by: str, per: str, since: str | None, until: str | None, as_json: bool, db: str | None) -> None:
    """Allocated, busy and idle GPU-hours per user, team or project, per ISO week or month (UTC)."""
    from gpuledger.store.audit_queries import gpu_hours

    ledger = open_ledger(db)
    with progress_bar("reading intervals") as progress:
        rows = gpu_hours(ledger, by=by, per=per, start=_time(since, "--from"), end=_time(until, "--to"),
                         progress=progress)
    if as_json:
        echo_json(rows)
        return
    from gpuledger.cli.report_render import rows_table

    rows_table(f"GPU-hours per {by} per {per}", [("period", per), (by, by), ("runs", "runs"),
               ("allocated_gpu_hours", "allocated GPU-h"), ("busy_gpu_hours", "busy GPU-h"),
               ("idle_gpu_hours", "idle GPU-h"), ("energy_kwh", "energy kWh")], rows)


@query_group.command("failures")
@_range_options
@click.option("--short", "short_s", type=click.FloatRange(0), default=300.0, show_default=True,
              help="A succeeded run shorter than this many seconds counts as a short run.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@db_option
@_fail
def failures_cmd(since: str | None, until: str | None, short_s: float, as_json: bool, db: str | None) -> None:
    """Failed, killed, lost and short runs: how many, GPU-hours wasted, the commonest causes."""
    from gpuledger.store.audit_queries import failures

    ledger = open_ledger(db)
    with progress_bar("reading events") as progress:
        result = failures(ledger, _time(since, "--from"), _time(until, "--to"), short_s, progress)
    if as_json:
        echo_json(result)
        return
    from gpuledger.cli.report_render import rows_table

    statuses = ", ".join(f"{k} {v}" for k, v in sorted(result["by_status"].items())) or "none"
    click.echo(f"{result['runs']} runs ({statuses}); {result['wasted_gpu_hours']:.2f} allocated GPU-hours wasted")
    rows_table("Causes", [("cause", "cause"), ("runs", "runs"), ("gpu_hours", "GPU-hours")], result["causes"])


@query_group.command("configs")
@_range_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@db_option
@_fail
def configs_cmd(since: str | None, until: str | None, as_json: bool, db: str | None) -> None:
    """Configurations (model, imgsz, batch, workers) ranked by mAP points per busy GPU-hour."""
    from gpuledger.store.audit_queries import configs

    ledger = open_ledger(db)
    with progress_bar("reading metrics") as progress:
        rows = configs(ledger, _time(since, "--from"), _time(until, "--to"), progress)
    if as_json:
        echo_json(rows)
        return
    from gpuledger.cli.report_render import rows_table

    rows_table("mAP per busy GPU-hour", [("model", "model"), ("imgsz", "imgsz"), ("batch", "batch"),
               ("workers", "workers"), ("runs", "runs"), ("best_map", "best mAP50-95"),
               ("busy_gpu_hours", "busy GPU-h"), ("map_points_per_busy_gpu_hour", "mAP points / busy GPU-h")], rows)


@query_group.command("gpu")
@click.argument("uuid")
@_range_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@db_option
@_fail
def gpu_cmd(uuid: str, since: str | None, until: str | None, as_json: bool, db: str | None) -> None:
    """Who ran on GPU UUID (or a MIG slice of it) in a time range."""
    from gpuledger.reports.runview import iso
    from gpuledger.store.audit_queries import gpu_users

    ledger = open_ledger(db)
    rows = gpu_users(ledger, uuid, _time(since, "--from"), _time(until, "--to"))
    if as_json:
        echo_json(rows)
        return
    from gpuledger.cli.report_render import rows_table

    shown = [{**r, "started": iso(r["started_at"]), "ended": iso(r["ended_at"])} for r in rows]
    rows_table(f"Runs on {uuid}", [("id", "run"), ("user", "user"), ("team", "team"), ("project", "project"),
               ("host", "host"), ("started", "started (UTC)"), ("ended", "ended"), ("status", "status"),
               ("busy_gpu_hours", "busy GPU-h")], shown)
