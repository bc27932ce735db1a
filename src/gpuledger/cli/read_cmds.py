"""``gpuledger runs | show | logs | export | recover``: reading the ledger back."""

from __future__ import annotations

import sys

import click

from gpuledger.cli.common import (
    check_ledger_url,
    cli_errors,
    db_option,
    echo_json,
    format_option,
    named,
    open_ledger,
    parse_labels,
    resolve_run,
)
from gpuledger.cli.output import OutputPath, write_text, write_text_with, write_with
from gpuledger.cli.token_file_check import token_file_given

STATUSES = ["running", "succeeded", "failed", "killed", "lost", "imported", "discovered"]


@click.command("runs")
@click.option("--project", callback=named)
@click.option("--team", callback=named)
@click.option("--user", callback=named)
@click.option("--status", type=click.Choice(STATUSES))
@click.option("--label", "labels", multiple=True, metavar="KEY=VALUE", help="Only runs with this label; repeatable.")
@click.option("--since", help="Only runs started since: 2026-11-01, an ISO timestamp, or 3d / 12h / 30m.")
@click.option("--limit", type=click.IntRange(1), default=50, show_default=True)
@format_option("table", "json")
@click.option("--server", metavar="URL", help="List from a team server instead of the local ledger.")
@click.option(
    "--token-file", type=click.Path(exists=True, dir_okay=False), callback=token_file_given, help="Server token file."
)
@db_option
@cli_errors
def runs_cmd(project, team, user, status, labels, since, limit, fmt, server, token_file, db) -> None:  # type: ignore[no-untyped-def]
    """List runs, newest first. The ID column is each run's short id: give it to show, logs, cost ..."""
    from gpuledger.cli.render import runs_table

    label_map = parse_labels(labels)
    given = [
        f"--{k} {v}"
        for k, v in (("project", project), ("team", team), ("user", user), ("status", status), ("since", since))
        if v
    ]
    given += [f"--label {k}={v}" for k, v in label_map.items()]
    if server:
        if label_map:
            raise click.UsageError(
                "--label filters the local ledger only; a team server filters by project, "
                "team, user, status and --since"
            )
        from gpuledger.agent.remote import list_remote_runs

        rows = list_remote_runs(server, token_file, project=project, team=team, user=user, status=status,
                                since=since, limit=limit)  # fmt: skip
        empty_ledger = False
        if not rows and not given and fmt != "json":
            from gpuledger.agent.remote import nothing_visible

            click.echo(nothing_visible(server, token_file))
            return
    else:
        from gpuledger.runs.view import list_rows, parse_since

        try:
            since_t = parse_since(since) if since else None
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--since") from exc
        ledger = open_ledger(db)
        runs = ledger.list_runs(project=project, team=team, user=user, status=status, since=since_t,
                                labels=label_map or None, limit=limit)  # fmt: skip
        rows = list_rows(ledger, runs)
        if status:  # a run may have turned "lost" while being read
            rows = [r for r in rows if r["status"] == status]
        empty_ledger = not rows and not ledger.list_runs(limit=1)
    if fmt == "json":
        echo_json(rows)
    elif rows:
        runs_table(rows)
    elif empty_ledger:
        click.echo("no runs yet: record one with gpuledger run -- COMMAND")
    else:
        click.echo(f"no run matches {' '.join(given)}" if given else "no run matches")


