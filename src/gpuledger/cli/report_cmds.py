"""``gpuledger report run``, ``compare``, ``query ...`` and ``top``: reports that explain runs.

Thin: parse, call one use case in reports/, write the result. cli/main.py adds ``report_group``
(``report run`` is attached to it here), ``compare_cmd``, ``query_group`` and ``top_cmd``.
"""

from __future__ import annotations

import io

import click

from gpuledger.cli.common import check_report_rate_card, cli_errors, db_option, format_option, open_ledger, resolve_run
from gpuledger.cli.output import STDOUT, OutputPath, write_text
from gpuledger.cli.query_cmds import query_group
from gpuledger.cli.report_group import report_group  # shared with the cost commands (report chargeback)
from gpuledger.cli.top_cmd import top_cmd

__all__ = ["compare_cmd", "query_group", "report_group", "report_run_cmd", "top_cmd"]


def write_output(text: str, output: str | None, default_name: str | None = None) -> None:
    """To ``output`` (``-`` = stdout); without it, to ``default_name`` if given, else stdout."""
    target = output or default_name
    if target is None or target == STDOUT:
        write_text(None, text)
        return
    write_text(target, text)
    from gpuledger.core.units import fmt_bytes

    click.echo(f"wrote {target} ({fmt_bytes(len(text.encode()))})", err=True)


@report_group.command("run")
@click.argument("run", required=False)
@click.option(
    "-o",
    "--output",
    type=OutputPath(),
    help="Where to write ('-' for stdout). HTML default: "
    "gpuledger-SHORTID.html in this directory; JSON and Markdown default: stdout.",
)
@format_option("html", "json", "md", default="html")
@click.option("--no-history", is_flag=True, help="Skip the comparison with earlier runs (regression rule).")
@click.option(
    "--cost/--no-cost",
    "cost",
    default=None,
    help="Price the run (cost block). Default: only when a rate card is configured ($GPULEDGER_RATES).",
)
@db_option
@cli_errors
def report_run_cmd(
    run: str | None, output: str | None, fmt: str, no_history: bool, cost: bool | None, db: str | None
) -> None:
    """One run explained: summary, charts, per-GPU table, findings with evidence, cost.

    HTML is one self-contained file that opens offline; --format json carries the same content
    for machines, --format md is for pasting into a pull request or ticket. The cost block needs a
    rate card: $GPULEDGER_RATES, or --cost for the example card.

    RUN is a run id, its short id (the ID column of gpuledger runs) or a unique id prefix;
    default: the newest run.
    """
    from gpuledger.core.ids import short_id
    from gpuledger.reports.run import report as runreport
    from gpuledger.reports.run.cost_hook import rate_card_configured
    from gpuledger.runs.view import load_run

    with_cost = rate_card_configured() if cost is None else cost
    check_report_rate_card(with_cost)
    ledger = open_ledger(db)
    record = load_run(ledger, resolve_run(ledger, run))
    model = runreport.build(ledger, record, with_history=not no_history, with_cost=with_cost)
    if fmt == "json":
        from gpuledger.reports.render_html import script_json

        write_output(script_json(model) + "\n", output)
    elif fmt == "md":
        from gpuledger.reports.render_md import render_run

        write_output(render_run(model), output)
    else:
        from gpuledger.reports.render_html import render_run

        write_output(render_run(model), output, f"gpuledger-{short_id(record.id)}.html")


@click.command("compare")
@click.argument("runs", nargs=-1, required=True)
@format_option("table", "html", "md", "json")
@click.option(
    "-o", "--output", type=OutputPath(), help="Where to write (default: stdout; HTML: gpuledger-compare.html)."
)
@click.option(
    "--cost/--no-cost",
    "cost",
    default=None,
    help="Compare money too. Default: only when a rate card is configured ($GPULEDGER_RATES).",
)
@click.option(
    "--claim",
    metavar="PCT",
    help="Two evaluation runs A B: answer a claimed inference speed-up of B over A (e.g. 30%) in one line.",
)
@db_option
@cli_errors
def compare_cmd(
    runs: tuple[str, ...], fmt: str, output: str | None, cost: bool | None, claim: str | None, db: str | None
) -> None:
    """Runs side by side: resource figures, cost when priced, aligned per-epoch curves.

    Differences in % are against the first run. RUNS are run ids, short ids or unique id prefixes.
    Evaluation runs (yolo val/predict/benchmark) add inference ms and FPS, energy per image, power
    and mAP, with a verdict on whether each run is comparable with the first (same split, GPU,
    settings, software; each difference named).
    """
    if len(runs) < 2:
        raise click.UsageError("give at least two runs to compare")
    from gpuledger.reports.run import compare
    from gpuledger.reports.run.comparability import ClaimError, parse_claim

    if claim is not None:
        if len(runs) != 2:
            raise click.UsageError("--claim compares exactly two runs: the baseline A, then B")
        try:
            parse_claim(claim)
        except ClaimError as exc:
            raise click.UsageError(str(exc)) from exc
    from gpuledger.reports.run.cost_hook import rate_card_configured
    from gpuledger.runs.view import load_run

    with_cost = rate_card_configured() if cost is None else cost
    check_report_rate_card(with_cost)
    ledger = open_ledger(db)
    records = [load_run(ledger, ledger.resolve(ref)) for ref in runs]
    try:
        model = compare.build(ledger, records, with_cost=with_cost, claimed=claim)
    except ClaimError as exc:  # --claim on runs without inference figures
        raise click.ClickException(str(exc)) from exc
    if fmt == "json":
        from gpuledger.reports.render_html import script_json

        write_output(script_json(model) + "\n", output)
    elif fmt == "md":
        from gpuledger.reports.render_md import render_compare

        write_output(render_compare(model), output)
    elif fmt == "html":
        from gpuledger.reports.render_html import render_compare

        write_output(render_compare(model), output, "gpuledger-compare.html")
    elif claim is not None:  # the dispute answered in one line
        write_output(model["claim"] + "\n", output)
    elif output in (None, STDOUT):
        from gpuledger.cli.report_render import compare_table

        compare_table(model)
    else:  # the table as plain text in a file
        from rich.console import Console

        from gpuledger.cli.report_render import compare_table

        buffer = io.StringIO()
        compare_table(model, Console(file=buffer, width=200, color_system=None))
        write_output(buffer.getvalue(), output)
