"""``gpuledger run -- CMD``: start CMD, meter it until it ends, archive it, return its status."""

from __future__ import annotations

import contextlib
import mmap
import os
import select
import signal
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gpuledger.core.ids import uuid7
from gpuledger.core.training.candidates import attached
from gpuledger.core.training.lineindex import index_path
from gpuledger.core.training.lineindex import load as load_index
from gpuledger.core.training.logcap import windows
from gpuledger.paths import log_dir
from gpuledger.recorder.clock import SteadyClock
from gpuledger.recorder.control import ENV_VAR as CONTROL_ENV
from gpuledger.recorder.control import ControlServer
from gpuledger.recorder.edge import Edge, open_edge
from gpuledger.recorder.hooks import RunHooks
from gpuledger.recorder.launch import LaunchError, become_subreaper, copy_window_size, launch
from gpuledger.recorder.session import Session, new_run_record, stderr_line
from gpuledger.runs.logfile import log_cap, map_whole, read_capped, remove_file

if TYPE_CHECKING:
    from gpuledger.core.model import RunRecord
    from gpuledger.core.training.lineindex import LineIndex
    from gpuledger.prom.serve import MetricsServer

FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
RELAY_GRACE_S = 3.0  # after CMD ends, how long a grandchild may keep its output open


@dataclass
class WrapOptions:
    name: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    interval_s: float = 5.0
    db_url: str | None = None
    replay_trace: str | None = None
    no_gpu: bool = False
    use_pty: bool | None = None
    summary: bool = True
    metrics_port: int | None = None  # serve Prometheus /metrics from this process (0: any free port)
    metrics_host: str = "127.0.0.1"
    hooks: RunHooks = field(default_factory=RunHooks)  # integrations and the team-server push


@dataclass
class Outcome:
    exit_code: int  # what gpuledger exits with: CMD's code, or 128+N after signal N
    status: str
    signal: int | None
    reason: str | None
    summary: dict | None  # None: the run could not be written; {} when no summary was asked for (-q)
    run_id: str
    launch_error: str | None = None  # CMD could not start (said on stderr; the run is recorded as failed)


def _status(wait_status: int, forwarded: int | None) -> tuple[str, int, int | None, str | None]:
    if os.WIFSIGNALED(wait_status):
        sig = os.WTERMSIG(wait_status)
        name = signal.Signals(sig).name
        how = " (forwarded by gpuledger)" if forwarded == sig else ""
        return "killed", 128 + sig, sig, f"killed by {name}{how}"
    code = os.WEXITSTATUS(wait_status)
    # CMD may catch a forwarded signal and exit on its own (a checkpoint, then exit 0 or 1): say so.
    after = f" after {signal.Signals(forwarded).name} (forwarded by gpuledger)" if forwarded else ""
    if code == 0:
        return "succeeded", 0, None, f"exited with code 0{after}" if after else None
    return "failed", code, None, f"exited with code {code}{after}"


def child_env(
    env: Mapping[str, str], run_id: str, db_url: str | None, control_path: str, hooks: RunHooks
) -> dict[str, str]:
    out = dict(env)
    out["GPULEDGER_RUN_ID"] = run_id  # lets integrations inside CMD attach to this run
    out[CONTROL_ENV] = control_path
    if db_url:
        out["GPULEDGER_DB"] = db_url
    if hooks.child_env is not None:
        out.update(hooks.child_env(out))  # zero-code capture: integrations load inside CMD's Python
    return out


def control_socket_path(run_id: str) -> str:
    # Unix socket paths are limited to 108 bytes, so not under a possibly deep data dir.
    folder = os.path.join(tempfile.gettempdir(), f"gpuledger-{os.getuid()}")
    os.makedirs(folder, mode=0o700, exist_ok=True)
    return os.path.join(folder, f"{run_id}.sock")


