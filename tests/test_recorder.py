"""The recorder loop: failures become events, data that cannot be written waits, nothing is lost."""

from __future__ import annotations

import errno
import itertools
import math
import os
import threading
import time
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuledger.collect.base import GpuRead
from gpuledger.collect.fake_nvml import FakeGpu, FakeNvml, TracePoint
from gpuledger.collect.host import ProcessTreeCollector
from gpuledger.collect.nvml import NvmlCollector
from gpuledger.core.model import HostInterval, HostTick
from gpuledger.core.training.epochs import account
from gpuledger.recorder.recorder import SLIVER_S, Recorder, ticks_per_interval
from host_support import (
    CPUS,
    DISK_READ_B_PER_S,
    DISK_WRITE_B_PER_S,
    IOWAIT_FRACTION,
    NET_RX_B_PER_S,
    NET_TX_B_PER_S,
    ScriptedSystem,
    expected_util_pct,
)


class Clock:
    def __init__(self) -> None:
        self.t = 1_000.0

    def __call__(self) -> float:
        return self.t


class ScriptedHost:
    """A host collector that burns exactly 0.25 CPU-seconds per second of clock."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.last: float | None = None

    def read(self, now: float, closes_interval: bool = False) -> HostTick | None:
        if self.last is None:
            self.last = now
            return None
        tick = HostTick(
            t0=self.last, t1=now, cpu_s=0.25 * (now - self.last), rss_b=100, read_b=10, write_b=5, threads=3, procs=1
        )
        self.last = now
        return tick

    def pids(self) -> set[int]:
        return {4242}

    def close(self) -> None:
        pass


class FlakySink:
    """A ledger that fails (locked, disk full) for the first ``failures`` writes."""

    def __init__(self, failures: int, error: Exception) -> None:
        self.failures = failures
        self.error = error
        self.batches: list[tuple] = []

    def __call__(self, gpu, host, events, metrics) -> None:
        if self.failures > 0:
            self.failures -= 1
            raise self.error
        self.batches.append((list(gpu), list(host), list(events), list(metrics)))

    def all(self, index: int) -> list:
        return [item for batch in self.batches for item in batch[index]]


def drive(recorder: Recorder, clock: Clock, seconds: int) -> None:
    """Run the recorder's tick logic as its thread would, one second per step, without sleeping."""
    recorder.tick()
    recorder.flush(force=True)
    for _ in range(seconds):
        clock.t += 1.0
        recorder.step()


@pytest.mark.parametrize(
    "error", [OSError(errno.ENOSPC, "No space left on device"), RuntimeError("database is locked")]
)
def test_a_failing_ledger_keeps_everything_and_warns_once(error: Exception) -> None:
    clock = Clock()
    sink = FlakySink(failures=3, error=error)
    warnings: list[str] = []
    rec = Recorder(sink, host=ScriptedHost(clock), interval_s=5.0, clock=clock, warn=warnings.append)
    drive(rec, clock, 40)
    rec.stop()
    host = sink.all(1)
    assert [iv.seq for iv in host] == list(range(len(host)))  # nothing lost, order kept
    assert sum(iv.cpu_s for iv in host) == pytest.approx(0.25 * 40)
    events = sink.all(2)
    assert [e.kind for e in events].count("ledger_error") >= 1  # the failure is a run event ...
    problem_lines = [w for w in warnings if "cannot write to the ledger" in w]
    assert len(problem_lines) == 1  # ... but one line on stderr, not one per retry
    assert any("writable again" in w for w in warnings)


def test_a_collector_that_raises_becomes_an_event_and_sampling_goes_on() -> None:
    clock = Clock()

    class BrokenGpu:
        def devices(self) -> list:
            return []

        def read(self, pids: set[int], now: float, closes_interval: bool = True, final: bool = False) -> GpuRead:
            raise RuntimeError("NVML exploded")

        def close(self) -> None:
            pass

    sink = FlakySink(0, RuntimeError())
    warnings: list[str] = []
    rec = Recorder(sink, host=ScriptedHost(clock), gpu=BrokenGpu(), interval_s=5.0, clock=clock, warn=warnings.append)
    drive(rec, clock, 12)
    rec.stop()
    assert sum(iv.cpu_s for iv in sink.all(1)) == pytest.approx(3.0)  # host metering unaffected
    errors = [e for e in sink.all(2) if e.kind == "sampler_error"]
    # Recorded once, plus the count of repeats at the end: on record without flooding the ledger.
    assert len(errors) == 2 and errors[-1].payload["repeats"] == 13
    assert len(warnings) == 1


