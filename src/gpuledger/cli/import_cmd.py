"""``gpuledger import ultralytics PATH...``: past training directories as runs of status ``imported``."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from gpuledger.cli.common import cli_errors, db_option, echo_json, format_option, labels_with, open_ledger
from gpuledger.core.units import fmt_count


@click.group("import")
def import_cmd() -> None:
    """Bring runs recorded by other tools into the ledger."""


@import_cmd.command("ultralytics")
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option("-r", "--recursive", is_flag=True, help="Import every run directory found under each PATH.")
@click.option("--project", help="Project label for the imported runs.")
@click.option("--team", help="Team label for the imported runs.")
@click.option("--label", "labels", multiple=True, metavar="KEY=VALUE", help="A free label; repeatable.")
@format_option("table", "json")
@db_option
@cli_errors
def import_ultralytics(
    paths: tuple[Path, ...],
    recursive: bool,
    project: str | None,
    team: str | None,
    labels: tuple[str, ...],
    fmt: str,
    db: str | None,
) -> None:
    """Import Ultralytics run directories (results.csv, args.yaml, weights/).

    \b
    gpuledger import ultralytics runs/detect/train runs/detect/train2
    gpuledger import ultralytics -r runs/

    Epochs become metrics, args.yaml the run's configuration; there is no resource data. Importing
    the same directory twice changes nothing. Exits 1 if any PATH could not be imported.
    """
    from gpuledger.importers.ultralytics import NotARunDirectory, find_run_dirs, import_run_dir

    given = labels_with(labels, project, team)
    targets: list[Path] = []
    for path in paths:
        found = find_run_dirs(path) if recursive and path.is_dir() else []
        targets += found or [path]
    ledger = open_ledger(db, create=True)
    results, failed = [], 0
    for path in targets:
        try:
            result = import_run_dir(ledger, path, labels=given)
        except (NotARunDirectory, RuntimeError, OSError, ValueError) as exc:
            failed += 1
            click.echo(f"Error: {exc}", err=True)  # the others are still imported; exit 1 at the end
            results.append({"path": str(path), "error": str(exc)})
            continue
        results.append(
            {
                "path": result.path,
                "run_id": result.run_id,
                "created": result.created,
                "epochs": result.epochs,
                "also_recorded_as": result.also_recorded_as,
            }
        )
        if fmt != "json":
            what = "imported" if result.created else "already imported"
            note = f" (also recorded live as run {result.also_recorded_as})" if result.also_recorded_as else ""
            click.echo(f"{what:16} {result.run_id}  {result.path}  {fmt_count(result.epochs, 'epoch')}{note}")
    if fmt == "json":
        echo_json(results)
    if failed:
        sys.exit(1)
