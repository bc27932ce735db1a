"""The recorder loop: failures become events, data that cannot be written waits, nothing is lost."""

from __future__ import annotations

import errno

import pytest

from gpuledger.collect.base import GpuRead
from gpuledger.collect.fake_nvml import FakeGpu, FakeNvml, TracePoint
from gpuledger.collect.nvml import NvmlCollector
from gpuledger.core.model import HostTick
from gpuledger.recorder.recorder import Recorder


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

    def read(self, now: float) -> HostTick | None:
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
        recorder.tick()
        if clock.t - recorder._interval_start >= recorder.interval_s - recorder.tick_s / 2:
            recorder._close_interval()
        if clock.t - recorder._last_flush >= recorder._flush_every_s:
            recorder.flush()


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

        def read(self, pids: set[int], now: float) -> GpuRead:
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
    fake = FakeNvml([FakeGpu(uuid="GPU-aaaa", points=points)], clock=lambda: clock.t - 1000.0)
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