def test_gpu_busy_time_flows_from_nvml_into_intervals_exactly() -> None:
    clock = Clock()
    points = [
        TracePoint(t=float(t), util_pct=50.0 if t < 10 else 100.0, mem_used_b=2**30, power_w=200.0)
        for t in range(0, 31)
    ]
    # The driver stamps samples with the wall clock; the collector's monotonic clock runs apart.
    fake = FakeNvml([FakeGpu(uuid="GPU-aaaa", points=points)], clock=clock, start=clock.t)
    sink = FlakySink(0, RuntimeError())
    gpu = NvmlCollector(nvml=fake, clock=lambda: clock.t - 1000.0)
    rec = Recorder(sink, host=ScriptedHost(clock), gpu=gpu, interval_s=5.0, clock=clock)
    drive(rec, clock, 20)
    rec.stop()
    intervals = sink.all(0)
    assert [iv.seq for iv in intervals] == list(range(len(intervals)))
    busy = sum(iv.busy_s for iv in intervals)
    # 10 s at 50 % and 10 s at 100 %, within one driver sample period.
    assert busy == pytest.approx(15.0, abs=0.2)
    assert {iv.util_method for iv in intervals} == {"samples"}


def test_gpu_throttle_seconds_land_in_the_interval_they_happened_in() -> None:
    # NVML's cumulative violation counters, read where intervals end: a 0.4 s power cap between two
    # ticks of the first interval (no reason bit set at any tick), a thermal slowdown across the
    # second one's end and on past an epoch's end
    clock = Clock()
    points = [TracePoint(0, util_pct=90, throttle=()), TracePoint(2.2, throttle=("power",)),
              TracePoint(2.6, throttle=()), TracePoint(7.5, throttle=("thermal",)),
              TracePoint(13, throttle=())]  # fmt: skip
    fake = FakeNvml([FakeGpu("GPU-aaaa", profile="ideal", points=points)], clock=clock, start=clock.t)
    sink = FlakySink(0, RuntimeError())
    rec = Recorder(sink, host=ScriptedHost(clock), gpu=NvmlCollector(nvml=fake, clock=clock), interval_s=5.0,
                   clock=clock)  # fmt: skip
    start = clock.t
    drive(rec, clock, 12)
    clock.t = start + 12.5
    rec.cut()  # an epoch ends inside the second slowdown
    clock.t = start + 14.0
    rec.stop()
    intervals = sink.all(0)
    edges = [(iv.t0 - start, iv.t1 - start) for iv in intervals]
    assert edges == [(0, 5), (5, 10), (10, 12.5), (12.5, 14)]
    thermal = [iv.throttle_s["thermal"] for iv in intervals]
    assert thermal == pytest.approx([0, 2.5, 2.5, 0.5])
    assert [iv.throttle_s["power"] for iv in intervals] == pytest.approx([0.4, 0, 0, 0])
    assert all(iv.throttle_s["thermal"] <= iv.t1 - iv.t0 for iv in intervals)


# -- host-wide counters and interval edges: every figure over its interval's own span -------------


def scripted_recorder(clock: Clock, sink: FlakySink, phases=((0.0, 0.25),)) -> tuple[Recorder, ScriptedSystem]:
    """A real Recorder over a real ProcessTreeCollector (this process) whose host counters are scripted."""
    system = ScriptedSystem(clock, phases)
    host = ProcessTreeCollector(os.getpid(), include_root=True, system_every=ticks_per_interval(5.0), system=system)
    return Recorder(sink, host=host, interval_s=5.0, clock=clock), system


def assert_exact_host_intervals(intervals: list[HostInterval], system: ScriptedSystem, start: float) -> None:
    """Contiguous from ``start``, and each one's host-wide sums are the counters' growth over its own span."""
    if not intervals:  # possible only when no reading after the first succeeded
        assert system.reads == [start]
        return
    assert [iv.seq for iv in intervals] == list(range(len(intervals)))
    assert intervals[0].t0 == start
    for before, after in itertools.pairwise(intervals):
        assert before.t1 == after.t0
    for iv in intervals:
        # Up to the last host-wide reading inside it: its end, unless the very last reading failed.
        covered_to = max(t for t in system.reads if t <= iv.t1)
        assert covered_to == iv.t1 or iv is intervals[-1]
        if iv.disk_write_b is None:  # nothing host-wide was read inside: absent, not zero
            assert iv is intervals[-1] and covered_to == iv.t0 and iv.iowait_s is None
            continue
        span = covered_to - iv.t0
        assert (iv.disk_read_b, iv.disk_write_b) == (DISK_READ_B_PER_S * span, DISK_WRITE_B_PER_S * span)
        assert (iv.net_rx_b, iv.net_tx_b) == (NET_RX_B_PER_S * span, NET_TX_B_PER_S * span)
        assert iv.iowait_s == pytest.approx(IOWAIT_FRACTION * CPUS * span, abs=1e-9)
        if span > 0:
            assert iv.sys_cpu_util_avg_pct == pytest.approx(expected_util_pct(system, iv.t0, covered_to), abs=1e-6)


