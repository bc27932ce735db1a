"""CPU of the node agent in its real loop: 8 scripted GPUs, 64 real processes, the default interval.

Eight "trainings" run below this process, each a process group of one parent and 7 workers (64
processes, each busy ~5 % of a core), and each listed by a scripted NVML (collect/fake_nvml.py) on
its own GPU, with memory and SM share, the way NVML lists the processes of an 8-GPU node. The
agent's real loop (``NodeAgent.run``: a reading every 2 s at the default 10 s interval) attributes
them from the real /proc, records 8 discovered runs (process-tree host figures, the heavier of the
two paths: a container's come from its cgroup) and writes them into a SQLite ledger from its ledger
thread, and feeds its /metrics model. Measured:

- CPU per reading: the loop thread's own CPU around each tick (``time.thread_time``), and the part
  spent in the GPU read (the scripted NVML standing in for the driver, plus the collector);
- % of one core: the whole process's CPU (every thread: loop, ledger writes) over the wall time,
  from the 8th reading on (the first ones open the ledger and create the runs: start-up, not rate);
- beside it, the psutil floor: one psutil ``oneshot()`` read of each of the same 64 processes per
  2 s (who it is, CPU, memory, I/O: the least any per-process monitor does), in the same real loop;
- nvidia-smi's CPU per query (``--query-gpu`` plus ``--query-compute-apps``) when it is installed.

Rounds alternate agent and floor. Printed, not asserted:

    python benchmarks/agent_tick.py [--seconds 60] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import psutil

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from _common import PARENT, machine_line, p95

from gpuledger.collect.fake_nvml import FakeGpu, FakeNvml, TracePoint
from gpuledger.collect.nvml import NvmlCollector
from gpuledger.node.agent import AgentConfig, NodeAgent
from gpuledger.node.metrics import NodeMetrics
from gpuledger.node.procfacts import ProcReader
from gpuledger.node.sink import LedgerSink
from gpuledger.node.sources import Sources

GiB = 2**30
GPUS = 8
WARM_TICKS = 8  # past the first interval: the runs exist, the ledger is open


def start_trainings() -> list[subprocess.Popen[bytes]]:
    """8 process groups of 8 processes; returns the parents once all 56 workers are up."""
    parents = [subprocess.Popen([sys.executable, "-c", PARENT], start_new_session=True) for _ in range(GPUS)]
    deadline = time.monotonic() + 60
    while sum(len(psutil.Process(p.pid).children()) for p in parents) < 7 * GPUS:
        if time.monotonic() > deadline:
            raise SystemExit("the benchmark's processes did not start")
        time.sleep(0.1)
    return parents


def group_pids(parent: subprocess.Popen[bytes]) -> list[int]:
    return [parent.pid, *(c.pid for c in psutil.Process(parent.pid).children())]


class TimedGpu:
    """The agent's GPU collector with the loop thread's CPU inside ``read`` counted."""

    def __init__(self, inner: NvmlCollector) -> None:
        self.inner, self.cpu_s = inner, []  # type: ignore[var-annotated]

    def devices(self):  # type: ignore[no-untyped-def]
        return self.inner.devices()

    def read(self, pids, now, closes_interval=True):  # type: ignore[no-untyped-def]
        t0 = time.thread_time()
        try:
            return self.inner.read(pids, now, closes_interval)
        finally:
            self.cpu_s.append(time.thread_time() - t0)

    def close(self) -> None:
        self.inner.close()


def run_agent(groups: list[list[int]], seconds: float, folder: str) -> dict[str, float]:
    gpus = []
    for i, pids in enumerate(groups):
        procs = {pid: ((6 if pid == pids[0] else 1) * GiB // 2, 90.0 if pid == pids[0] else None) for pid in pids}
        gpus.append(FakeGpu(f"GPU-{i:08d}-0000-4000-8000-000000000000", pci_bus_id=f"00000000:{i + 7:02X}:00.0",
                            points=[TracePoint(0.0, util_pct=85, mem_used_b=40 * GiB, power_w=350, temp_c=60,
                                               sm_clock_mhz=1410, mem_clock_mhz=1593, procs=procs)]))  # fmt: skip
    fake = FakeNvml(gpus, clock=time.time, start=time.time())
    gpu = TimedGpu(NvmlCollector(nvml=fake, all_processes=True))
    sink = LedgerSink(f"sqlite:///{folder}/ledger.db", host="bench-node", boot_id="bench", warn=print)
    sink.start()
    procs = ProcReader()
    agent = NodeAgent(AgentConfig(host="bench-node"), gpu=gpu, procs=procs, sources=Sources([]), sink=sink,  # type: ignore[arg-type]
                      metrics=NodeMetrics("bench-node"), boot_id="bench", boot_time=procs.boot_time())  # fmt: skip
    ticks: list[float] = []
    inner_tick = agent.tick
    mark: list[tuple[float, float]] = []  # (wall, process CPU) once warm

    def timed_tick(now: float | None = None, **kw: object) -> None:
        t0 = time.thread_time()
        inner_tick(now, **kw)  # type: ignore[arg-type]
        ticks.append(time.thread_time() - t0)
        if len(ticks) == WARM_TICKS:
            mark.append((time.monotonic(), time.process_time()))

    agent.tick = timed_tick  # type: ignore[method-assign]
    stop = threading.Event()
    threading.Timer(seconds, stop.set).start()
    agent.run(stop)
    wall, cpu = time.monotonic() - mark[0][0], time.process_time() - mark[0][1]
    agent.shutdown()
    sink.close()
    warm = ticks[WARM_TICKS:]  # the first readings open the runs, create them in the ledger, prime cursors
    gpu_warm = gpu.cpu_s[WARM_TICKS:]
    return {"ticks": len(warm), "median_ms": statistics.median(warm) * 1e3, "p95_ms": p95(warm) * 1e3,
            "mean_ms": statistics.fmean(warm) * 1e3, "gpu_ms": statistics.fmean(gpu_warm) * 1e3,
            "core_pct": 100 * cpu / wall, "runs": len(agent.tracks)}  # fmt: skip


def run_floor(pids: list[int], seconds: float, period: float) -> dict[str, float]:
    """One psutil oneshot() read per process per period, in a real loop."""
    procs = [psutil.Process(p) for p in pids]
    scans: list[float] = []
    wall0, cpu0 = time.monotonic(), time.process_time()
    while time.monotonic() - wall0 < seconds:
        time.sleep(period)
        t0 = time.thread_time()
        for p in procs:
            try:
                with p.oneshot():
                    p.ppid(), p.create_time(), p.uids(), p.cpu_times(), p.memory_info(), p.io_counters()
            except psutil.Error:
                pass
        scans.append(time.thread_time() - t0)
    wall, cpu = time.monotonic() - wall0, time.process_time() - cpu0
    return {"ticks": len(scans), "median_ms": statistics.median(scans) * 1e3, "p95_ms": p95(scans) * 1e3,
            "mean_ms": statistics.fmean(scans) * 1e3, "core_pct": 100 * cpu / wall}  # fmt: skip


def nvidia_smi(calls: int = 10) -> str:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return "nvidia-smi: not on this machine (no NVIDIA driver): not measured"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    for _ in range(calls):
        subprocess.run([smi, "--query-gpu=utilization.gpu,memory.used,power.draw", "--format=csv"],
                       capture_output=True, check=False)  # fmt: skip
        subprocess.run([smi, "--query-compute-apps=pid,used_memory", "--format=csv"], capture_output=True, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    per = ((after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)) / calls
    return f"nvidia-smi: {per * 1e3:.1f} ms CPU per query pair ({100 * per / 2.0:.2f} % of one core every 2 s)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0, help="per variant and round")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    print(machine_line())
    parents = start_trainings()
    try:
        groups = [group_pids(p) for p in parents]
        everyone = [pid for g in groups for pid in g]
        config = AgentConfig(host="x")
        print(f"{len(everyone)} processes in {len(groups)} process groups on {GPUS} scripted GPUs; "
              f"agent reading every {config.tick:g} s, intervals of {config.interval_s:g} s")  # fmt: skip
        for r in range(1, args.rounds + 1):
            with tempfile.TemporaryDirectory() as folder:
                a = run_agent(groups, args.seconds, folder)
            print(f"round {r} agent:  {a['ticks']} readings, CPU per reading median {a['median_ms']:.2f} ms, "
                  f"p95 {a['p95_ms']:.2f}, mean {a['mean_ms']:.2f} (GPU read {a['gpu_ms']:.2f}); "
                  f"{a['core_pct']:.3f} % of one core (all threads); {a['runs']} discovered runs")  # fmt: skip
            f = run_floor(everyone, args.seconds, config.tick)
            print(f"round {r} psutil floor: {f['ticks']} scans, CPU per scan median {f['median_ms']:.2f} ms, "
                  f"p95 {f['p95_ms']:.2f}, mean {f['mean_ms']:.2f}; {f['core_pct']:.3f} % of one core")  # fmt: skip
        print(nvidia_smi())
    finally:
        for p in parents:
            for c in psutil.Process(p.pid).children(recursive=True):
                c.kill()
            p.kill()
            p.wait()


if __name__ == "__main__":
    main()
