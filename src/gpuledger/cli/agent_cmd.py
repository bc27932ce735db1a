"""``gpuledger agent``: meter and attribute every GPU process of this node, wrapped or not (docs/AGENT.md)."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import click

from gpuledger.cli.common import FiniteFloat, db_option
from gpuledger.cli.token_file_check import token_file_given
from gpuledger.core.metering.owners import DEFAULT_COPY_LABELS
from gpuledger.recorder.recorder import MAX_INTERVAL_S, MIN_INTERVAL_S

FIRST_ANSWER_S = 6.0  # how long the start report waits for the platforms' first answers (Docker: 5 s)
OFF = ("", "none", "off")


def _say(line: str) -> None:
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


@click.group("agent", invoke_without_command=True)  # mig-map: the Slurm prolog's helper
@click.option(
    "--server",
    envvar="GPULEDGER_SERVER",
    metavar="URL",
    help="Also push every discovered run to this team server (through the local ledger's outbox).",
)
@click.option(
    "--token-file",
    type=click.Path(exists=True, dir_okay=False),
    help="File holding the server token (default: GPULEDGER_TOKEN).",
    callback=token_file_given,
)
@db_option
@click.option(
    "--interval",
    type=FiniteFloat(MIN_INTERVAL_S, MAX_INTERVAL_S),  # nan would pass a FloatRange
    default=10.0,
    show_default=True,
    help="Recording interval in seconds (a reading every fifth of it, at most every 2 s).",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    help="Serve Prometheus /metrics on this port (per GPU, with owner labels).",
)
@click.option("--metrics-host", default="127.0.0.1", show_default=True, help="Address for --metrics-port.")
@click.option("--dcgm-names", is_flag=True, help="Also expose dcgm-exporter's metric names and labels.")
@click.option(
    "--copy-labels",
    default=",".join(DEFAULT_COPY_LABELS),
    show_default=True,
    metavar="K1,K2",
    help="Container / pod labels a discovered run takes (keys or globs; gpuledger.K sets K).",
)
@click.option(
    "--docker-socket",
    default="/var/run/docker.sock",
    show_default=True,
    metavar="PATH",
    help="Docker Engine API socket (or a read-only proxy's); 'none' switches Docker off.",
)
@click.option(
    "--kubelet-socket",
    default="/var/lib/kubelet/pod-resources/kubelet.sock",
    show_default=True,
    metavar="PATH",
    help="The kubelet's pod-resources socket; 'none' switches Kubernetes off.",
)
@click.option("--slurm/--no-slurm", default=True, show_default=True, help="Ask Slurm (scontrol) about its jobs.")
@click.option(
    "--proc-root",
    default="/proc",
    show_default=True,
    type=click.Path(file_okay=False),
    help="Where the host's /proc is (e.g. /host/proc in a container).",
)
@click.option(
    "--cgroup-root",
    default="/sys/fs/cgroup",
    show_default=True,
    type=click.Path(file_okay=False),
    help="Where the host's cgroup hierarchy is mounted.",
)
@click.option(
    "--replay-gpus",
    "replay",
    metavar="TRACE",
    help="Read GPUs from a recorded trace instead of NVML (its process keys are host pids).",
)
def agent_cmd(
    server: str | None, token_file: str | None, db: str | None, interval: float, metrics_port: int | None,
    metrics_host: str, dcgm_names: bool, copy_labels: str, docker_socket: str, kubelet_socket: str, slurm: bool,
    proc_root: str, cgroup_root: str, replay: str | None,
) -> None:  # fmt: skip
    """Meter every GPU process on this node; processes nobody wrapped become discovered runs.

    Runs until SIGTERM or Ctrl-C, which close the open intervals; the next agent on this host
    resumes the runs still open.
    """
    if click.get_current_context().invoked_subcommand is not None:
        return  # `gpuledger agent mig-map` runs alone
    from gpuledger.core.metering.owners import parse_label_patterns

    try:
        patterns = parse_label_patterns(copy_labels)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--copy-labels") from exc
    if not os.path.isdir(proc_root):
        raise click.BadParameter(f"{proc_root} is not a directory", param_hint="--proc-root")
    from gpuledger.runs.logfile import log_cap

    try:
        log_cap(os.environ)  # the cap of the containers' archived logs, checked as `gpuledger run` does
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    ledger_url = _check_ledger(db)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    _run(stop, ledger_url=ledger_url, server=server, token_file=token_file, interval=interval,
         metrics_port=metrics_port, metrics_host=metrics_host, dcgm_names=dcgm_names, patterns=patterns,
         docker_socket=docker_socket, kubelet_socket=kubelet_socket, slurm=slurm, proc_root=proc_root,
         cgroup_root=cgroup_root, replay=replay)  # fmt: skip


@agent_cmd.command(
    "mig-map", short_help="dcgm-exporter mapping-file names of GPU/MIG UUIDs (the Slurm prolog's helper)."
)
@click.option("--replay-gpus", "replay", metavar="TRACE", help="Read the GPUs from a recorded trace instead of NVML.")
@click.argument("uuids", nargs=-1, required=True, metavar="UUID...")
def mig_map_cmd(uuids: tuple[str, ...], replay: str | None) -> None:
    """Print `<UUID> <gpu index>[.<GPU instance id>]` per GPU or MIG UUID: dcgm-exporter's mapping-file names.

    Exit 1 when a UUID is not resolved (each says why on stderr); the others are printed still.
    """
    from gpuledger.node.mig_map import Unresolved, open_nvml, resolve_all

    try:
        nv = open_nvml(replay)
    except Unresolved as exc:
        _say(f"gpuledger agent mig-map: {exc}")
        sys.exit(1)
    try:
        mapped, failed = resolve_all(nv, uuids)
    finally:
        nv.nvmlShutdown()
    for m in mapped:
        click.echo(f"{m.uuid} {m.file_name}")
    for uuid, why in failed:
        _say(f"gpuledger agent mig-map: {uuid}: {why}")
    if failed:
        sys.exit(1)


def _check_ledger(db: str | None) -> str:
    """The ledger URL; a malformed one or a too-new schema is an error, a ledger down only a warning."""
    from gpuledger.cli.common import check_ledger_url
    from gpuledger.store import Ledger, LedgerError, SchemaTooNew, default_url, display_url, normalise_url
    from gpuledger.store.url import parse

    url = normalise_url(db) if db else default_url()
    try:
        parse(url)
    except Exception as exc:
        raise click.BadParameter(f"not a database URL or path: {exc}", param_hint="--db") from exc
    check_ledger_url(url)  # an unsupported database or a missing driver can never work: refused now
    try:
        Ledger(url).close()
    except SchemaTooNew as exc:
        raise click.ClickException(str(exc)) from exc
    except LedgerError as exc:
        _say(f"gpuledger agent: the ledger {display_url(url)} is not reachable now ({exc}); recording goes on "
             "in memory and is written when it is")  # fmt: skip
    return url


def _run(stop: threading.Event, **o) -> None:  # type: ignore[no-untyped-def]
    import psutil

    from gpuledger.agent.client import normalise_server, token_from
    from gpuledger.node.agent import AgentConfig, NodeAgent
    from gpuledger.node.claims import SourceOptions
    from gpuledger.node.gpus import open_node_gpus
    from gpuledger.node.metrics import NodeMetrics, serve
    from gpuledger.node.procfacts import ProcReader
    from gpuledger.node.push import NodePusher
    from gpuledger.node.sink import LedgerSink
    from gpuledger.node.sources import load_sources
    from gpuledger.node.startup import Seen, cgroup_version, report
    from gpuledger.runs.host import host_name
    from gpuledger.store import display_url

    if o["proc_root"].rstrip("/") != "/proc":
        psutil.PROCFS_PATH = o["proc_root"]  # psutil reads the host's /proc too (process-tree figures)
    procs = ProcReader(o["proc_root"])
    gpu, gpu_note = open_node_gpus(o["replay"])
    devices = gpu.devices() if gpu is not None else []
    wanted = [name for name, on in (("docker", o["docker_socket"].strip().lower() not in OFF),
                                    ("kubelet", o["kubelet_socket"].strip().lower() not in OFF),
                                    ("slurm", o["slurm"])) if on]  # fmt: skip
    options = SourceOptions(docker_socket=o["docker_socket"], kubelet_socket=o["kubelet_socket"],
                            proc_root=o["proc_root"],
                            gpus=tuple((d.nvml_index if d.nvml_index is not None else d.index, d.uuid)
                                       for d in devices))  # fmt: skip
    sources = load_sources(wanted, options)
    sources.start()
    server = normalise_server(o["server"]) if o["server"] else None
    pusher = NodePusher(o["ledger_url"], server, token_from(None, o["token_file"]), warn=_say) if server else None
    host = host_name()
    sink = LedgerSink(o["ledger_url"], host=host, boot_id=procs.boot_id(), warn=_say, pusher=pusher)
    metrics, served = None, None
    if o["metrics_port"] is not None:
        metrics = NodeMetrics(host, dcgm_names=o["dcgm_names"])
        try:
            served = serve(metrics, o["metrics_port"], o["metrics_host"])
        except OSError as exc:
            _say(f"gpuledger agent: cannot serve /metrics on {o['metrics_host']}:{o['metrics_port']} ({exc})")
            metrics = None
    config = AgentConfig(host=host, interval_s=o["interval"], copy_labels=o["patterns"],
                         cgroup_root=o["cgroup_root"], replayed=o["replay"] is not None)  # fmt: skip
    agent = NodeAgent(config, gpu=gpu, procs=procs, sources=sources, sink=sink, metrics=metrics,
                      boot_id=procs.boot_id(), boot_time=procs.boot_time(),
                      gpu_opener=None if o["replay"] else lambda: open_node_gpus(None), warn=_say)  # fmt: skip
    sink.start()
    if pusher is not None:
        pusher.start()
    _await_first_answers(sources, stop)
    port = served[0].server_port if served else None  # type: ignore[index]
    seen = Seen(
        gpus=devices, gpu_note=gpu_note, host_pids=procs.host_pid_namespace(),
        environ_others=procs.environ_readable_for_others(), uid=os.getuid(), cgroup_root=o["cgroup_root"],
        cgroup_version=cgroup_version(o["cgroup_root"]), sources=sources.states(),
        disabled=[n for n in ("docker", "kubelet", "slurm") if n not in wanted], ledger=display_url(o["ledger_url"]),
        gpu_retry=gpu is None and o["replay"] is None,
        server=server, metrics=f"{o['metrics_host']}:{port}" if port is not None else None,
    )  # fmt: skip
    _say(f"gpuledger agent on {host}, reading every {config.tick:g} s, intervals of {config.interval_s:g} s:")
    for line in report(seen):
        _say("  " + line)
    agent.run(stop)
    _stop(agent, sources, sink, pusher, served)


def _await_first_answers(sources, stop: threading.Event) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + FIRST_ANSWER_S
    while time.monotonic() < deadline and not stop.is_set():
        if all(s.answered_at is not None for s in sources.states() if s.name not in sources.missing):
            return
        stop.wait(0.1)


def _stop(agent, sources, sink, pusher, served) -> None:  # type: ignore[no-untyped-def]
    agent.shutdown()
    sources.stop()
    left = len(agent.tracks)
    written = sink.close(timeout_s=10.0)
    if pusher is not None:
        pusher.close(timeout_s=5.0)
    if served is not None:
        server, _thread = served
        server.shutdown()
        server.server_close()
    tail = "" if written else f"; {sink.pending()} write(s) could not reach the ledger and are lost"
    _say(f"gpuledger agent: stopped; {left} discovered run(s) left open for the next agent on this host{tail}")
