"""One run being recorded: its record, collectors, recorder and ledger, from start to summary.

Shared by ``gpuledger run`` (meters a child process tree) and ``gpuledger.track()`` (meters the
current process). The ledger is opened lazily from the recorder thread and retried at every
flush, so a locked or unreachable ledger never delays or stops the training.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import resource
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from gpuledger.collect.base import GpuCollector, HostCollector
from gpuledger.core.ids import uuid7
from gpuledger.core.model import Event, GpuIdentity, GpuInterval, HostInterval, Metric, RunRecord
from gpuledger.core.redaction.records import redact_run_fields
from gpuledger.core.redaction.redact import Redactor
from gpuledger.recorder import metadata
from gpuledger.recorder.alerting import LiveAlerts
from gpuledger.recorder.clock import SteadyClock
from gpuledger.recorder.control import ControlServer
from gpuledger.recorder.edge import Primed
from gpuledger.recorder.hooks import Explain
from gpuledger.recorder.messages import handle as handle_message
from gpuledger.recorder.recorder import Pending, Recorder
from gpuledger.recorder.slow_notice import WRITE_NOTICE_S, SlowNotice
from gpuledger.runs.host import host_name

if TYPE_CHECKING:
    import mmap


def stderr_line(line: str) -> None:
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def os_text(value: str) -> str:
    """Text from the OS as valid UTF-8: bytes that were not UTF-8 (which Python hands over as
    surrogate escapes, e.g. a latin-1 file name in argv) are shown as backslash escapes
    (``/data/caf\\xe9``), so the run record can be stored, signed and pushed like any other."""
    try:
        value.encode("utf-8")
        return value
    except UnicodeEncodeError:
        pass
    try:  # undecodable bytes, as os.fsdecode and sys.argv give them: \xNN
        return value.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:  # other lone surrogates: \udNNN
        return value.encode("utf-8", "backslashreplace").decode("utf-8")


def new_run_record(
    command: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: str,
    name: str | None = None,
    labels: Mapping[str, str] | None = None,
    interval_s: float = 5.0,
    replayed: bool = False,
    log_path: str | None = None,
    run_id: str | None = None,
    started_at: float | None = None,
    clock: Callable[[], float] = time.time,
) -> RunRecord:
    """A fresh run with git state and versions filled in, every text field redacted (command,
    labels, user, host, directory, name, git, versions: core/redaction/records.py), as the server
    redacts them again: the local ledger holds no secret either.

    Text the OS handed over (the command line, directory, user, environment labels, git fields)
    goes through ``os_text``, so the record is valid UTF-8 whatever bytes it held."""
    now = clock() if started_at is None else started_at
    all_labels = metadata.env_labels(env)
    all_labels.update(labels or {})
    all_labels = {os_text(str(k)): os_text(str(v)) for k, v in all_labels.items()}
    git = {k: os_text(v) if isinstance(v, str) else v for k, v in metadata.git_state(cwd).items()}
    run = RunRecord(
        id=run_id or uuid7(int(now * 1000)),
        command=[os_text(str(arg)) for arg in command],
        user=os_text(metadata.current_user(env)),
        host=os_text(host_name()),
        cwd=os_text(cwd),
        started_at=now,
        name=None if name is None else os_text(name),
        labels=all_labels,
        git=git,
        versions=metadata.versions(),
        replayed=replayed,
        interval_s=interval_s,
        recorder_pid=os.getpid(),
        log_path=log_path,
    )
    return redacted_run(run)


def redacted_run(run: RunRecord) -> RunRecord:
    """``run`` with every text field redacted, but its log path: gpuledger's own file, which
    ``gpuledger recover`` reads back (the server redacts that too)."""
    fields = {f.name: getattr(run, f.name) for f in dataclasses.fields(run)}
    return dataclasses.replace(run, **redact_run_fields(Redactor.default(), fields, keep=frozenset({"log_path"})))


class LedgerIncomplete(Exception):
    """The end of a run could not be written because some of its rows could not: it is spooled."""

    def __init__(self, pending: Pending) -> None:
        gpu, host, events, metrics = (len(pending.gpu), len(pending.host), len(pending.events), len(pending.metrics))
        errors = [e.message for e in pending.events if e.kind == "ledger_error"]
        why = f" ({errors[-1]})" if errors else ""
        super().__init__(
            f"{gpu} GPU and {host} host intervals, {events} events and {metrics} metrics could not be written{why}"
        )


class Session:
    def __init__(
        self,
        ledger_url: str | None,
        run: RunRecord,
        host: HostCollector,
        gpu: GpuCollector | None,
        gpu_note: str | None = None,
        warn: Callable[[str], None] = stderr_line,
        clock: Callable[[], float] | None = None,
        control: ControlServer | None = None,
        on_interval: Callable[[list[GpuInterval], HostInterval | None], None] | None = None,
        after_flush: Callable[[], None] | None = None,
        primed: Primed | None = None,
        slow_notice: bool = True,
    ) -> None:
        """``primed``: the collectors were read already, on ``clock`` (recorder/edge.py: just before
        ``gpuledger run`` launched CMD); the first interval starts at that reading. ``slow_notice``:
        say on stderr when writing the run's end keeps the user waiting (not under ``run -q``)."""
        self.run = run
        self._stopped = False
        # CMD has ended but the run is not written yet: the terminal is told why it waits (slow_notice.py)
        self._slow = SlowNotice(
            f"gpuledger: still writing run {run.id} to the ledger after {WRITE_NOTICE_S:.0f} s (another process "
            "may hold it); if it stays busy the run is kept in a local file for gpuledger recover",
            warn,
        )
        self._slow.enabled = slow_notice
        self._after_flush = after_flush  # e.g. wakes the pusher of ``gpuledger run --server``
        self._url = ledger_url
        self._ledger = None
        self._created = False
        self._ledger_lock = threading.Lock()
        self._gpu = gpu
        self._host = host
        # Ticks are dated by a clock that never steps (recorder/clock.py): a wall-clock step
        # while the run records must not make an interval end before it starts.
        clock = SteadyClock() if clock is None else clock
        self._clock = clock
        self.devices: list[GpuIdentity] = gpu.devices() if gpu is not None else []
        if not self.devices and gpu_note is None:
            gpu_note = "no GPU is visible to this run (CUDA_VISIBLE_DEVICES hides them all)"
        redactor = Redactor.default()
        # Device names and driver versions are text the ledger keeps: redacted as the run is
        # (the uuid keys the GPU's readings and is the driver's own).
        self.devices = [_redacted_device(redactor, d) for d in self.devices]
        run.gpu_note = None if self.devices or gpu_note is None else redactor.redact_text(gpu_note)
        if self.devices:
            run.versions.update(redactor.redact_tree(_driver_versions(self.devices)))
        self.control = control
        self._run_changes: dict[str, object] = {}
        self.alerts = LiveAlerts.for_session(run, self.devices, warn=warn)
        self.recorder = Recorder(
            self._append,
            host=host,
            gpu=gpu,
            interval_s=run.interval_s,
            clock=clock,
            warn=warn,
            on_interval=self.alerts.hook(on_interval),  # alerts first, then e.g. the /metrics exporter
            control=control,
            on_message=self._handle_message,
            primed_at=None if primed is None else primed.t,
        )
        self.alerts.bind(self.recorder)
        if primed is not None:  # what that first reading reported, recorded as the recorder's own would be
            for ev in primed.events:
                self.recorder.problem(ev.kind, ev.message or ev.kind, **ev.payload)
            for message in primed.problems:
                self.recorder.problem("sampler_error", message)

    def _handle_message(self, recorder: Recorder, msg: dict) -> None:
        handle_message(self, recorder, msg)
        self.alerts.on_message(msg)

    # -- ledger access, tolerant of a ledger that is not there yet -------------------------
    def ledger(self):
        with self._ledger_lock:
            if self._ledger is None:
                # The standard sqlite3 module for a local ledger, SQLAlchemy only where it must be.
                from gpuledger.store.run_writer import open_run_ledger

                self._ledger = open_run_ledger(self._url)
            if not self._created:
                self._ledger.create_run(self.run)
                if self.devices:
                    self._ledger.add_devices(self.run.id, self.devices)
                self._created = True
            return self._ledger

    def _append(
        self, gpu: list[GpuInterval], host: list[HostInterval], events: list[Event], metrics: list[Metric]
    ) -> None:
        ledger = self.ledger()
        if gpu or host or events or metrics:
            ledger.append(self.run.id, gpu, host, events, metrics)
        with self._ledger_lock:
            changes, self._run_changes = self._run_changes, {}
        if changes:
            try:
                ledger.update_run(self.run.id, **changes)
            except Exception:
                with self._ledger_lock:
                    self._run_changes = {**changes, **self._run_changes}
                raise
        self._notify_flushed()

    def _notify_flushed(self) -> None:
        if self._after_flush is not None:
            with contextlib.suppress(Exception):
                self._after_flush()

    def update_meta(self, labels: dict, meta: dict) -> None:
        """Labels and run metadata sent by an integration; written at the next flush.

        Labels given on the command line win over labels an integration fills automatically.
        """
        from gpuledger.core.redaction.redact import Redactor

        redactor = Redactor.default()
        with self._ledger_lock:
            sent = {os_text(str(k)): os_text(str(v)) for k, v in labels.items()}
            for key, value in redactor.redact_mapping(sent).items():
                self.run.labels.setdefault(key, value)
            self.run.meta.update(redactor.redact_tree(dict(meta)))
            self._run_changes["labels"] = dict(self.run.labels)
            self._run_changes["meta"] = dict(self.run.meta)

    def link_attempt(self, earlier_run_id: str) -> None:
        with self._ledger_lock:
            self.run.attempt_of = earlier_run_id
            self._run_changes["attempt_of"] = earlier_run_id

    def credit_reaped(self, pid: int, usage: object) -> None:
        """Hand the exact final rusage of a child we reaped (CMD or an orphan) to the host collector."""
        credit = getattr(self._host, "credit_reaped", None)
        if credit is None:
            return
        try:
            peak = usage.ru_maxrss  # type: ignore[attr-defined]  # KiB on Linux
            credit(
                pid,
                usage.ru_utime + usage.ru_stime,  # type: ignore[attr-defined]
                usage.ru_inblock * 512,  # type: ignore[attr-defined]  # 512-byte blocks
                usage.ru_oublock * 512,  # type: ignore[attr-defined]
                peak * 1024,
                # ru_maxrss also counts the image the child was forked from, at most our own peak:
                # above that, it is the child's own (a peak the readings may have missed).
                own_rss=peak > _own_peak_kib(),
            )
        except Exception as exc:
            self.recorder.problem("sampler_error", f"could not account a reaped process: {exc!r}")

    # -- lifecycle ----------------------------------------------------------------------
    def start(self) -> None:
        self.recorder.start()

    def stop(self) -> None:
        """Take the final reading now (the run's end) and flush; ``finish`` then writes the end state.
        ``gpuledger run`` calls it as soon as CMD is reaped, before waiting for its last output."""
        if not self._stopped:
            self._stopped = True
            with self._slow.timing():  # its last flush waits for the ledger
                self.recorder.stop()

    def finish(
        self,
        status: str,
        exit_code: int | None = None,
        signal: int | None = None,
        reason: str | None = None,
        log: bytes | mmap.mmap | None = None,
        explain: Explain | None = None,
        log_truncated: bool = False,
        log_still_written: bool = False,
        summarize: bool = True,
    ) -> dict | None:
        """Stop recording, write the end state and the log; return the summary (None if unwritable;
        ``{}`` when written but ``summarize`` is False: nobody shows it, and reading it back costs
        the database layer a quick run otherwise does without).
        ``log``: CMD's output as stored, or the log file mapped (recorder/wrap.py).
        ``log_truncated``: ``log`` is the head and tail of a longer output (core/training/logcap.py).
        ``log_still_written``: a process CMD started still writes the log file, so a spooled run's
        ``recover`` must keep the file.

        ``explain`` reads ``log`` after the recorder stopped (why it failed; epochs when no
        integration reported them) and may return a better status reason.
        """
        self.stop()
        # The run ends at the final reading, taken as the command ended: not after the log is read
        # below or after a slow ledger answered (the wall time and the allocated GPU-hours).
        ended = self.recorder.last_reading_t or self._clock()
        self.alerts.close()
        if explain is not None:
            try:
                reason = explain(self, log or b"", status, exit_code, signal) or reason
            except Exception as exc:
                stderr_line(f"gpuledger: could not read the run's log: {exc!r}")
        run = self.run
        if reason is not None:  # it may quote the log or the command
            reason = Redactor.default().redact_text(reason)
        run.status, run.ended_at, run.exit_code, run.signal = status, ended, exit_code, signal
        run.status_reason = reason
        try:
            with self._slow.timing():
                ledger = self.ledger()
                if self.recorder.pending:  # a last try for anything the final flush could not write
                    self.recorder.flush()
                if self.recorder.pending:  # still not written: the run must not end in the ledger without it
                    raise LedgerIncomplete(self.recorder.pending)
                if log is not None:
                    ledger.set_log(run.id, log, truncated=log_truncated)
                ledger.update_run(
                    run.id, status=status, ended_at=ended, exit_code=exit_code, signal=signal, status_reason=reason
                )
                self._notify_flushed()
                return run_summary(ledger, run.id, now=ended) if summarize else {}
        except Exception as exc:
            stderr_line(f"gpuledger: could not write the end of run {run.id} to the ledger: {exc}")
            self._spool(keep_log=log_still_written)
            return None
        finally:
            for collector in (self._gpu, self._host):
                if collector is not None:
                    with contextlib.suppress(Exception):
                        collector.close()

    def _spool(self, keep_log: bool = False) -> None:
        """Keep what could not be written in a local file, so the run is not lost."""
        from gpuledger.recorder.spool import write_spool

        pending = self.recorder.pending
        try:
            path = write_spool(
                self.run, self.devices, pending.gpu, pending.host, pending.events, pending.metrics,
                ledger_url=self._url, keep_log=keep_log,
            )  # fmt: skip
        except OSError as exc:
            stderr_line(f"gpuledger: could not keep the run locally either ({exc}); its record is lost")
            return
        stderr_line(f"gpuledger: the run is kept in {path}; write it to the ledger later with: gpuledger recover")

    def close(self) -> None:
        if self._ledger is not None:
            self._ledger.close()


def _own_peak_kib() -> int:
    """This process's own peak resident memory, KiB: the high-water mark of its memory since its
    exec (VmHWM). Our ru_maxrss would not do: it also counts the image we were forked from, our
    parent's (a test runner's hundreds of MiB), so it says nothing of a child's own peak."""
    try:
        with open("/proc/self/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # no /proc: the safe side (larger)


def _redacted_device(redactor: Redactor, device: GpuIdentity) -> GpuIdentity:
    text = {
        f.name: redactor.redact_text(value)
        for f in dataclasses.fields(device)
        if f.name != "uuid" and isinstance(value := getattr(device, f.name), str)
    }
    changed = {k: v for k, v in text.items() if v != getattr(device, k)}
    return dataclasses.replace(device, **changed) if changed else device


def _driver_versions(devices: list[GpuIdentity]) -> dict[str, str]:
    found = {}
    for dev in devices:
        if dev.driver_version:
            found["nvidia_driver"] = dev.driver_version
        if dev.cuda_version:
            found["cuda_driver"] = dev.cuda_version
    return found


def run_summary(ledger, run_id: str, now: float) -> dict:
    from gpuledger.runs.view import summary

    return summary(ledger, ledger.get_run(run_id), now=now)
