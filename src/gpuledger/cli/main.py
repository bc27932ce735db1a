"""The ``gpuledger`` command: a thin layer that parses options, calls one use case, renders."""

from __future__ import annotations

import sys

import click

from gpuledger import __version__
from gpuledger.cli import admin_cmds, audit_cmds, report_cmds, server_cmds
from gpuledger.cli.cost_cmds import cost_cmd, report_group
from gpuledger.cli.import_cmd import import_cmd
from gpuledger.cli.read_cmds import export_cmd, logs_cmd, recover_cmd, runs_cmd, show_cmd
from gpuledger.cli.run_cmd import run_cmd


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gpuledger")
def cli() -> None:
    """Meter, archive and price GPU training runs.

    \b
    gpuledger run -- yolo train data=coco128.yaml model=yolov8n.yaml
    gpuledger runs
    gpuledger show RUN
    """


cli.add_command(run_cmd)
cli.add_command(runs_cmd)
cli.add_command(show_cmd)
cli.add_command(logs_cmd)
cli.add_command(export_cmd)
cli.add_command(cost_cmd)
cli.add_command(report_group)
cli.add_command(report_cmds.report_group)  # report run (and the cost engineer's chargeback)
cli.add_command(report_cmds.compare_cmd)
cli.add_command(report_cmds.query_group)
cli.add_command(report_cmds.top_cmd)
cli.add_command(recover_cmd)
cli.add_command(import_cmd)
# team server (docs/SERVER.md)
cli.add_command(server_cmds.serve_cmd)
cli.add_command(server_cmds.db_group)
cli.add_command(server_cmds.sync_cmd)
cli.add_command(admin_cmds.admin_group)
cli.add_command(audit_cmds.audit_group)
cli.add_command(audit_cmds.retention_group)


def main() -> None:
    try:
        cli(prog_name="gpuledger")
    except KeyboardInterrupt:
        sys.exit(130)
