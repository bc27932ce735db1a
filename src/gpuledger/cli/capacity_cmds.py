"""``gpuledger report capacity`` and ``gpuledger report fleet``: the fleet's capacity and what it
cost, used or not (docs/CAPACITY.md); and the chargeback's ``--share-idle`` (``shared_idle``).

Thin: parse, call reports/capacity/report.py, render with reports/capacity/render.py.
"""

from __future__ import annotations

import time
from typing import Any

import click

from gpuledger.cli.common import cli_errors, db_option, format_option, open_ledger, rate_card
from gpuledger.cli.focus_output import focus_version_option
from gpuledger.cli.output import OutputPath, write_text
from gpuledger.cli.report_fit import terminal_text
from gpuledger.cli.report_group import report_group

__all__ = ["capacity_cmd", "check_share_idle", "fleet_cmd", "pools_option", "shared_idle"]

SHARE_CHOICES = ("none", "allocated", "busy")


def pools_option(func: Any) -> Any:
    return click.option(
        "--pools",
        envvar="GPULEDGER_POOLS",
        type=click.Path(dir_okay=False),
        help="Pools file (TOML, docs/CAPACITY.md; or GPULEDGER_POOLS). Default: pools by instance type or model.",
    )(func)


def _pools(path: str | None) -> Any:
    from gpuledger.core.capacity.pools import PoolsError
    from gpuledger.reports.capacity.report import load_pools

    try:
        return load_pools(path)
    except PoolsError as exc:
        raise click.ClickException("the pools file has problems:\n" + str(exc)) from exc


def _window(month: str | None, start: str | None, end: str | None) -> tuple[float, float]:
    from gpuledger.reports.capacity.runs import whole_days
    from gpuledger.reports.cost.costing import window_from_args

    try:
        lo, hi = window_from_args(month, start, end, time.time())
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    if not whole_days(lo, hi):
        raise click.UsageError("capacity is kept per UTC day: give --month, or --from/--to as dates (2026-03-15)")
    return lo, hi


@report_group.command("capacity")
@click.option("--month", metavar="YYYY-MM", help="The month to report (UTC). Default: this month.")
@click.option("--from", "start", metavar="DATE", help="First day (UTC).")
@click.option("--to", "end", metavar="DATE", help="Last day, included (UTC).")
@click.option("--by", default="host", show_default=True, help="Group by, comma-separated: host, gpu_model, pool, gpu.")
@click.option(
    "--share-idle",
    type=click.Choice(SHARE_CHOICES),
    default="none",
    show_default=True,
    help="Share the cost no run was billed for back to teams: not at all, by allocated or by busy GPU-hours.",
)
@format_option("table", "csv", "md", "html", "json", "focus")
@click.option(
    "--section", type=click.Choice(["groups", "shares"]), default="groups", show_default=True,
    help="Which table --format csv writes.",
)  # fmt: skip
@click.option("--basis", type=click.Choice(["allocated", "busy"]), help="Billing basis of the teams' bills.")
@click.option(
    "--rates", envvar="GPULEDGER_RATES", type=click.Path(dir_okay=False),
    help="Rate card TOML (docs/RATE_CARDS.md; or GPULEDGER_RATES). Default: the example card.",
)  # fmt: skip
@pools_option
@click.option("--provider", metavar="NAME", help="--format focus: who provides the GPU time (docs/FOCUS.md).")
@focus_version_option
@click.option(
    "--include-replayed", is_flag=True,
    help="Count the GPUs and runs of replayed GPU traces (--replay-gpus demos), marked. Default: left out.",
)  # fmt: skip
@click.option("-o", "--output", type=OutputPath(), help="File to write (default: stdout).")
@db_option
@cli_errors
def capacity_cmd(
    month: str | None,
    start: str | None,
    end: str | None,
    by: str,
    share_idle: str,
    fmt: str,
    section: str,
    basis: str | None,
    rates: str | None,
    pools: str | None,
    provider: str | None,
    focus_version: str,
    include_replayed: bool,
    output: str | None,
    db: str | None,
) -> None:
    """The fleet's GPU-hours and asset cost in each state — unallocated, allocated-idle, busy with
    and without an owner — and the unbilled cost shared back to teams (docs/CAPACITY.md)."""
    from gpuledger.core.capacity.columns import CAPACITY_KEYS
    from gpuledger.reports.capacity import render
    from gpuledger.reports.capacity.report import capacity

    keys = tuple(k.strip() for k in by.split(",") if k.strip())
    if not keys or any(k not in CAPACITY_KEYS for k in keys):
        raise click.BadParameter(f"use one or more of {', '.join(CAPACITY_KEYS)}", param_hint="--by")
    if section == "shares" and share_idle == "none" and fmt == "csv":
        raise click.UsageError("--section shares needs --share-idle allocated or busy")
    lo, hi = _window(month, start, end)
    if fmt == "focus" and share_idle != "none":
        raise click.UsageError(
            "--format focus writes the fleet's cost; for its share by team: report chargeback --format focus "
            "--share-idle"
        )
    card, pool_set = rate_card(rates), _pools(pools)
    ledger = open_ledger(db)
    if fmt == "focus":  # the FinOps FOCUS 1.0 (or 1.3) dataset, per day, GPU, price and state (docs/FOCUS.md)
        from gpuledger.cli.focus_output import write_capacity_focus

        write_capacity_focus(
            ledger, card, pool_set, lo, hi, provider=provider, output=output, include_replayed=include_replayed,
            version=focus_version,
        )  # fmt: skip
        return
    report = capacity(
        ledger, card=card, pools=pool_set, start=lo, end=hi, by=keys, share_rule=share_idle, basis=basis,
        include_replayed=include_replayed,
    )  # fmt: skip
    if month:
        report.params["month"] = month
    if fmt == "json":
        text = render.to_json(report.as_dict())
    elif fmt == "csv":
        text = render.capacity_csv(report, section)
    elif fmt == "md":
        text = render.capacity_markdown(report)
    elif fmt == "html":
        text = render.capacity_html(report)
    elif output is None:
        text = terminal_text(lambda table: render.capacity_text(report, table), lambda: render.capacity_text(report))
    else:
        text = render.capacity_text(report)
    write_text(output, text, announce=True)


