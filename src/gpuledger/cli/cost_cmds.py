"""``gpuledger cost`` and ``gpuledger report chargeback | rollup``: pricing the ledger.

The local CLI reads the whole ledger it is given (scope: all projects) unless ``--project`` narrows
it; the team server passes each person's projects to the same report functions.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar

import click

from gpuledger.cli.capacity_cmds import SHARE_CHOICES, check_share_idle, pools_option, shared_idle
from gpuledger.cli.common import (
    FiniteFloat,
    cli_errors,
    db_option,
    format_option,
    include_replayed_option,
    named,
    open_ledger,
    rate_card,
)
from gpuledger.cli.focus_output import focus_version_option
from gpuledger.cli.output import OutputPath, write_text
from gpuledger.cli.report_fit import terminal_text
from gpuledger.cli.report_group import report_group  # shared with ``report run`` (cli/report_cmds.py)

F = TypeVar("F", bound=Callable[..., Any])

__all__ = ["cost_cmd", "report_group"]


def _common(func: F) -> F:
    func = click.option(
        "--project",
        "projects",
        multiple=True,
        metavar="NAME",
        callback=named,
        help="Only runs of this project (repeatable). Default: every project in the ledger.",
    )(func)
    func = click.option(
        "--basis", type=click.Choice(["allocated", "busy"]), help="Billing basis (default: the rate card's)."
    )(func)
    func = click.option(
        "--rates",
        envvar="GPULEDGER_RATES",
        type=click.Path(dir_okay=False),
        help="Rate card TOML (docs/RATE_CARDS.md; or GPULEDGER_RATES). Default: the example card.",
    )(func)
    return db_option(func)


def _given(param: str) -> bool:
    """Whether the user gave this option (not its default)."""
    source = click.get_current_context().get_parameter_source(param)
    return source not in (None, click.core.ParameterSource.DEFAULT)


def _scope(projects: tuple[str, ...]) -> frozenset[str] | None:
    return frozenset(projects) if projects else None


@click.command("cost")
@click.argument("runs", nargs=-1)
@click.option(
    "--instance-type",
    metavar="TYPE",
    help="Price as this cloud instance type (default: the run's instance_type label).",
)
@format_option("table", "json", "csv")
@_common
@cli_errors
def cost_cmd(
    runs: tuple[str, ...],
    instance_type: str | None,
    fmt: str,
    projects: tuple[str, ...],
    basis: str | None,
    rates: str | None,
    db: str | None,
) -> None:
    """What runs cost, per GPU and in total.

    RUN is a run id, its short id (the ID column of gpuledger runs) or a unique id prefix;
    default: the newest run (of --project, when given).

    Shows allocated, busy and idle GPU-hours, A100-equivalent hours, energy, cost and idle cost.
    A resumed training also gets the total of all its attempts.
    """
    from gpuledger.reports.cost.costing import run_costs
    from gpuledger.reports.cost.render import cost_csv, cost_text, to_json

    card = rate_card(rates)
    scope = _scope(projects)
    ledger = open_ledger(db)
    if runs:
        ids = [ledger.resolve(r) for r in runs]
    else:
        newest = (
            ledger.list_runs(limit=1)
            if scope is None
            else [r for p in scope for r in ledger.list_runs(project=p, limit=1)]
        )
        if not newest:  # a ledger with runs of other projects is not "no runs yet"
            if scope is not None and ledger.list_runs(limit=1):
                raise click.ClickException(
                    f"no run of project {', '.join(sorted(scope))}: check --project (gpuledger runs lists the projects)"
                )
            raise click.ClickException("no runs yet: record one with gpuledger run -- COMMAND")
        ids = [max(newest, key=lambda r: r.started_at).id]
    report = run_costs(ledger, ids, scope=scope, card=card, basis=basis, instance_type=instance_type)
    if fmt == "json":
        sys.stdout.write(to_json(report))
    elif fmt == "csv":
        sys.stdout.write(cost_csv(report))
    else:
        sys.stdout.write(terminal_text(lambda table: cost_text(report, table), lambda: cost_text(report)))


@report_group.command("chargeback")
@click.option("--month", metavar="YYYY-MM", help="The month to report (UTC). Default: this month.")
@click.option("--from", "start", metavar="DATE", help="Start (a date, or an ISO date-time; UTC).")
@click.option("--to", "end", metavar="DATE", help="End (a date counts whole; or an ISO date-time).")
@click.option(
    "--by",
    default="team",
    show_default=True,
    help="Group by, comma-separated: team, project, user, gpu_model, instance_type, status.",
)
@format_option("table", "csv", "md", "html", "json", "focus")
@click.option(
    "--section",
    type=click.Choice(["groups", "runs", "idle-runs", "users", "idle-users", "trend", "anomalies"]),
    default="groups",
    show_default=True,
    help="Which table --format csv writes.",
)
@click.option(
    "--top",
    "top_n",
    type=click.IntRange(1),
    default=10,
    show_default=True,
    help="How many top runs and users (the table shows 5 unless --top is given).",
)
@click.option(
    "--trend-months", type=click.IntRange(0, 36), default=3, show_default=True, help="Earlier months in the trend."
)
@click.option(
    "--anomaly-threshold",
    type=FiniteFloat(0),
    default=0.25,
    show_default=True,
    help="Flag a group whose cost per A100-eq hour or idle share rose by more than this (0.25 = 25%).",
)
@click.option(
    "--share-idle",
    type=click.Choice(SHARE_CHOICES),
    default="none",
    show_default=True,
    help="Add the fleet's unbilled cost shared by allocated or busy GPU-hours: totals = the fleet's cost.",
)
@pools_option
@click.option(
    "--provider",
    metavar="NAME",
    help="--format focus: who provides the GPU time (ProviderName, ...; docs/FOCUS.md). Default: the rate card's name.",
)
@focus_version_option
@include_replayed_option
@click.option("-o", "--output", type=OutputPath(), help="File to write (default: stdout).")
@_common
@cli_errors
def chargeback_cmd(
    month: str | None,
    start: str | None,
    end: str | None,
    by: str,
    fmt: str,
    section: str,
    top_n: int,
    trend_months: int,
    anomaly_threshold: float,
    share_idle: str,
    pools: str | None,
    provider: str | None,
    focus_version: str,
    include_replayed: bool,
    output: str | None,
    projects: tuple[str, ...],
    basis: str | None,
    rates: str | None,
    db: str | None,
) -> None:
    """GPU cost by team, project, user or GPU model for a month (columns: docs/CHARGEBACK.md;
    --format focus: the FinOps FOCUS 1.0 or 1.3 dataset, CSV or -o FILE.parquet, docs/FOCUS.md)."""
    from gpuledger.core.chargeback.columns import GROUP_KEYS
    from gpuledger.reports.cost import render as cost_render
    from gpuledger.reports.cost.costing import chargeback, window_from_args

    keys = tuple(k.strip() for k in by.split(",") if k.strip())
    unknown = [k for k in keys if k not in GROUP_KEYS]
    if unknown or not keys:
        raise click.BadParameter(f"use one or more of {', '.join(GROUP_KEYS)}", param_hint="--by")
    try:
        lo, hi = window_from_args(month, start, end, time.time())
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    check_share_idle(share_idle, month, start, end, projects)  # docs/CAPACITY.md
    card = rate_card(rates)
    ledger = open_ledger(db)
    if fmt == "focus":
        from gpuledger.cli.focus_output import write_chargeback_focus

        write_chargeback_focus(
            ledger, card, lo, hi, scope=_scope(projects), basis=basis, by=keys, share_idle=share_idle, pools=pools,
            provider=provider, output=output, include_replayed=include_replayed, version=focus_version,
        )  # fmt: skip
        return
    cb = chargeback(
        ledger,
        scope=_scope(projects),
        card=card,
        start=lo,
        end=hi,
        by=keys,
        basis=basis,
        trend_months=trend_months,
        top_n=top_n,
        anomaly_threshold=anomaly_threshold,
        include_replayed=include_replayed,
    )
    cb = shared_idle(cb, ledger, card, lo, hi, share_idle, pools, include_replayed=include_replayed)
    if fmt == "json":
        text = cost_render.to_json(cb.as_dict())
    elif fmt == "csv":
        text = cost_render.chargeback_csv(cb, section)
    elif fmt == "md":
        text = cost_render.chargeback_markdown(cb, top_n)
    elif fmt == "html":
        from gpuledger.reports.cost.chargeback_html import chargeback_html
        from gpuledger.reports.cost.value_trends import value_trends

        # The weeks of the report's period to its end (or now), eight at least: trend, TOP lists and
        # the anomalies of the last complete week, by model_version.
        weekly = value_trends(
            ledger, scope=_scope(projects), card=card, basis=basis, end=min(hi, time.time()), since=lo,
            top_n=top_n, include_replayed=include_replayed,
        )  # fmt: skip
        text = chargeback_html(cb, top_n, value=weekly)
    else:
        # The table keeps to one screen (5 top runs and users) unless --top asks for more.
        shown = top_n if _given("top_n") else min(top_n, 5)
        if output is None:
            text = terminal_text(lambda table: cost_render.chargeback_text(cb, shown, table),
                                 lambda: cost_render.chargeback_text(cb, shown))  # fmt: skip
        else:
            text = cost_render.chargeback_text(cb, shown)
    write_text(output, text, announce=True)


@report_group.command("rollup")
@click.option("--rebuild", is_flag=True, help="Rewrite the rollups of every finished run.")
@db_option
@cli_errors
def rollup_cmd(rebuild: bool, db: str | None) -> None:
    """Sum the intervals of finished runs per GPU and day, so cost reports over months stay fast."""
    from gpuledger.core.units import fmt_count
    from gpuledger.reports.cost.rollups import materialise_rollups

    ledger = open_ledger(db)
    counts = materialise_rollups(ledger, rebuild=rebuild)
    note = f" ({fmt_count(counts['skipped'], 'run')} wait for a co-tenant still running)" if counts["skipped"] else ""
    click.echo(f"rolled up {fmt_count(counts['runs'], 'run')} into {fmt_count(counts['rows'], 'row')}{note}")
