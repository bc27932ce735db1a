"""The node agent's capacity states, in process: the agent's real loop over crafted /proc and cgroup
trees, the scripted NVML and scripted platform claims (tests/test_agent_loop.py's Node), a real
ledger on SQLite and PostgreSQL. Every second of each GPU lands in exactly one state."""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import pytest

from gpuledger.collect.fake_nvml import Failing, FakeGpu, FakeNvml, TracePoint
from gpuledger.collect.nvml import NvmlCollector
from gpuledger.core.model import GpuIdentity, RunRecord
from gpuledger.node.claims import Allocation, Claims
from gpuledger.store import Ledger
from gpuledger.store.capacity_queries import day_rows, fleet, intervals
from test_agent_loop import GPU0, GPU1, T0, Node, labelled, make_trees
from test_agent_procfacts import make_proc


@pytest.fixture
def trees(tmp_path: Path) -> Path:
    return make_trees(tmp_path)


STATES = ("unallocated_ms", "alloc_idle_ms", "busy_attr_ms", "busy_unattr_ms")


def _by_gpu(rows: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in rows:
        out.setdefault(r["gpu_uuid"], []).append(r)
    return out


def _totals(rows: list[dict]) -> dict[str, int]:
    return {s: sum(r[s] for r in rows) for s in (*STATES, "unmeasured_ms")}


def _contiguous_and_exact(rows: list[dict]) -> None:
    for a, b in itertools.pairwise(rows):
        assert a["t1_ms"] == b["t0_ms"]  # no gap, no overlap between the agent's intervals
    for r in rows:
        assert sum(r[s] for s in STATES) == r["t1_ms"] - r["t0_ms"]


def test_a_training_and_a_gpu_its_container_was_given_but_never_used(trees: Path, ledger_url: str) -> None:
    # GPU0: the container's training (50 % busy, its processes found); GPU1: allocated to the
    # container by Docker, no process ever on it.
    node = Node(trees, ledger_url, labelled())
    node.tick(20)  # 40 s
    node.stop()
    with Ledger(ledger_url) as led:
        rows = _by_gpu(led.read(lambda c: intervals(c)))
        gpus = {g.uuid: g for g in led.read(lambda c: fleet(c))}
        days = led.read(lambda c: day_rows(c, 0, 10**6))
    assert set(rows) == {GPU0, GPU1}
    for r in rows.values():
        _contiguous_and_exact(r)
        assert r[0]["t0_ms"] == T0 * 1000 + 2000  # the first reading primes NVML: not metered
        assert r[-1]["t1_ms"] == T0 * 1000 + 40_000
    busy = _totals(rows[GPU0])
    assert busy["unallocated_ms"] == 0 and busy["busy_unattr_ms"] == 0  # held by its run, every process owned
    assert busy["busy_attr_ms"] / 38_000 == pytest.approx(0.5, abs=0.03)  # the scripted 50 % utilisation
    assert busy["busy_attr_ms"] + busy["alloc_idle_ms"] == 38_000 and busy["unmeasured_ms"] == 0
    idle = _totals(rows[GPU1])
    assert idle["alloc_idle_ms"] == 38_000  # allocated (who may use it) but never used: allocated-idle
    assert {g.host for g in gpus.values()} == {"node-1"} and gpus[GPU0].name == "NVIDIA A100-SXM4-80GB"
    assert gpus[GPU0].first_seen == T0 + 2 and gpus[GPU0].last_seen == T0 + 40
    assert sum(d[5] + d[6] + d[7] + d[8] for d in days) == 76_000  # the day sums hold every millisecond


def test_a_free_gpu_is_unallocated_and_work_nobody_owns_is_busy_unattributed(trees: Path, ledger_url: str) -> None:
    # GPU0 runs a process that is not in the agent's /proc (another PID namespace): busy, no owner.
    # GPU1 is allocated to nobody and used by nobody.
    node = Node(trees, ledger_url, Claims(), procs={999: (4 * 2**30, 50.0)})
    node.tick(10)
    node.stop()
    with Ledger(ledger_url) as led:
        rows = _by_gpu(led.read(lambda c: intervals(c)))
        assert led.list_runs() == []  # nothing to attribute: no discovered run
    orphan, free = _totals(rows[GPU0]), _totals(rows[GPU1])
    assert free["unallocated_ms"] == 18_000 and free["unmeasured_ms"] == 0
    assert orphan["busy_attr_ms"] == 0 and orphan["alloc_idle_ms"] == 0
    assert orphan["busy_unattr_ms"] / 18_000 == pytest.approx(0.5, abs=0.05)
    assert orphan["busy_unattr_ms"] + orphan["unallocated_ms"] == 18_000


def test_busy_time_with_no_process_listed_has_no_owner_and_a_pods_gpu_is_held(trees: Path, ledger_url: str) -> None:
    # GPU0: the driver measures 50 % busy but lists no process; GPU1: allocated to a pod, unused.
    node = Node(trees, ledger_url, Claims(allocations=[Allocation(GPU1, "pod", "pod-uid")]), procs={})
    node.tick(5)
    node.stop()
    with Ledger(ledger_url) as led:
        rows = _by_gpu(led.read(lambda c: intervals(c)))
    assert _totals(rows[GPU1])["alloc_idle_ms"] == 8000
    unowned = _totals(rows[GPU0])
    assert unowned["busy_unattr_ms"] == pytest.approx(4000, abs=400)
    assert unowned["busy_unattr_ms"] + unowned["unallocated_ms"] == 8000


class _Mig(Node):
    """One A100 in MIG mode with two 3g.40gb slices; a process of a container on the first slice,
    the second slice allocated to a pod."""

    def __init__(self, tmp: Path, url: str, claims: Claims) -> None:
        super().__init__(tmp, url, claims)
        slices = [
            FakeGpu(SLICE_A, mig_profile="3g.40gb", memory_total_b=40 * 2**30,
                    points=[TracePoint(0, mem_used_b=7, procs={300: (None, None)})]),
            FakeGpu(SLICE_B, mig_profile="3g.40gb", memory_total_b=40 * 2**30),
        ]  # fmt: skip
        fake = FakeNvml([FakeGpu(PARENT, mig=slices, points=[TracePoint(0, power_w=100)])], clock=self.clock,
                        start=self.clock.t)  # fmt: skip
        gpu = NvmlCollector(nvml=fake, clock=self.clock, all_processes=True)
        self.agent._gpu, self.agent._devices = gpu, {d.uuid: d for d in gpu.devices()}


PARENT, SLICE_A, SLICE_B = "GPU-99999999-0000-0000-0000-000000000000", "MIG-aaaa", "MIG-bbbb"


def test_a_mig_gpu_is_one_asset_busy_while_a_slice_is_in_use(trees: Path, ledger_url: str) -> None:
    node = _Mig(trees, ledger_url, Claims(allocations=[Allocation(SLICE_B, "pod", "pod-uid")]))
    node.tick(6)
    node.stop()
    with Ledger(ledger_url) as led:
        rows = _by_gpu(led.read(lambda c: intervals(c)))
        [gpu] = led.read(lambda c: fleet(c))
    assert set(rows) == {PARENT}  # the physical GPU, not its slices
    totals = _totals(rows[PARENT])
    assert totals["busy_attr_ms"] == 10_000 and totals["unmeasured_ms"] == 10_000  # NVML gives no utilisation
    assert (gpu.uuid, gpu.name, gpu.extra.get("mig_mode")) == (PARENT, "NVIDIA A100-SXM4-80GB", "enabled")
    # ... but it does give the physical GPU's energy: 100 W over the 10 s metered
    assert sum(r["energy_j"] for r in rows[PARENT]) == pytest.approx(1000.0, rel=0.01)


def _gpu1_with_an_open_run(trees: Path, url: str, recorder_pid: int | None) -> tuple[int, int]:
    """(allocated-idle ms, unallocated ms) of GPU1 over 8 s while a `gpuledger run` recorded on this host
    into the agent's ledger is open on it (no process of it on the GPU)."""
    run_id = "0190aaaa-0000-7000-8000-000000000001"
    with Ledger(url) as led:
        led.create_run(RunRecord(id=run_id, command=["python", "train.py"], user="u", host="node-1", cwd="/",
                                 started_at=T0, status="running", recorder_pid=recorder_pid))  # fmt: skip
        led.add_devices(run_id, [GpuIdentity(0, GPU1, "NVIDIA A100-SXM4-80GB")])
    node = Node(trees, url, Claims(), procs={})
    deadline = time.monotonic() + 30
    while not node.sink.holds and time.monotonic() < deadline:  # the ledger thread's first look
        time.sleep(0.05)
    node.tick(5)
    node.stop()
    with Ledger(url) as led:
        totals = _totals(_by_gpu(led.read(lambda c: intervals(c)))[GPU1])
    return totals["alloc_idle_ms"], totals["unallocated_ms"]


def test_a_wrapped_run_holds_its_gpus_while_none_of_its_processes_is_on_them(trees: Path, ledger_url: str) -> None:
    # `gpuledger run` on this host recorded into the agent's ledger, its GPU1 idle: held, so allocated-idle
    assert _gpu1_with_an_open_run(trees, ledger_url, None) == (8000, 0)


def _every_ms_once(rows: list[dict]) -> None:
    """No millisecond of the GPU in two intervals, and the states of each add up to its span."""
    rows = sorted(rows, key=lambda r: r["t0_ms"])
    for a, b in itertools.pairwise(rows):
        assert a["t1_ms"] <= b["t0_ms"], (a["t0_ms"], a["t1_ms"], b["t0_ms"])
    for r in rows:
        assert sum(r[s] for s in STATES) == r["t1_ms"] - r["t0_ms"]


def test_a_wall_clock_stepped_back_counts_no_gpu_time_twice(trees: Path, ledger_url: str) -> None:
    node = Node(trees, ledger_url, labelled())
    node.tick(10)  # up to T0 + 20
    node.clock.t -= 30.0  # an NTP step back, an administrator
    node.tick(20)  # 40 s more: the clock reads T0 + 30 at the end
    node.stop()
    with Ledger(ledger_url) as led:
        rows = _by_gpu(led.read(lambda c: intervals(c)))
    for r in rows.values():
        _every_ms_once(r)
        assert sum(x["t1_ms"] - x["t0_ms"] for x in r) == 28_000  # T0+2 .. T0+30, each millisecond once


def test_a_reading_that_fails_after_it_was_metered_counts_no_gpu_time_twice(trees: Path, ledger_url: str) -> None:
    node = Node(trees, ledger_url, labelled())
    node.tick(4)
    publish, failed = node.agent._publish_metrics, []

    def flaky(*args: object) -> None:
        if not failed:
            failed.append(True)
            raise RuntimeError("a step after the metering failed")
        publish(*args)

    node.agent._publish_metrics = flaky  # type: ignore[method-assign]
    node.clock.t += 2.0
    node.poller.poll_once()
    with pytest.raises(RuntimeError):
        node.agent.tick()  # NodeAgent.run reports it and carries on
    node.tick(6)
    node.stop()
    with Ledger(ledger_url) as led:
        rows = _by_gpu(led.read(lambda c: intervals(c)))
    for r in rows.values():
        _contiguous_and_exact(sorted(r, key=lambda x: x["t0_ms"]))
        assert sum(x["t1_ms"] - x["t0_ms"] for x in r) == 20_000  # T0+2 .. T0+22


def test_busy_time_lost_from_the_sample_buffer_is_unmeasured_not_idle(trees: Path, ledger_url: str) -> None:
    # The agent stalls 9 s while GPU0 is 100 % busy under its container's training; the driver's
    # 30-sample buffer (5 s) wraps and the GPU gives no instant reading: the lost seconds have no busy figure.
    node = Node(trees, ledger_url, labelled())
    busy = [TracePoint(0.0, util_pct=100, mem_used_b=20 * 2**30, power_w=300, temp_c=60,
                       procs={300: (8 * 2**30, 40.0), 301: (4 * 2**30, 20.0)})]  # fmt: skip
    fake = FakeNvml([FakeGpu(GPU0, profile="ideal", points=busy, buffer_len=30,
                             unsupported=frozenset({"nvmlDeviceGetUtilizationRates"}))],
                    clock=node.clock, start=node.clock.t)  # fmt: skip
    gpu = NvmlCollector(nvml=fake, clock=node.clock, all_processes=True)
    node.agent._gpu, node.agent._devices = gpu, {d.uuid: d for d in gpu.devices()}
    node.tick(3)
    node.clock.t += 9.0  # the stalled reading (shorter than an interval: still observed)
    node.poller.poll_once()
    node.agent.tick()
    node.tick(3)
    node.stop()
    with Ledger(ledger_url) as led:
        rows = _by_gpu(led.read(lambda c: intervals(c)))
    totals = _totals(rows[GPU0])
    assert totals["alloc_idle_ms"] < 1_000  # never idle (a sample period's edges, not the 15 s lost)
    assert totals["unmeasured_ms"] >= 3_000  # the lost span is said to be unmeasured


def test_a_buffer_read_that_fails_once_is_measured_and_the_next_reading_is_not_busier(
    trees: Path, ledger_url: str
) -> None:
    # GPU0 is 50 % busy under its container's training; GetSamples answers Unknown at one reading
    node = Node(trees, ledger_url, labelled())
    points = [TracePoint(0.0, util_pct=50, mem_used_b=20 * 2**30, power_w=300, temp_c=60,
                         procs={300: (8 * 2**30, 40.0), 301: (4 * 2**30, 20.0)})]  # fmt: skip
    gpu0 = FakeGpu(GPU0, profile="ideal", points=points, failing=[Failing("nvmlDeviceGetSamples", 9.0, 11.0)])
    fake = FakeNvml([gpu0], clock=node.clock, start=node.clock.t)
    gpu = NvmlCollector(nvml=fake, clock=node.clock, all_processes=True)
    node.agent._gpu, node.agent._devices = gpu, {d.uuid: d for d in gpu.devices()}
    node.tick(10)
    node.stop()
    with Ledger(ledger_url) as led:
        rows = _by_gpu(led.read(lambda c: intervals(c)))
    totals = _totals(rows[GPU0])
    metered = sum(x["t1_ms"] - x["t0_ms"] for x in rows[GPU0])
    # the failed reading's span is measured by the instant reading, not left unmeasured, and the
    # next reading holds its own busy time only: half of the metered time is busy, as it was
    assert totals["unmeasured_ms"] == 0
    assert totals["busy_attr_ms"] == pytest.approx(metered / 2, abs=200)


@pytest.mark.parametrize("recorder_alive", [True, False])
def test_a_run_whose_recorder_died_holds_no_gpu(trees: Path, ledger_url: str, recorder_alive: bool) -> None:
    # A `gpuledger run` recorded into the agent's ledger with its recorder at pid 4242. Killed -9, its
    # run stays `running` in the ledger (nobody looked since) but pid 4242 is in no /proc any more:
    # its idle GPU1 is then held by nobody. While the recorder lives, the run holds it.
    if recorder_alive:
        make_proc(trees / "proc", 4242, "gpuledger", cmdline=["gpuledger", "run", "--", "python", "train.py"])
    held, unallocated = _gpu1_with_an_open_run(trees, ledger_url, 4242)
    assert (held, unallocated) == ((8000, 0) if recorder_alive else (0, 8000))


def test_an_hour_the_agent_was_paused_is_unobserved_not_guessed(trees: Path, ledger_url: str) -> None:
    # The VM was paused (or the agent SIGSTOPped) for an hour: the next reading's facts say nothing
    # about that hour. It stays out of the capacity intervals, so the report shows it unobserved.
    node = Node(trees, ledger_url, labelled())
    node.tick(5)
    node.clock.t += 3600.0
    node.poller.poll_once()
    node.agent.tick()
    node.tick(5)
    node.stop()
    with Ledger(ledger_url) as led:
        rows = _by_gpu(led.read(lambda c: intervals(c)))
    for r in rows.values():
        _every_ms_once(r)
        assert sum(x["t1_ms"] - x["t0_ms"] for x in r) == 18_000  # 8 s before the pause, 10 s after