@report_group.command("fleet")
@format_option("table", "csv", "md", "json")
@click.option(
    "--rates", envvar="GPULEDGER_RATES", type=click.Path(dir_okay=False),
    help="Rate card TOML: the line pricing each GPU. Default: the example card.",
)  # fmt: skip
@pools_option
@click.option("-o", "--output", type=OutputPath(), help="File to write (default: stdout).")
@db_option
@cli_errors
def fleet_cmd(fmt: str, rates: str | None, pools: str | None, output: str | None, db: str | None) -> None:
    """Every GPU of the fleet: model, hosts (a GPU that moved shows each), pool, the rate-card line
    pricing it, first and last sighting, and whether it is still seen."""
    from gpuledger.reports.capacity import render
    from gpuledger.reports.capacity.report import fleet

    card, pool_set = rate_card(rates), _pools(pools)
    rows = fleet(open_ledger(db), card=card, pools=pool_set)
    if fmt == "json":
        text = render.to_json({"gpus": rows, "rate_card": card.name or card.source, "pools": pool_set.source or None})
    elif fmt == "csv":
        text = render.fleet_csv(rows)
    elif fmt == "md":
        text = render.fleet_markdown(rows)
    elif output is None:
        text = terminal_text(lambda table: render.fleet_text(rows, table), lambda: render.fleet_text(rows))
    else:
        text = render.fleet_text(rows)
    write_text(output, text, announce=output is not None)


def check_share_idle(
    rule: str, month: str | None, start: str | None, end: str | None, projects: tuple[str, ...]
) -> None:
    """Before any work: ``--share-idle`` needs the whole fleet and whole days."""
    if rule == "none":
        return
    if projects:
        raise click.UsageError("--share-idle shares the whole fleet's cost between groups: leave out --project")
    _window(month, start, end)


def shared_idle(
    cb: Any,
    ledger: Any,
    card: Any,
    lo: float,
    hi: float,
    rule: str,
    pools: str | None,
    *,
    include_replayed: bool = False,
) -> Any:
    """The chargeback ``cb`` with the shared idle columns of ``rule`` (none: unchanged); the fleet
    has replayed traces' GPUs only with ``include_replayed``, as the chargeback has their runs."""
    if rule == "none":
        return cb
    from gpuledger.reports.capacity.report import add_shared_idle, fleet_cost

    units = fleet_cost(ledger, card=card, pools=_pools(pools), start=lo, end=hi, include_replayed=include_replayed)
    return add_shared_idle(cb, units, rule)
