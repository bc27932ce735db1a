"""``gpuledger agent`` end to end: a real unwrapped process discovered, billed and resumed; a wrapped
run on the same GPU left to its own record. The GPU is a replayed trace naming the real pids."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from e2e_helpers import GPULEDGER, cli_env, run_cli, runs_json, show_json
from gpuledger.store import Ledger

pytestmark = pytest.mark.slow

GiB = 2**30
GPU = "GPU-7e57a9e0-0000-4000-8000-00000000e2e0"
SLEEPER = "import time; time.sleep(600)"


def trace(path: Path, procs: dict[int, tuple[int, float]]) -> Path:
    header = {"format": "gpuledger-gpu-trace", "version": 1,
              "gpus": [{"uuid": GPU, "name": "NVIDIA A100-SXM4-80GB", "profile": "ideal"}]}  # fmt: skip
    point = {"t": 0, "gpu": 0, "util_pct": 75, "mem_used_b": 8 * GiB, "power_w": 320, "temp_c": 55,
             "procs": {str(pid): {"mem_b": mem, "sm_pct": sm} for pid, (mem, sm) in procs.items()}}  # fmt: skip
    path.write_text(json.dumps(header) + "\n" + json.dumps(point) + "\n")
    return path


class Agent:
    def __init__(self, env: dict[str, str], trace_path: Path, log: Path) -> None:
        self.log = log
        self.proc = subprocess.Popen(
            [*GPULEDGER, "agent", "--interval", "1", "--replay-gpus", str(trace_path), "--no-slurm",
             "--docker-socket", "none", "--kubelet-socket", "none", "--metrics-port", "0", "--dcgm-names"],
            env=env, stdout=subprocess.DEVNULL, stderr=log.open("wb"),
        )  # fmt: skip

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def metrics_url(self) -> str:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            m = re.search(r"/metrics on (http://[0-9.:]+/metrics)", self.text())
            if m:
                return m.group(1)
            time.sleep(0.1)
        raise AssertionError(f"no /metrics line in the start report:\n{self.text()}")

    def stop(self, sig: int = signal.SIGTERM) -> int:
        self.proc.send_signal(sig)
        return self.proc.wait(timeout=60)


def wait_for(what: str, check, timeout: float = 60.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def discovered(url: str, min_intervals: int = 0) -> list:  # type: ignore[type-arg]
    with Ledger(url) as led:
        runs = [r for r in led.list_runs() if r.status == "discovered"]
        return [r for r in runs if len(led.gpu_intervals(r.id)) >= min_intervals]


def scrape(url: str, run_id: str) -> str | None:
    body = httpx.get(url, timeout=10).text
    return body if run_id in body else None


def wrapped_command_pid(wrapper: subprocess.Popen) -> int:  # type: ignore[type-arg]
    def find() -> int | None:
        for child in psutil.Process(wrapper.pid).children(recursive=True):
            try:
                if SLEEPER in " ".join(child.cmdline()):
                    return child.pid
            except psutil.Error:
                continue
        return None

    return wait_for("the wrapped command", find)


def test_an_unwrapped_process_is_discovered_billed_and_resumed(tmp_path: Path, ledger_url: str) -> None:
    env = cli_env(tmp_path / "home", ledger_url)
    trainer = subprocess.Popen(
        [sys.executable, "-c", SLEEPER],
        start_new_session=True,
        env={**env, "GPULEDGER_TEAM": "vision", "GPULEDGER_PROJECT": "defect-detection"},
    )
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    wrapper = subprocess.Popen([*GPULEDGER, "run", "--no-gpu", "--quiet", "--", sys.executable, "-c", SLEEPER],
                               env=env, start_new_session=True, **quiet)  # fmt: skip
    try:
        wrapped_pid = wrapped_command_pid(wrapper)
        path = trace(tmp_path / "trace.jsonl", {trainer.pid: (4 * GiB, 60.0), wrapped_pid: (2 * GiB, 30.0)})

        first = Agent(env, path, tmp_path / "agent1.log")
        url = first.metrics_url()
        [run] = wait_for("a discovered run with intervals", lambda: discovered(ledger_url, 3))
        body = wait_for("its series on /metrics", lambda: scrape(url, run.id))
        assert re.search(rf'gpuledger_gpu_busy_seconds_total\{{[^}}]*run_id="{run.id}"[^}}]*team="vision"', body)
        assert re.search(rf'DCGM_FI_DEV_FB_USED\{{[^}}]*UUID="{GPU}"[^}}]*\}} 8192', body)
        assert first.stop(signal.SIGKILL) == -signal.SIGKILL  # kill -9: no goodbye, nothing closed
        with Ledger(ledger_url) as led:
            seqs_before = [iv.seq for iv in led.gpu_intervals(run.id)]

        second = Agent(env, path, tmp_path / "agent2.log")
        wait_for(
            "the resumed run to grow", lambda: len(Ledger(ledger_url).gpu_intervals(run.id)) > len(seqs_before) + 2
        )
        assert second.stop() == 0  # SIGTERM: the last interval closed, the run left open
        assert "1 discovered run(s) left open" in second.text()

        runs = runs_json(env)
        assert sorted(r["status"] for r in runs) == ["discovered", "running"]  # the wrapped run is its own
        with Ledger(ledger_url) as led:
            [again] = discovered(ledger_url)
            seqs = [iv.seq for iv in led.gpu_intervals(run.id)]
            assert again.id == run.id and seqs == list(range(len(seqs)))  # same run, seqs continue, no duplicate
            proc_mem = max(iv.proc_mem_max_b for iv in led.gpu_intervals(run.id))
            assert proc_mem == 4 * GiB  # its own process on the shared GPU, not the wrapped one's
            assert [d.uuid for d in led.devices(run.id)] == [GPU]

        table = run_cli(["runs"], env)
        assert table.returncode == 0 and b"discovered" in table.stdout
        shown = show_json(run.id, env)
        assert shown["status"] == "discovered" and shown["labels"]["team"] == "vision"
        assert shown["command"] == [sys.executable, "-c", SLEEPER] and shown["gpus"][0]["uuid"] == GPU
        cost = run_cli(["cost", run.id, "--json"], env)
        assert cost.returncode == 0, cost.stderr.decode()
        costed = json.loads(cost.stdout)["runs"][0]
        assert costed["run_id"] == run.id and costed["total"]["allocated_gpu_h"] > 0 and costed["partial"]

        trainer.kill()  # the training ends while no agent runs
        trainer.wait()
        third = Agent(env, path, tmp_path / "agent3.log")
        wait_for("the run's end", lambda: Ledger(ledger_url).get_run(run.id).ended_at is not None)
        assert third.stop() == 0
        ended = show_json(run.id, env)
        assert ended["status"] == "discovered" and ended["ended_at"] is not None
        # the GPU is a replayed trace: a demo run is billed only when asked for (docs/CHARGEBACK.md)
        cb = run_cli(["report", "chargeback", "--by", "team", "--format", "json", "--include-replayed"], env)
        assert cb.returncode == 0, cb.stderr.decode()
        groups = {g["team"]: g for g in json.loads(cb.stdout)["groups"]}
        assert groups["vision"]["runs"] == 1 and groups["vision"]["allocated_gpu_h"] > 0
        assert groups["vision"]["partial_runs"] == 0  # ended: finished for the chargeback
        assert groups["vision"]["replayed_runs"] == 1
    finally:
        for p in (trainer, wrapper):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(timeout=60)


BURN = (  # waits for the go file, burns 1.5 CPU-seconds, writes what it burned, sleeps
    "import json, os, sys, time\n"
    "while not os.path.exists(sys.argv[1] + '.go'): time.sleep(0.02)\n"
    "t0 = os.times(); end = time.process_time() + 1.5\n"
    "while time.process_time() < end: pass\n"
    "t1 = os.times()\n"
    "json.dump({'cpu_s': t1.user + t1.system - t0.user - t0.system}, open(sys.argv[1], 'w'))\n"
    "time.sleep(600)\n"
)


def test_an_unwrapped_process_in_process_with_the_scripted_nvml_naming_its_real_pid(
    tmp_path: Path, ledger_url: str
) -> None:
    """The loop in this process, in real time, on the real /proc: the child's own CPU is its run's."""
    from gpuledger.collect.fake_nvml import FakeGpu, FakeNvml, TracePoint
    from gpuledger.collect.nvml import NvmlCollector
    from gpuledger.node.agent import AgentConfig, NodeAgent
    from gpuledger.node.procfacts import ProcReader
    from gpuledger.node.sink import LedgerSink
    from gpuledger.node.sources import Sources

    truth = tmp_path / "truth.json"
    child = subprocess.Popen([sys.executable, "-c", BURN, str(truth)], start_new_session=True)
    try:
        fake = FakeNvml([FakeGpu(GPU, profile="ideal", points=[TracePoint(0.0, util_pct=90, mem_used_b=4 * GiB,
                         power_w=300, procs={"run": (3 * GiB, 90.0)})])], clock=time.time, start=time.time(),
                        host_pid_offset=0)  # fmt: skip
        fake.run_pids = {child.pid}  # NVML names the child by its real (host) pid
        procs = ProcReader()
        sink = LedgerSink(ledger_url, host="real-node", boot_id=procs.boot_id(), warn=print)
        sink.start()
        agent = NodeAgent(AgentConfig(host="real-node", interval_s=1.0, cgroup_root=str(tmp_path / "no-cgroups")),
                          gpu=NvmlCollector(nvml=fake, all_processes=True), procs=procs, sources=Sources([]),
                          sink=sink, boot_id=procs.boot_id(), boot_time=procs.boot_time())  # fmt: skip
        deadline = time.monotonic() + 60
        while not agent.tracks and time.monotonic() < deadline:  # until its run is open ...
            agent.tick()
            time.sleep(0.2)
        agent.tick()  # ... and its host figures are primed
        Path(f"{truth}.go").touch()
        while not truth.exists() and time.monotonic() < deadline:
            agent.tick()
            time.sleep(0.2)
        for _ in range(6):  # a little more, then stop: the run stays open
            agent.tick()
            time.sleep(0.2)
        agent.shutdown()
        assert sink.close(timeout_s=30)
        burned = json.loads(truth.read_text())["cpu_s"]
        with Ledger(ledger_url) as led:
            [run] = led.list_runs()
            assert run.meta["node"]["host_figures"] == "processes" and run.command[-1] == str(truth)
            cpu = sum(h.cpu_s for h in led.host_intervals(run.id))
            assert cpu == pytest.approx(burned, abs=0.15)  # its CPU while the run was open (clock ticks: 10 ms)
            assert max(iv.proc_mem_max_b for iv in led.gpu_intervals(run.id)) == 3 * GiB
    finally:
        child.kill()
        child.wait()