def wrap(argv: Sequence[str], opts: WrapOptions, env: Mapping[str, str] | None = None) -> Outcome:
    env = dict(os.environ if env is None else env)
    try:
        log_cap_b = log_cap(env)  # a bad GPULEDGER_LOG_MAX_B is refused before CMD starts
    except ValueError as exc:
        raise LaunchError(str(exc), 2) from None
    clock = SteadyClock()  # the recorder's clock (recorder/clock.py), from the first reading on
    run_id = uuid7(int(clock() * 1000))
    log_path = str(log_dir(env) / f"{run_id}.log")
    control = ControlServer(control_socket_path(run_id))
    cmd_env = child_env(env, run_id, opts.db_url, control.path, opts.hooks)
    become_subreaper()
    edge = _open_edge(opts, env, clock)
    # The run starts at the collectors' first reading, taken right before the launch (recorder/edge.py).
    started = edge.read().t if edge is not None else clock()
    try:
        launched = launch(list(argv), cmd_env, log_path, use_pty=opts.use_pty)  # CMD runs from here on
    except LaunchError as exc:
        control.close()  # CMD never ran: leave no socket behind
        if edge is not None:
            edge.close()
        if exc.reason is None:
            raise
        from gpuledger.recorder.failed_launch import record_failed_launch

        stderr_line(f"gpuledger: {exc}")  # first: before what recording the failed run may say
        summary = record_failed_launch(_run_record(argv, opts, env, run_id, started), opts, exc)
        return Outcome(exc.exit_code, "failed", None, exc.reason, summary, run_id, launch_error=str(exc))
    if edge is not None:
        edge.host.exclude(launched.relay_pid)  # before any reading after the first: the relay is not the run's

    forwarded: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        forwarded.append(signum)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(launched.pid, signum)

    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED_SIGNALS}
    if launched.pty_master is not None:
        master = launched.pty_master
        previous[signal.SIGWINCH] = signal.signal(signal.SIGWINCH, lambda *_: copy_window_size(1, master))

    metrics = _start_metrics(opts)  # after the launch: CMD and the relay must not inherit its socket
    pusher = opts.hooks.start_push(run_id, stderr_line) if opts.hooks.start_push is not None else None
    session: Session | None = None
    if edge is not None:
        try:
            session = _start_session(
                argv,
                opts,
                env,
                run_id,
                edge,
                log_path,
                control,
                metrics,
                after_flush=pusher.wake if pusher is not None else None,
            )
        except Exception as exc:
            edge.close()
            stderr_line(f"gpuledger: monitoring could not start ({exc}); the command runs unmetered")
    wait_status = _reap_until(launched.pid, launched.relay_pid, session)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # finishing the record; CMD is already gone
    if session is not None:
        session.stop()  # the final reading: the run ends as CMD ends, not after its last output drained
    relay_done = _wait_relay(launched.relay_pid, log_path)
    status, code, sig, reason = _status(wait_status, forwarded[-1] if forwarded else None)
    summary = None
    if session is not None:
        index = _line_index(log_path, relay_done)
        log, truncated, index = _read_log(log_path, log_cap_b, index)
        with attached(log, index):
            summary = session.finish(
                status,
                exit_code=None if sig else code,
                signal=sig,
                reason=reason,
                log=log,
                log_truncated=truncated,
                explain=opts.hooks.explain,
                log_still_written=not relay_done,
                summarize=opts.summary,
            )
        session.close()
        if isinstance(log, mmap.mmap):
            with contextlib.suppress(BufferError):  # a reader still holding a view: freed with it
                log.close()
        if summary is not None and log is not None and relay_done:
            remove_file(log_path)  # archived in the ledger: the file was only the crash-safe copy
    if pusher is not None:
        pusher.finish(stderr_line)
    if metrics is not None:
        metrics.stop()
    control.close()
    for signum, handler in previous.items():
        signal.signal(signum, handler)
    if launched.pty_master is not None:
        os.close(launched.pty_master)
    return Outcome(code, status, sig, reason, summary, run_id)


def _line_index(log_path: str, relay_done: bool) -> LineIndex | None:
    """The relay's index of the log's lines (core/training/lineindex.py), once the relay has ended."""
    if not relay_done:
        return None
    path = index_path(log_path)
    index = load_index(path)
    remove_file(path)
    return index


def _read_log(
    log_path: str, cap_b: int, index: LineIndex | None
) -> tuple[bytes | mmap.mmap | None, bool, LineIndex | None]:
    """The log as it will be stored, whether it is capped, and the index when it describes those
    bytes. A whole log the index covers line by line is mapped, not read (runs/logfile.map_whole):
    the end-of-run readers only cut its candidate lines out. Any other log is read: capped (the
    index, if any, is dropped: it describes the whole output), one whose every line is read, or
    one that could not be mapped."""
    if index is not None and not index.every_line and not windows(index.size, cap_b)[0]:
        mapped = map_whole(log_path, index.size)
        if mapped is not None:
            return mapped, False, index
    capped = read_capped(log_path, cap_b)
    if capped is None:
        return None, False, None
    return capped.data, capped.truncated, None if capped.truncated else index


