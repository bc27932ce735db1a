"""The recorder: sample collectors every tick, close intervals, flush them to the ledger.

It runs in two background threads and is built so that nothing it does can hurt the training:
every collector or ledger failure becomes a run event plus one line on stderr, and data that
could not be written stays buffered and is retried at the next flush. One thread takes the
readings, the other writes: a ledger that is slow or locked (a busy SQLite file, a PostgreSQL
server that hangs) never delays a reading, so ticks keep their cadence, the sample buffers are read
before they wrap, and the final reading is taken when the command ends, not when the ledger
answers.

Intervals end at a reading: a regular close (every ``interval_s``), an epoch cut (``cut``) or the
end (``stop``). The host collector is told which readings end an interval and reads its host-wide
counters then too, so every figure an interval stores is over that interval's own span. If that
reading fails, the host interval goes on to the next good reading rather than let a delta cross
into the next one (the GPU intervals close as planned). A cut less than ``SLIVER_S`` after the
latest interval edge (the ``epoch_start`` handled right after an ``epoch_end``, or a cut just after
a regular close) closes nothing: the boundary is taken to be that edge, so no interval of a
millisecond appears, whose rates would mean nothing. Only the last interval, closed at ``stop``, may
be that short: the final reading (with the exact figures of the reaped command) is always kept.

The first interval starts at the collectors' first reading: ``start``'s own, or one taken before
the recorder exists (``primed_at``: ``gpuledger run`` reads them just before it launches CMD,
edge.py). The final reading reads the GPUs first, as that one does, and tells the collectors that
no reading follows, so they classify every second up to it (docs/METERING.md, "A run's edges").
"""

from __future__ import annotations

import os
import select
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from gpuledger.collect.base import GpuCollector, HostCollector
from gpuledger.core.metering.intervals import merge_gpu_ticks, merge_host_ticks
from gpuledger.core.model import Event, GpuInterval, GpuTick, HostInterval, HostTick, Metric
from gpuledger.core.redaction.records import TextCache
from gpuledger.core.redaction.redact import Redactor
from gpuledger.recorder.control import ControlServer

MIN_INTERVAL_S = 0.5
MAX_INTERVAL_S = 60.0
FLUSH_EVERY_S = 10.0  # the most an abrupt end (kill -9, power loss) can lose
MIN_FLUSH_S = 2.0  # short intervals are batched: fewer, larger writes to a shared ledger
MAX_TICK_S = 1.0
FIRST_TICK_S = 0.25
# A cut this soon after the latest interval edge is absorbed (module doc): far below a tick
# (>= 0.5 s), and below core.training.epochs.SNAP_S (0.05 s) with room for the message handling, so the
# boundary event, written just after the cut, is snapped onto that edge and per-epoch sums stay exact.
SLIVER_S = 0.02
REPEAT_WINDOW_S = 60.0  # a repeating problem is recorded at most once a minute


def tick_seconds(interval_s: float) -> float:
    """Ticks per interval: at least five for intervals of 5 s and more, so gauges see peaks."""
    return min(interval_s, MAX_TICK_S)


def ticks_per_interval(interval_s: float) -> int:
    return max(1, round(interval_s / tick_seconds(interval_s)))


@dataclass
class Pending:
    """Closed intervals, events and metrics not yet written to the ledger."""

    gpu: list[GpuInterval] = field(default_factory=list)
    host: list[HostInterval] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    metrics: list[Metric] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.gpu or self.host or self.events or self.metrics)


def _waker(wake_r: int, control: ControlServer | None) -> tuple[select.poll, int]:
    """What the loop sleeps on, registered once: the wake pipe and the control socket (-1: none)."""
    poller = select.poll()
    poller.register(wake_r, select.POLLIN)
    fd = -1 if control is None else control.fileno()
    if fd >= 0:
        poller.register(fd, select.POLLIN)
    return poller, fd