def _cut_at(rec: Recorder, clock: Clock, t: float, kind: str, epoch: int) -> None:
    """An epoch boundary as messages.handle applies it: the cut, then the event."""
    clock.t = t
    rec.cut()
    rec.event(kind, f"epoch {epoch}", epoch=epoch)


def test_a_cut_right_after_a_close_adds_no_interval_and_epochs_stay_exact() -> None:
    clock = Clock()
    sink = FlakySink(0, RuntimeError())
    rec, system = scripted_recorder(clock, sink)
    start = clock.t
    ms = 1 / 1024  # times in 1/1024 s keep the scripted counters' arithmetic exact
    rec.tick()
    _cut_at(rec, clock, start + 0.25, "epoch_start", 1)
    for second in range(1, 6):
        clock.t = start + second
        rec.step()  # a regular close at start + 5
    _cut_at(rec, clock, start + 5 + ms, "epoch_end", 1)  # 1 ms after that close: absorbed
    _cut_at(rec, clock, start + 5 + 2 * ms, "epoch_start", 2)  # handled right after the epoch_end: absorbed
    _cut_at(rec, clock, start + 5 + 300 * ms, "epoch_end", 2)  # a genuinely short epoch: its own interval
    _cut_at(rec, clock, start + 5 + 301 * ms, "epoch_start", 3)
    clock.t = start + 6.0
    rec.step()
    _cut_at(rec, clock, start + 6.5, "epoch_end", 3)
    clock.t = start + 6.75
    rec.stop()
    host = sink.all(1)
    edges = [(iv.t0 - start, iv.t1 - start) for iv in host]
    assert edges == [(0, 0.25), (0.25, 5), (5, 5 + 300 * ms), (5 + 300 * ms, 6.5), (6.5, 6.75)]
    assert_exact_host_intervals(host, system, start)
    usage = account(sink.all(2), [], host, start, clock.t)
    epochs = [u for u in usage if u.phase == "epoch"]
    assert [u.epoch for u in epochs] == [1, 2, 3]
    assert all(u.exact for u in usage)  # each absorbed boundary snaps onto the interval edge
    assert epochs[1].cpu_s == host[2].cpu_s  # epoch 2 is exactly the 0.3 s interval
    assert math.fsum(u.cpu_s or 0.0 for u in usage) == pytest.approx(math.fsum(iv.cpu_s for iv in host))


def test_a_failed_reading_at_a_boundary_keeps_the_host_interval_open_until_a_good_one() -> None:
    clock = Clock()
    sink = FlakySink(0, RuntimeError())
    warnings: list[str] = []
    rec, system = scripted_recorder(clock, sink)
    rec._warn = warnings.append
    start = clock.t
    rec.tick()
    clock.t = start + 1.5
    system.fail_next = True
    rec.cut()  # the host-wide counters cannot be read at this boundary
    clock.t = start + 2.0
    rec.step()  # the next good reading ends the host interval instead
    clock.t = start + 2.0 + 1 / 1024
    rec.cut()  # a millisecond after that host edge: absorbed like any cut right after a close
    clock.t = start + 3.0
    rec.stop()
    host = sink.all(1)
    assert [(iv.t0 - start, iv.t1 - start) for iv in host] == [(0.0, 2.0), (2.0, 3.0)]
    assert_exact_host_intervals(host, system, start)
    assert any("host sampling failed" in w for w in warnings)


_ops = st.lists(
    st.one_of(
        st.just(("tick", 0)),
        st.tuples(st.just("cut"), st.integers(1, 1023)),  # 1/1024 s (a sliver) up to almost a tick
        st.just(("fail", 0)),  # the next host-wide reading raises
    ),
    max_size=40,
)


