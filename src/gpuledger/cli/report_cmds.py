"""``gpuledger report run``, ``compare``, ``query ...`` and ``top``: reports that explain runs.

Thin: parse, call one use case in reports/, write the result. cli/main.py adds ``report_group``
(``report run`` is attached to it here), ``compare_cmd``, ``query_group`` and ``top_cmd``.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import click

from gpuledger.cli.common import db_option, open_ledger
from gpuledger.cli.query_cmds import query_group
from gpuledger.cli.report_group import report_group  # shared with the cost commands (report chargeback)
from gpuledger.cli.top_cmd import top_cmd

__all__ = ["compare_cmd", "query_group", "report_group", "report_run_cmd", "top_cmd"]


def ledger_errors(func: Callable[..., Any]) -> Callable[..., Any]:
    """Unknown or ambiguous runs and unreachable ledgers become one-line CLI errors."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from gpuledger.store import LedgerError

        try:
            return func(*args, **kwargs)
        except LedgerError as exc:
            raise click.ClickException(str(exc)) from exc

    return wrapper


def write_output(text: str, output: str | None, default_name: str | None = None) -> None:
    """To ``output`` (``-`` = stdout); without it, to ``default_name`` if given, else stdout."""
    target = output or default_name
    if target is None or target == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    with open(target, "w", encoding="utf-8") as fh:
        fh.write(text)
    click.echo(f"wrote {target} ({len(text.encode()) / 2**20:.2f} MiB)", err=True)


@report_group.command("run")
@click.argument("run")
@click.option("-o", "--output", metavar="FILE", help="Where to write ('-' for stdout). HTML default: "
              "gpuledger-RUN.html in this directory; JSON and Markdown default: stdout.")
@click.option("--format", "fmt", type=click.Choice(["html", "json", "md"]), default="html", show_default=True)
@click.option("--no-history", is_flag=True, help="Skip the comparison with earlier runs (regression rule).")
@click.option("--cost/--no-cost", "cost", default=None,
              help="Price the run (cost block). Default: when a rate card is configured ($GPULEDGER_RATES).")
@db_option
@ledger_errors
def report_run_cmd(run: str, output: str | None, fmt: str, no_history: bool, cost: bool | None, db: str | None) -> None:
    """One run explained: summary, charts, per-GPU table, findings with evidence, cost.

    HTML is one self-contained file that opens offline; --format json carries the same content
    for machines, --format md is for pasting into a pull request or ticket.
    """
    from gpuledger.reports import runreport
    from gpuledger.reports.runview import load_run

    ledger = open_ledger(db)
    record = load_run(ledger, run)
    from gpuledger.reports.costhook import rate_card_configured

    with_cost = rate_card_configured() if cost is None else cost
    model = runreport.build(ledger, record, with_history=not no_history, with_cost=with_cost)
    if fmt == "json":
        from gpuledger.reports.render_html import script_json

        write_output(script_json(model) + "\n", output)
    elif fmt == "md":
        from gpuledger.reports.render_md import render_run

        write_output(render_run(model), output)
    else:
        from gpuledger.reports.render_html import render_run

        write_output(render_run(model), output, f"gpuledger-{record.id[:13]}.html")


@click.command("compare")
@click.argument("runs", nargs=-1, required=True)
@click.option("--format", "fmt", type=click.Choice(["table", "html", "md", "json"]), default="table",
              show_default=True)
@click.option("-o", "--output", metavar="FILE", help="Where to write (default: stdout; HTML: gpuledger-compare.html).")
@click.option("--cost/--no-cost", "cost", default=None,
              help="Compare money too. Default: when a rate card is configured ($GPULEDGER_RATES).")
@db_option
@ledger_errors
def compare_cmd(runs: tuple[str, ...], fmt: str, output: str | None, cost: bool | None, db: str | None) -> None:
    """Runs side by side: resource figures, cost when priced, aligned per-epoch curves.

    Differences in % are against the first run. RUNS are ids or unique id prefixes.
    """
    if len(runs) < 2:
        raise click.UsageError("give at least two runs to compare")
    from gpuledger.reports import compare
    from gpuledger.reports.runview import load_run

    ledger = open_ledger(db)
    records = [load_run(ledger, ref) for ref in runs]
    from gpuledger.reports.costhook import rate_card_configured

    model = compare.build(ledger, records, with_cost=rate_card_configured() if cost is None else cost)
    if fmt == "json":
        from gpuledger.reports.render_html import script_json

        write_output(script_json(model) + "\n", output)
    elif fmt == "md":
        from gpuledger.reports.render_md import render_compare

        write_output(render_compare(model), output)
    elif fmt == "html":
        from gpuledger.reports.render_html import render_compare

        write_output(render_compare(model), output, "gpuledger-compare.html")
    else:
        from gpuledger.cli.report_render import compare_table

        compare_table(model)
