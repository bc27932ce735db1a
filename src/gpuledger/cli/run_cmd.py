"""``gpuledger run``: meter a command into the ledger."""

from __future__ import annotations

import sys

import click

from gpuledger.cli.common import FiniteFloat, check_ledger_url, db_option, labels_with
from gpuledger.cli.token_file_check import token_file_given
from gpuledger.recorder.recorder import MAX_INTERVAL_S, MIN_INTERVAL_S


def _trace_found(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A mistyped trace is refused before CMD starts: else the run would be marked replayed with no
    GPU at all. A trace that is found but malformed is still reported at the start, as before."""
    if value is None:
        return None
    from gpuledger.collect.replay import TraceError, resolve_trace

    try:
        resolve_trace(value)
    except TraceError as exc:
        raise click.BadParameter(f"{value!r}: {exc}") from exc
    return value


@click.command(
    "run",
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
)
@click.option("--name", help="A name for the run (default: none).")
@click.option("--project", help="Project label (also GPULEDGER_PROJECT).")
@click.option("--team", help="Team label (also GPULEDGER_TEAM).")
@click.option("--label", "labels", multiple=True, metavar="KEY=VALUE", help="A free label; repeatable.")
@click.option(
    "--interval",
    type=FiniteFloat(MIN_INTERVAL_S, MAX_INTERVAL_S),
    default=5.0,
    show_default=True,
    help="Recording interval in seconds.",
)
@db_option
@click.option(
    "--replay-gpus",
    "replay",
    metavar="TRACE",
    help="Feed a recorded GPU trace (a file, or a packaged one such as a100x2-example) instead of real "
    "NVML; the run is marked replayed.",
    callback=_trace_found,
)
@click.option("--no-gpu", is_flag=True, help="Do not meter GPUs (host metrics only).")
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    help="Serve Prometheus /metrics from this process on PORT while the run records (see docs/PROMETHEUS.md).",
)
@click.option("--metrics-host", default="127.0.0.1", show_default=True, help="Address for --metrics-port to listen on.")
@click.option(
    "--server",
    envvar="GPULEDGER_SERVER",
    metavar="URL",
    help="Also push the run to this team server (from the local ledger's outbox, in the background).",
)
@click.option(
    "--token-file",
    type=click.Path(exists=True, dir_okay=False),
    help="File holding the server token (default: GPULEDGER_TOKEN).",
    callback=token_file_given,
)
@click.option("--quiet", "-q", is_flag=True, help="No summary at the end.")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def run_cmd(
    name: str | None,
    project: str | None,
    team: str | None,
    labels: tuple[str, ...],
    interval: float,
    db: str | None,
    replay: str | None,
    no_gpu: bool,
    metrics_port: int | None,
    metrics_host: str,
    server: str | None,
    token_file: str | None,
    quiet: bool,
    command: tuple[str, ...],
) -> None:
    """Run COMMAND and meter it: gpuledger run [OPTIONS] -- COMMAND [ARGS]...

    COMMAND's output is shown live and archived; gpuledger exits with COMMAND's status
    (128+N when it died of signal N).
    """
    from gpuledger.cli.run_hooks import run_hooks
    from gpuledger.recorder.wrap import WrapOptions, run_and_exit_code

    label_map = labels_with(labels, project, team)  # a duplicate or empty label: refused before CMD starts
    if db:  # a team server's database: refused before CMD starts, not at its first flush
        _refuse_unusable_ledger(db)
    token = None
    if server:
        from gpuledger.agent.client import token_from  # httpx: only for a run that pushes

        token = token_from(None, token_file)
    opts = WrapOptions(
        name=name,
        labels=label_map,
        interval_s=interval,
        db_url=db,
        replay_trace=replay,
        no_gpu=no_gpu,
        summary=not quiet,
        metrics_port=metrics_port,
        metrics_host=metrics_host,
        hooks=run_hooks(server or None, token, db),
    )
    sys.exit(run_and_exit_code(list(command), opts))


def _refuse_unusable_ledger(db: str) -> None:
    """Refuse, before CMD starts, a ledger that can never be written (bad URL, no driver) and a
    team server's database (runs go into it through the server)."""
    from gpuledger.store.run_writer import RunWriter

    writer = RunWriter.open(db)  # a local SQLite ledger, current and not a team's: nothing to refuse,
    if writer is not None:  # and SQLAlchemy is not loaded to say so
        writer.close()
        return
    check_ledger_url(db)
    from gpuledger.store import Ledger, LedgerError, ownership

    try:
        with Ledger(db) as led:
            led.read(lambda conn: ownership.refuse_direct_recording(conn, led.url))
    except ownership.TeamLedgerRefused as exc:
        raise click.ClickException(str(exc)) from exc
    except LedgerError:
        pass  # unreachable or locked: the recorder keeps the run locally as always