def _open_edge(opts: WrapOptions, env: Mapping[str, str], clock: SteadyClock) -> Edge | None:
    """The run's collectors, opened before the launch; None (said on stderr) when they cannot be."""
    try:
        return open_edge(env, clock, interval_s=opts.interval_s, no_gpu=opts.no_gpu, replay_trace=opts.replay_trace)
    except Exception as exc:
        stderr_line(f"gpuledger: monitoring could not start ({exc}); the command runs unmetered")
        return None


def _start_session(
    argv: Sequence[str],
    opts: WrapOptions,
    env: Mapping[str, str],
    run_id: str,
    edge: Edge,
    log_path: str,
    control: ControlServer,
    metrics: MetricsServer | None = None,
    after_flush: Callable[[], None] | None = None,
) -> Session:
    assert edge.primed is not None
    run = _run_record(argv, opts, env, run_id, edge.primed.t, log_path)
    session = Session(
        opts.db_url,
        run,
        host=edge.host,
        gpu=edge.gpu,
        gpu_note=edge.gpu_note,
        clock=edge.clock,
        control=control,
        on_interval=metrics.live.observe if metrics is not None else None,
        after_flush=after_flush,
        primed=edge.primed,
        slow_notice=opts.summary,  # run -q: quiet unless the write fails
    )
    if metrics is not None:
        metrics.live.bind(session.run, session.devices)
    session.start()
    return session


def _run_record(
    argv: Sequence[str],
    opts: WrapOptions,
    env: Mapping[str, str],
    run_id: str,
    started: float,
    log_path: str | None = None,
) -> RunRecord:
    """The run as CMD was asked to run: what the record of a metered and of a failed launch share."""
    return new_run_record(
        argv,
        env=env,
        cwd=os.getcwd(),
        name=opts.name,
        labels=opts.labels,
        interval_s=opts.interval_s,
        replayed=opts.replay_trace is not None,
        log_path=log_path,
        run_id=run_id,
        started_at=started,
    )


def _start_metrics(opts: WrapOptions) -> MetricsServer | None:
    if opts.metrics_port is None:
        return None
    from gpuledger.prom.serve import try_start

    return try_start(opts.metrics_port, opts.metrics_host, stderr_line)


def _reap_until(cmd_pid: int, relay_pid: int, session: Session | None) -> int:
    """Reap children until CMD ends; orphans adopted as subreaper are credited to the run."""
    while True:
        pid, status, usage = os.wait4(-1, 0)
        if pid == relay_pid:
            continue
        if session is not None:
            session.credit_reaped(pid, usage)
        if pid == cmd_pid:
            return status


def _wait_relay(relay_pid: int, log_path: str) -> bool:
    """Wait a moment for the relay to drain CMD's last output; False if it still runs."""
    deadline = time.monotonic() + RELAY_GRACE_S
    exited = _exit_watch(relay_pid)
    try:
        while True:
            try:
                pid, _ = os.waitpid(relay_pid, os.WNOHANG)
            except ChildProcessError:
                return True
            if pid:
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                break
            if exited is not None:  # woken the moment it exits, not at the next poll
                select.select([exited], [], [], left)
            else:
                time.sleep(min(0.02, left))
    finally:
        if exited is not None:
            os.close(exited)
    stderr_line(
        "gpuledger: CMD ended but a process it started still holds its output; the ledger keeps the log "
        f"up to now, and the rest goes only to {log_path}"
    )
    return False


def _exit_watch(pid: int) -> int | None:
    """A pidfd that turns readable when ``pid`` exits (Linux 5.3+); None where there is none."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def run_and_exit_code(argv: Sequence[str], opts: WrapOptions) -> int:
    try:
        outcome = wrap(argv, opts)
    except LaunchError as exc:
        stderr_line(f"gpuledger: {exc}")
        return exc.exit_code
    if opts.summary and outcome.summary is not None:
        from gpuledger.core.metering.summary import format_summary

        stderr_line(format_summary(outcome.summary))
    return outcome.exit_code