@settings(max_examples=120, deadline=None)
@given(ops=_ops, stop_after=st.integers(0, 1023), phases=st.lists(st.sampled_from([0.0, 0.5, 0.75]), max_size=8))
def test_any_mix_of_ticks_cuts_and_failures_keeps_every_host_figure_in_its_interval(
    ops: list[tuple[str, int]], stop_after: int, phases: list[float]
) -> None:
    clock = Clock()
    sink = FlakySink(0, RuntimeError())
    start = clock.t
    script = [(0.0, 0.25), *((start + 1.0 + 2.0 * i, f) for i, f in enumerate(phases))]  # utilisation changes
    rec, system = scripted_recorder(clock, sink, script)
    rec.tick()
    next_tick = start + 1.0  # the loop's grid; cuts arrive between its ticks
    for op, n in ops:
        if op == "tick":
            clock.t, next_tick = next_tick, next_tick + 1.0
            rec.step()
        elif op == "cut":
            clock.t = min(clock.t + n / 1024, next_tick - 1 / 1024)
            rec.cut()
        else:
            system.fail_next = True
    clock.t += stop_after / 1024
    rec.stop()
    host = sink.all(1)
    assert_exact_host_intervals(host, system, start)
    assert all(iv.t1 - iv.t0 >= SLIVER_S for iv in host[:-1])  # only the last, closed at stop, may be shorter
    assert math.fsum(iv.cpu_s for iv in host) == pytest.approx(rec._host.totals().cpu_s)


class BlockedSink:
    """A ledger that does not answer (a locked SQLite file, a hung server) until released."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Event()
        self.batches: list[tuple] = []

    def __call__(self, gpu, host, events, metrics) -> None:
        self.entered.set()
        assert self.release.wait(30), "the test never released the ledger"
        self.batches.append((list(gpu), list(host), list(events), list(metrics)))


class CountingHost(ScriptedHost):
    """Notes when each reading was taken and whether the ledger was still hung then."""

    def __init__(self, clock: Clock, hung: Callable[[], bool]) -> None:
        super().__init__(clock)
        self.hung = hung
        self.reads: list[tuple[float, bool]] = []

    def read(self, now: float, closes_interval: bool = False) -> HostTick | None:
        self.reads.append((now, self.hung()))
        return super().read(now, closes_interval)


def test_a_ledger_that_does_not_answer_never_delays_a_reading_and_loses_nothing() -> None:
    """Readings keep their cadence while the ledger hangs, the final one is taken at stop (where the
    run ends) without waiting for it, and every interval is written once the ledger answers."""
    sink = BlockedSink()
    host = CountingHost(Clock(), hung=lambda: not sink.release.is_set())
    rec = Recorder(sink, host=host, interval_s=0.5, clock=time.time)  # a tick every 0.5 s
    rec.start()
    assert sink.entered.wait(10)  # the writer is stuck creating the run
    deadline = time.time() + 25  # however slow the machine (the sink gives up after 30 s)
    while sum(hung for _, hung in host.reads) < 3 and time.time() < deadline:
        time.sleep(0.02)
    assert sum(hung for _, hung in host.reads) >= 3, f"only {len(host.reads)} readings while the ledger hung"
    stop_at = time.time()
    stopping = threading.Thread(target=rec.stop)
    stopping.start()
    deadline = time.time() + 10
    while host.reads[-1][0] < stop_at and time.time() < deadline:
        time.sleep(0.02)
    sink.release.set()
    stopping.join(10)
    assert not stopping.is_alive()
    final_t, taken_while_hung = host.reads[-1]
    assert final_t >= stop_at and taken_while_hung  # stop's reading did not wait for the ledger
    assert rec.last_reading_t == final_t
    host_intervals = [h for batch in sink.batches for h in batch[1]]
    assert [h.seq for h in host_intervals] == list(range(len(host_intervals)))  # none lost, in order
    assert host_intervals[-1].t1 == final_t
    assert sum(h.samples for h in host_intervals) == len(host.reads) - 1  # every reading but the priming one


def test_an_events_payload_may_hold_any_key_and_event_at_dates_it() -> None:
    """An integration's event payload is its own (``t``, ``kind``, ``message`` included): kept as
    sent, dated now; ``event_at`` dates an event that happened earlier (a file's time)."""
    clock = Clock()
    rec, _ = scripted_recorder(clock, FlakySink(0, RuntimeError()))
    rec.event("note", "hello", t="user's t", kind="user's kind", message="user's message")
    rec.event_at(clock.t - 30, "epoch_end", "epoch 2 ended", epoch=2, t=0)
    first, second = rec.pending.events
    assert (first.t, first.kind, first.message) == (clock.t, "note", "hello")
    assert first.payload == {"t": "user's t", "kind": "user's kind", "message": "user's message"}
    assert (second.t, second.kind, second.payload) == (clock.t - 30, "epoch_end", {"epoch": 2, "t": 0})