class Recorder:
    """Samples ``host`` and ``gpu`` into intervals and writes them through ``sink``.

    ``sink(gpu, host, events, metrics)`` is normally ``Ledger.append`` bound to the run id; it
    may raise, in which case everything stays pending for the next flush.
    """

    def __init__(
        self,
        sink: Callable[[list[GpuInterval], list[HostInterval], list[Event], list[Metric]], None],
        host: HostCollector,
        gpu: GpuCollector | None = None,
        interval_s: float = 5.0,
        flush_every_s: float = FLUSH_EVERY_S,
        clock: Callable[[], float] = time.time,
        warn: Callable[[str], None] | None = None,
        on_interval: Callable[[list[GpuInterval], HostInterval | None], None] | None = None,
        control: ControlServer | None = None,
        on_message: Callable[[Recorder, dict], None] | None = None,
        primed_at: float | None = None,
    ) -> None:
        if not MIN_INTERVAL_S <= interval_s <= MAX_INTERVAL_S:
            raise ValueError(f"interval must be between {MIN_INTERVAL_S} and {MAX_INTERVAL_S} seconds")
        self._sink = sink
        self._host = host
        self._gpu = gpu
        self.interval_s = interval_s
        self.tick_s = tick_seconds(interval_s)
        # Every 10 s at the default interval (fewer writes); short intervals flush sooner so
        # a kill -9 loses little, but never more often than every 2 s.
        self._flush_every_s = min(flush_every_s, FLUSH_EVERY_S, max(4 * interval_s, MIN_FLUSH_S))
        self._clock = clock
        self._warn = warn or (lambda line: None)
        self._on_interval = on_interval
        self._control = control
        self._on_message = on_message
        self._wake_r = self._wake_w = -1  # a pipe while the thread runs: stop() wakes its wait
        self._lock = threading.Lock()
        self._pending = Pending()
        self._text = TextCache(Redactor.default())  # event kinds and metric keys
        self._gpu_ticks: dict[str, list[GpuTick]] = {}
        self._host_ticks: list[HostTick] = []
        self._gpu_seq: dict[str, int] = {}
        self._host_seq = 0
        # primed_at: the collectors were read then (recorder/edge.py: just before CMD was launched), so
        # the first interval starts there and start() takes no reading of its own.
        self._primed = primed_at is not None
        self._interval_start: float | None = primed_at
        self._last_edge: float | None = primed_at  # the latest interval end, GPU or host (see cut)
        self._last_read_t = primed_at or 0.0
        self._closes = False  # the reading just taken ends the interval
        self._close_requested = False  # the next reading ends it (cut, stop)
        self._host_close_pending = False  # a closing host reading failed: the host interval goes on
        self._last_flush = 0.0
        self._warned: set[str] = set()
        self._repeats: dict[tuple[str, str], tuple[float | None, int]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._flush_due = threading.Event()  # the sampler asks the writer for a flush
        self._writer: threading.Thread | None = None
        self.last_flush_ok: float | None = None

    # -- public, thread-safe --------------------------------------------------------------
    def event(self, kind: str, message: str = "", /, **payload: object) -> None:
        self.event_at(self._clock(), kind, message, **payload)

    def event_at(self, t: float, kind: str, message: str = "", /, **payload: object) -> None:
        """An event that happened at ``t``, before now (a file's time). Positional: a payload an
        integration sends may hold any key (``t``, ``kind``, ``message`` too)."""
        # Redacted before it is held: an integration's message or payload may carry a secret,
        # and neither the ledger nor a spool file may keep it (core/redaction/records.py).
        r = self._text.redactor
        event = Event(t=t, kind=self._text(kind), message=r.redact_text(message), payload=r.redact_tree(payload))
        with self._lock:
            self._pending.events.append(event)

    def add_metrics(self, metrics: list[Metric]) -> None:
        renamed = self._text.changes({m.key for m in metrics})  # a key naming a token: almost never
        if renamed:
            metrics = [replace(m, key=renamed[m.key]) if m.key in renamed else m for m in metrics]
        with self._lock:
            self._pending.metrics.extend(metrics)

    def problem(self, kind: str, message: str, **payload: object) -> None:
        """Record a monitoring problem as an event; say it on stderr once per kind.

        A problem that repeats every tick (a GPU gone for good) is recorded once a minute with the
        number of repeats, so the ledger does not fill with copies.
        """
        key = (kind, message)
        now = self._clock()
        last_t, repeats = self._repeats.get(key, (None, 0))
        if last_t is not None and now - last_t < REPEAT_WINDOW_S:
            self._repeats[key] = (last_t, repeats + 1)
            return
        if repeats:
            payload = {**payload, "repeats": repeats}
        self._repeats[key] = (now, 0)
        self.event(kind, message, **payload)
        if kind not in self._warned:
            self._warned.add(kind)
            self._warn(f"gpuledger: {message} (training continues; recorded as a run event)")

    def start(self) -> None:
        if not self._primed:
            self.tick()  # prime collector cursors at t0 so the first interval starts with CMD
        self._last_flush = self._clock()
        self._wake_r, self._wake_w = os.pipe()
        self._poller = _waker(self._wake_r, self._control)
        self._writer = threading.Thread(target=self._write_loop, name="gpuledger-writer", daemon=True)
        self._writer.start()
        self._thread = threading.Thread(target=self._loop, name="gpuledger-recorder", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Take a last reading, close the open interval and flush everything (best effort)."""
        self._stop.set()
        if self._wake_w >= 0:
            os.write(self._wake_w, b"x")
        if self._thread is not None:
            self._thread.join()  # prompt: the sampler never waits on the ledger
        if self._control is not None:
            self._handle_messages()  # whatever CMD said just before it ended
        self._close_requested = True
        self.tick(final=True)
        self._close_interval(final=True)
        for (kind, message), (_, repeats) in self._repeats.items():
            if repeats:
                self.event(kind, message, repeats=repeats)
        if self._writer is not None:
            self._flush_due.set()  # the writer ends after the write it may be in
            self._writer.join()
        self.flush()
        if self._wake_r >= 0:
            os.close(self._wake_r)
            os.close(self._wake_w)
            self._wake_r = self._wake_w = -1

    # -- the loop -------------------------------------------------------------------------
    def _loop(self) -> None:
        # The first reading comes early, so a short command's peak memory is seen at all.
        next_tick = time.monotonic() + min(self.tick_s, FIRST_TICK_S)
        while not self._wait_until(next_tick):
            next_tick += self.tick_s
            if next_tick < time.monotonic():  # we were suspended: skip, don't burst
                next_tick = time.monotonic() + self.tick_s
            try:
                self.step()
            except Exception as exc:
                self.problem("sampler_error", f"sampling failed: {exc!r}")

    def step(self) -> None:
        """One turn of the loop: a reading, the interval closed when due, a flush when due (by the
        writer thread once started, else here)."""
        self.tick()
        if self._closes:
            self._close_interval()
        if self._clock() - self._last_flush >= self._flush_every_s - 1e-6:
            if self._writer is None:
                self.flush()
            else:
                self._last_flush = self._clock()  # asked once, not at every tick of a long write
                self._flush_due.set()

    def _write_loop(self) -> None:
        """The writer thread: creates the run in the ledger (off the main thread), then writes
        whenever the sampler says a flush is due, until ``stop``, which writes the rest itself."""
        self._flush_once(force=True)
        while True:
            self._flush_due.wait()
            self._flush_due.clear()
            if self._stop.is_set():
                return
            self._flush_once()

    def _flush_once(self, force: bool = False) -> None:
        try:
            self.flush(force=force)
        except Exception as exc:  # a bug, not the ledger (flush keeps those): the writer goes on
            self.problem("sampler_error", f"writing failed: {exc!r}")

    def _wait_until(self, deadline: float) -> bool:
        """Sleep until ``deadline`` (monotonic), serving control messages; True when stopping.

        One poll on the wake pipe (and the control socket), registered once at ``start``: less CPU
        per wake-up than ``Event.wait``, whose lock and waiter machinery run at every tick
        (benchmarks/loop_wait.py), and than a select, which builds its descriptor sets anew each time.
        """
        poller, control = self._poller
        while not self._stop.is_set():
            timeout = deadline - time.monotonic()
            if timeout <= 0:
                return False
            try:  # milliseconds, rounded up: never woken before the deadline
                ready = poller.poll(timeout * 1000)
            except InterruptedError:
                continue
            if control >= 0 and any(fd == control for fd, _ in ready):
                self._handle_messages()
        return True

    def _handle_messages(self) -> None:
        assert self._control is not None
        for msg in self._control.receive():
            if self._on_message is None:
                continue
            try:
                self._on_message(self, msg)
            except Exception as exc:
                self.problem("sampler_error", f"bad message from the command: {exc!r}")

    def cut(self) -> None:
        """Close the current interval now (at an epoch boundary), so sums per epoch are exact.

        Less than ``SLIVER_S`` after the latest interval edge, nothing is closed: the boundary is
        taken to be that edge (module doc). Only called from the recorder thread (message handling)
        or after ``stop``.
        """
        if self._last_edge is not None and self._clock() - self._last_edge < SLIVER_S:
            return
        self._close_requested = True
        self.tick()
        self._close_interval()

    def tick(self, final: bool = False) -> None:
        """Read every collector once; the reading ends the interval when one is due or was asked for.
        ``final``: the last reading (``stop``): the collectors classify every second up to it."""
        now = self._clock()
        if self._interval_start is None:
            self._interval_start = self._last_edge = now
        # Half a tick of slack: ticks land a little late, and a 0.5 s interval must not become 1 s.
        due = self.interval_s - self.tick_s / 2
        self._closes = self._close_requested or now - self._interval_start >= due
        self._close_requested = False
        self._last_read_t = now
        if final:  # the GPUs first, as at the first reading (edge.py): their counters are read at `now`
            self._read_gpu(now, final)
            self._read_host(now)
        else:  # the host first: the GPU reading matches the processes it has just found
            self._read_host(now)
            self._read_gpu(now, final)

    def _read_gpu(self, now: float, final: bool) -> None:
        if self._gpu is None:
            return
        try:
            read = self._gpu.read(self._host.pids(), now, closes_interval=self._closes, final=final)
        except Exception as exc:
            self.problem("sampler_error", f"GPU sampling failed: {exc!r}")
            return
        for tick in read.ticks:
            self._gpu_ticks.setdefault(tick.uuid, []).append(tick)
        for ev in read.events:
            self.problem(ev.kind, ev.message or ev.kind, **ev.payload)

    def _read_host(self, now: float) -> None:
        closing = self._closes or self._host_close_pending
        try:
            tick = self._host.read(now, closes_interval=closing)
        except Exception as exc:
            # Its counters were not read at this boundary: the host interval must not end here.
            self._host_close_pending = closing
            self.problem("sampler_error", f"host sampling failed: {exc!r}")
            return
        if tick is not None:
            self._host_ticks.append(tick)
        if self._host_close_pending:  # the boundary a failed reading missed ends at this good one
            self._host_close_pending = False
            if not self._closes:
                self._last_edge = now
                self._publish([], self._take_host_interval())

    def _close_interval(self, final: bool = False) -> None:
        """End the interval at the last reading (the host one stays open if that reading failed)."""
        gpu_intervals = []
        for uuid, ticks in self._gpu_ticks.items():
            if ticks:
                seq = self._gpu_seq.get(uuid, 0)
                gpu_intervals.append(merge_gpu_ticks(uuid, seq, ticks))
                self._gpu_seq[uuid] = seq + 1
        self._gpu_ticks = {}
        host_interval = None
        if final or not self._host_close_pending:
            host_interval = self._take_host_interval()
            self._host_close_pending = False
        self._interval_start = self._last_edge = self._last_read_t
        self._publish(gpu_intervals, host_interval)

    def _take_host_interval(self) -> HostInterval | None:
        if not self._host_ticks:
            return None
        interval = merge_host_ticks(self._host_seq, self._host_ticks)
        self._host_seq += 1
        self._host_ticks = []
        return interval

    def _publish(self, gpu_intervals: list[GpuInterval], host_interval: HostInterval | None) -> None:
        with self._lock:
            self._pending.gpu.extend(gpu_intervals)
            if host_interval is not None:
                self._pending.host.append(host_interval)
        if self._on_interval is not None and (gpu_intervals or host_interval):
            try:
                self._on_interval(gpu_intervals, host_interval)
            except Exception as exc:
                self.problem("sampler_error", f"interval hook failed: {exc!r}")

    def flush(self, force: bool = False) -> bool:
        """Write what is pending; on failure keep it for the next flush.

        ``force`` calls the sink even with nothing pending (the sink may have set-up to do).
        """
        self._last_flush = self._clock()
        with self._lock:
            batch, self._pending = self._pending, Pending()
        if not batch and not force:
            return True
        try:
            self._sink(batch.gpu, batch.host, batch.events, batch.metrics)
        except Exception as exc:
            with self._lock:
                # Put the batch back in front of whatever arrived meanwhile; order is kept.
                self._pending = Pending(
                    batch.gpu + self._pending.gpu,
                    batch.host + self._pending.host,
                    batch.events + self._pending.events,
                    batch.metrics + self._pending.metrics,
                )
            self.problem("ledger_error", f"cannot write to the ledger: {exc}")
            return False
        self.last_flush_ok = self._last_flush
        if "ledger_error" in self._warned:
            self._warned.discard("ledger_error")
            self._warn("gpuledger: the ledger is writable again; buffered intervals were written")
        return True

    @property
    def pending(self) -> Pending:
        return self._pending

    @property
    def last_reading_t(self) -> float | None:
        """When the latest reading was taken (after ``stop``: the final one, where the run ends)."""
        return self._last_read_t or None
