"""``gpuledger runs | show | logs | export``: reading the ledger back."""

from __future__ import annotations

import sys

import click

from gpuledger.cli.common import db_option, echo_json, open_ledger


def _fail_on_lookup(func):
    """Turn ledger lookup errors (unknown or ambiguous run) into one-line CLI errors."""
    import functools

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        from gpuledger.store import LedgerError

        try:
            return func(*args, **kwargs)
        except LedgerError as exc:
            raise click.ClickException(str(exc)) from exc

    return wrapper


@click.command("runs")
@click.option("--project")
@click.option("--team")
@click.option("--user")
@click.option(
    "--status", type=click.Choice(["running", "succeeded", "failed", "killed", "lost", "imported", "discovered"])
)
@click.option("--since", help="Only runs started since: 2026-11-01, an ISO timestamp, or 3d / 12h / 30m.")
@click.option("--limit", type=click.IntRange(1), default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--server", metavar="URL", help="List from a team server instead of the local ledger.")
@click.option("--token-file", type=click.Path(exists=True, dir_okay=False), help="Server token file.")
@db_option
@_fail_on_lookup
def runs_cmd(project, team, user, status, since, limit, as_json, server, token_file, db) -> None:
    """List runs, newest first."""
    if server:
        from gpuledger.agent.remote import list_remote_runs

        rows = list_remote_runs(server, token_file, project=project, team=team, user=user, status=status,
                                since=since, limit=limit)  # fmt: skip
        if as_json:
            echo_json(rows)
        else:
            from gpuledger.cli.render import runs_table

            runs_table(rows)
        return
    from gpuledger.reports.runview import list_rows, parse_since

    try:
        since_t = parse_since(since) if since else None
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--since") from exc
    ledger = open_ledger(db)
    runs = ledger.list_runs(project=project, team=team, user=user, status=status, since=since_t, limit=limit)
    rows = list_rows(ledger, runs)
    if status:  # a run may have turned "lost" while being read
        rows = [r for r in rows if r["status"] == status]
    if as_json:
        echo_json(rows)
        return
    from gpuledger.cli.render import runs_table

    runs_table(rows)


@click.command("show")
@click.argument("run")
@click.option("--json", "as_json", is_flag=True, help="Print the full record as JSON.")
@db_option
@_fail_on_lookup
def show_cmd(run: str, as_json: bool, db: str | None) -> None:
    """Show one run: RUN is an id or a unique id prefix."""
    from gpuledger.core.summary import format_summary
    from gpuledger.reports.runview import load_run, summary

    ledger = open_ledger(db)
    record = load_run(ledger, run)
    data = summary(ledger, record)
    from gpuledger.reports import epochs as epochs_report

    if as_json:
        data.update(epochs_report.show_json(ledger, record))  # "epochs" and "attempts"
        echo_json(data)
    else:
        click.echo(format_summary(data))
        extra = epochs_report.show_text(ledger, record)
        if extra:
            click.echo("\n" + extra)


@click.command("logs")
@click.argument("run")
@db_option
@_fail_on_lookup
def logs_cmd(run: str, db: str | None) -> None:
    """Print a run's archived (redacted) output."""
    from gpuledger.recorder.liveness import fresh_log
    from gpuledger.reports.runview import load_run

    ledger = open_ledger(db)
    record = load_run(ledger, run)
    data = fresh_log(ledger, record)
    if data is None:
        raise click.ClickException(f"run {record.id} has no archived log")
    sys.stdout.buffer.write(data)
    sys.stdout.flush()


@click.command("export")
@click.argument("run")
@click.option("--format", "fmt", type=click.Choice(["csv", "jsonl", "parquet"]), default="csv", show_default=True)
@click.option("-o", "--output", type=click.Path(dir_okay=False, writable=True), help="File to write (default: stdout).")
@click.option(
    "--metrics", is_flag=True, help="The per-epoch table (metrics and each epoch's resources; columns: docs/YOLO.md)."
)
@db_option
@_fail_on_lookup
def export_cmd(run: str, fmt: str, output: str | None, metrics: bool, db: str | None) -> None:
    """Export a run's interval time series (columns: docs/EXPORT.md), or with --metrics its epochs."""
    from gpuledger.reports import epochs as er
    from gpuledger.reports import export
    from gpuledger.reports.runview import load_run

    ledger = open_ledger(db)
    record = load_run(ledger, run)
    if fmt == "parquet" and not output:
        raise click.UsageError("Parquet is binary: give a file with -o FILE")
    if metrics:
        columns, epoch_rows = er.export_rows(record.id, er.epoch_table(ledger, record))
        if fmt == "parquet":
            er.write_parquet(columns, epoch_rows, output)
            return
        text = er.to_csv(columns, epoch_rows) if fmt == "csv" else er.to_jsonl(columns, epoch_rows)
    else:
        rows = export.interval_rows(
            record.id, ledger.devices(record.id), ledger.gpu_intervals(record.id), ledger.host_intervals(record.id)
        )
        if fmt == "parquet":
            try:
                export.write_parquet(rows, output)
            except RuntimeError as exc:
                raise click.ClickException(str(exc)) from exc
            return
        text = export.to_csv(rows) if fmt == "csv" else export.to_jsonl(rows)
    if output:
        with open(output, "w", encoding="utf-8") as fh:
            fh.write(text)
    else:
        sys.stdout.write(text)


@click.command("recover")
@click.argument("files", nargs=-1, type=click.Path(exists=True, dir_okay=False))
@db_option
def recover_cmd(files: tuple[str, ...], db: str | None) -> None:
    """Write runs kept in the local spool (the ledger was unreachable when they ended) into the ledger."""
    from pathlib import Path

    from gpuledger.recorder.spool import recover, spool_dir

    paths = [Path(f) for f in files] or sorted(spool_dir().glob("*.json"))
    if not paths:
        click.echo(f"nothing to recover: {spool_dir()} holds no spooled runs")
        return
    ledger = open_ledger(db)
    failed = 0
    for path in paths:
        try:
            run_id = recover(path, ledger)
        except Exception as exc:
            failed += 1
            click.echo(f"{path}: {exc}", err=True)
            continue
        click.echo(f"recovered run {run_id}")
    if failed:
        raise SystemExit(1)
