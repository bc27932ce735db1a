"""The ``gpuledger`` command: a thin layer that parses options, calls one use case, renders.

Subcommands are imported only when called, so ``gpuledger run`` starts the training without
first loading the server, report and cost code.
"""

from __future__ import annotations

import contextlib
import importlib
import signal
import sys

import click

from gpuledger import __version__

# name -> "module:attribute" of the click command
COMMANDS: dict[str, str] = {
    "run": "gpuledger.cli.run_cmd:run_cmd",
    "agent": "gpuledger.cli.agent_cmd:agent_cmd",  # the node agent: every GPU process, wrapped or not
    "runs": "gpuledger.cli.read_cmds:runs_cmd",
    "show": "gpuledger.cli.read_cmds:show_cmd",
    "logs": "gpuledger.cli.read_cmds:logs_cmd",
    "export": "gpuledger.cli.read_cmds:export_cmd",
    "recover": "gpuledger.cli.read_cmds:recover_cmd",
    "import": "gpuledger.cli.import_cmd:import_cmd",
    "cost": "gpuledger.cli.cost_cmds:cost_cmd",
    "report": "gpuledger.cli.report_cmds:report_group",  # run; chargeback and rollup attach to it
    "compare": "gpuledger.cli.report_cmds:compare_cmd",
    "lineage": "gpuledger.cli.lineage_cmd:lineage_cmd",  # a model's line from one id
    "query": "gpuledger.cli.report_cmds:query_group",
    "top": "gpuledger.cli.report_cmds:top_cmd",
    "completion": "gpuledger.cli.completion_cmd:completion_cmd",  # bash, zsh, fish
    # team server (docs/SERVER.md)
    "serve": "gpuledger.cli.server_cmds:serve_cmd",
    "db": "gpuledger.cli.server_cmds:db_group",
    "sync": "gpuledger.cli.server_cmds:sync_cmd",
    "admin": "gpuledger.cli.admin_cmds:admin_group",
    "audit": "gpuledger.cli.audit_cmds:audit_group",
    "retention": "gpuledger.cli.audit_cmds:retention_group",
}
# Modules that attach subcommands to a group defined elsewhere (report chargeback, report rollup).
GROUP_EXTENSIONS: dict[str, tuple[str, ...]] = {"report": ("gpuledger.cli.cost_cmds", "gpuledger.cli.capacity_cmds")}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        module_name, attr = target.split(":")
        for extension in GROUP_EXTENSIONS.get(cmd_name, ()):
            importlib.import_module(extension)
        command = getattr(importlib.import_module(module_name), attr)
        return command

    def invoke(self, ctx: click.Context) -> object:
        """Every subcommand's user-caused errors become one ``Error:`` line (cli/common.py)."""
        from gpuledger.cli.common import friendly

        try:
            result = super().invoke(ctx)
            sys.stdout.flush()  # a reader gone is found here, not in the interpreter's exit
            return result
        except BrokenPipeError:
            # stdout's reader stopped early (| head): quietly, and 0 as for export and logs; a
            # broken pipe that is not stdout's (a socket, an -o FIFO) is still the error it is
            from gpuledger.cli.output import silence_stdout, stdout_reader_gone

            if not stdout_reader_gone():
                raise
            silence_stdout()
            raise click.exceptions.Exit(0) from None
        except KeyboardInterrupt:
            # Ctrl-C: exit 130 as a shell, docker or kubectl do, not click's "Aborted!" with 1.
            raise click.exceptions.Exit(interrupted()) from None
        except click.ClickException:
            raise
        except Exception as exc:
            translated = friendly(exc)
            if translated is None:
                raise
            raise translated from exc


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gpuledger")
def cli() -> None:
    """Meter, archive and price GPU training runs.

    \b
    gpuledger run -- yolo train data=coco128.yaml model=yolov8n.yaml
    gpuledger runs
    gpuledger show RUN
    """


INTERRUPTED = 130  # 128 + SIGINT


def interrupted() -> int:
    """One short line for a Ctrl-C, and a second Ctrl-C during the exit ends the process (still
    130 to the shell) instead of printing a traceback from the clean-up."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write("\ngpuledger: interrupted\n")
        sys.stderr.flush()
    return INTERRUPTED


def main() -> None:
    try:
        cli(prog_name="gpuledger")
    except KeyboardInterrupt:  # before or after a subcommand ran (parsing, loading it)
        sys.exit(interrupted())