@click.command("show")
@click.argument("run", required=False)
@format_option("table", "json")
@db_option
@cli_errors
def show_cmd(run: str | None, fmt: str, db: str | None) -> None:
    """Show one run: summary, epochs and attempts; --json gives the full record.

    RUN is a run id, its short id (the ID column of gpuledger runs) or a unique id prefix;
    default: the newest run."""
    from gpuledger.core.metering.summary import format_summary
    from gpuledger.reports.run import epochs as epochs_report
    from gpuledger.runs.view import load_run, summary

    ledger = open_ledger(db)
    record = load_run(ledger, resolve_run(ledger, run))
    data = summary(ledger, record)
    if fmt == "json":
        data.update(epochs_report.show_json(ledger, record))  # "epochs" and "attempts"
        echo_json(data)
        return
    from gpuledger.cli.report_fit import fit_prose, grid_lines, terminal_width

    width = terminal_width()  # None: piped, whole values
    if width and data.get("name"):  # a 10 kB name must not push the status off the screen
        from gpuledger.cli.table_fit import cut

        data = {**data, "name": cut(str(data["name"]), max(12, width // 3))}
    text = format_summary(data, width or 0)
    from gpuledger.cli.eval_view import evaluation_text

    if evaluation := evaluation_text(record.meta, width):  # an evaluation run (yolo val | predict | benchmark)
        text += "\n\n" + evaluation
    extra = epochs_report.show_text(ledger, record, grid_lines(width) if width else None)
    if extra:
        text += "\n\n" + extra
    click.echo(fit_prose(text, width) if width else text)


@click.command("logs")
@click.argument("run", required=False)
@click.option("--raw", is_flag=True, help="Print the bytes as stored, escape sequences included, even to a terminal.")
@db_option
@cli_errors
def logs_cmd(run: str | None, raw: bool, db: str | None) -> None:
    """Print a run's archived (redacted) output.

    RUN is a run id, its short id or a unique id prefix; default: the newest run. A log longer
    than the cap (GPULEDGER_LOG_MAX_B, 64 MiB) keeps its head and tail: stderr then says so.
    To a terminal, control characters and escape sequences other than colours are shown as text
    (\\x1b[2J), so a log cannot clear the screen or set the title; piped, the bytes are as stored."""
    from gpuledger.core.training.logcap import find_cut
    from gpuledger.core.units import fmt_bytes
    from gpuledger.runs.liveness import fresh_log
    from gpuledger.runs.view import load_run

    ledger = open_ledger(db)
    record = load_run(ledger, resolve_run(ledger, run))
    data = fresh_log(ledger, record)
    if data is None:
        raise click.ClickException(f"run {record.id} has no archived log")
    if not data:  # nothing on stdout would look like a failure to read it
        click.echo(f"gpuledger: run {record.id} printed nothing: its log is empty", err=True)
        return
    if not raw and sys.stdout.isatty():
        from gpuledger.cli.log_escape import escape_for_terminal

        sys.stdout.buffer.write(escape_for_terminal(data))
    else:
        sys.stdout.buffer.write(data)
    sys.stdout.flush()
    cut = find_cut(data)
    if cut is not None:
        click.echo(
            f"gpuledger: this log was cut: {fmt_bytes(cut.cut_b)} in the middle are not kept; the first "
            f"{fmt_bytes(cut.head_b)} and the last {fmt_bytes(cut.tail_b)} of {fmt_bytes(cut.total_b)} are "
            f"(the cap is {fmt_bytes(cut.cap_b)}, set by GPULEDGER_LOG_MAX_B)",
            err=True,
        )


@click.command("export")
@click.argument("run", required=False)
@click.option("--format", "fmt", type=click.Choice(["csv", "jsonl", "parquet"]), default="csv", show_default=True)
@click.option("-o", "--output", type=OutputPath(), help="File to write (default: stdout).")
@click.option(
    "--metrics", is_flag=True, help="The per-epoch table (metrics and each epoch's resources; columns: docs/YOLO.md)."
)
@db_option
@cli_errors
def export_cmd(run: str | None, fmt: str, output: str | None, metrics: bool, db: str | None) -> None:
    """Export a run's interval time series (columns: docs/EXPORT.md), or with --metrics its epochs.

    RUN is a run id, its short id or a unique id prefix; default: the newest run.
    Parquet needs the [parquet] extra: pip install 'gpuledger[parquet]'."""
    from gpuledger.reports.run import epochs as er
    from gpuledger.reports.run import export
    from gpuledger.runs.view import load_run

    if fmt == "parquet" and output is None:  # binary on a terminal by accident; -o - asks for it
        raise click.UsageError("Parquet is binary: give a file with -o FILE (-o - for stdout)")
    ledger = open_ledger(db)
    record = load_run(ledger, resolve_run(ledger, run))
    if metrics:
        columns, epoch_rows = er.export_rows(record.id, er.epoch_table(ledger, record))
        if fmt == "parquet":
            write_with(str(output), lambda fh: er.write_parquet(columns, epoch_rows, fh))
            return
        text = er.to_csv(columns, epoch_rows) if fmt == "csv" else er.to_jsonl(columns, epoch_rows)
    else:  # streamed: rows go from the database cursor to the file a few thousand at a time
        if fmt == "parquet":
            write_with(str(output), lambda fh: export.write_parquet_stream(export.stream_rows(ledger, record.id), fh))
            return
        write_rows = export.write_csv if fmt == "csv" else export.write_jsonl
        write_text_with(output, lambda fh: write_rows(export.stream_rows(ledger, record.id), fh))
        return
    write_text(output, text)


@click.command("recover")
@click.argument("files", nargs=-1, type=click.Path(exists=True, dir_okay=False))
@db_option
@cli_errors
def recover_cmd(files: tuple[str, ...], db: str | None) -> None:
    """Write runs kept in the local spool (the ledger was unreachable when they ended) into the ledger.

    Each run goes to the ledger it was recorded for; --db on the command line sends them all elsewhere.
    A run recorded with --server is put (back) in the outbox of its servers: gpuledger sync pushes it."""
    from pathlib import Path

    from gpuledger.recorder.spool import read_target, recover, spool_dir
    from gpuledger.store import display_url

    source = click.get_current_context().get_parameter_source("db")
    override = db if source is click.core.ParameterSource.COMMANDLINE else None
    if override:
        check_ledger_url(override)
    paths = [Path(f) for f in files] or sorted(spool_dir().glob("*.json"))
    if not paths:
        click.echo(f"nothing to recover: {spool_dir()} holds no spooled runs")
        return
    ledgers: dict[str | None, object] = {}
    failed = 0
    for path in paths:
        try:
            target = override or read_target(path) or db
            if target not in ledgers:
                ledgers[target] = open_ledger(target, create=True)
            done = recover(path, ledgers[target])
        except Exception as exc:  # one bad spool file must not stop the others
            failed += 1
            said = str(exc)  # the spool's own errors name the file already
            click.echo(f"Error: {said}" if said.startswith(str(path)) else f"Error: {path}: {said}", err=True)
            continue
        where = f" into {display_url(target)}" if target else ""
        click.echo(f"recovered run {done.run_id}{where}")
        for server in done.servers:
            click.echo(f"  in the outbox for {server}: push it with: gpuledger sync --server {server}")
    for ledger in ledgers.values():
        ledger.close()  # type: ignore[attr-defined]
    if failed:
        raise SystemExit(1)
