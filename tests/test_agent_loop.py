"""The agent's loop in process: crafted /proc and cgroup trees, a scripted NVML, scripted platform
claims, a real ledger (SQLite and PostgreSQL). Time is a test clock: no test sleeps."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from gpuledger.collect.fake_nvml import FakeGpu, FakeNvml, TracePoint
from gpuledger.collect.nvml import NvmlCollector
from gpuledger.core.model import DISCOVERED
from gpuledger.node.agent import AgentConfig, NodeAgent
from gpuledger.node.claims import Allocation, Claims, ContainerClaim
from gpuledger.node.metrics import NodeMetrics
from gpuledger.node.procfacts import ProcReader
from gpuledger.node.sink import LedgerSink
from gpuledger.node.sources import SourcePoller, Sources
from gpuledger.store import Ledger
from test_agent_cgroup import V2_SCOPE, v2_cgroup
from test_agent_procfacts import make_proc

CID = "d" * 64  # the container of test_agent_cgroup's tree
GPU0, GPU1 = "GPU-00000000-0000-0000-0000-000000000000", "GPU-11111111-1111-1111-1111-111111111111"
GiB = 2**30
T0 = 1_800_000_000.0


class Clock:
    def __init__(self) -> None:
        self.t = T0

    def __call__(self) -> float:
        return self.t


class Scripted:
    """A ClaimSource as the contract (node/claims.py) describes it; the test sets what it claims."""

    name = "docker"

    def __init__(self, claims: Claims) -> None:
        self.now = claims
        self.closed = False

    def claims(self, now: float) -> Claims:
        return self.now

    def status(self) -> str | None:
        return None

    def close(self) -> None:
        self.closed = True


class Node:
    """One agent over crafted trees; ``tick()`` advances the test clock by one reading (2 s)."""

    def __init__(self, tmp: Path, url: str, claims: Claims, *, boot: str = "boot-A", procs: dict | None = None,
                 exit_at: float | None = None, t0: float = T0, pusher: object = None) -> None:  # fmt: skip
        self.clock = Clock()
        self.clock.t = t0
        self.proc, self.cg = tmp / "proc", tmp / "cgroup"
        listed = {300: (8 * GiB, 40.0), 301: (4 * GiB, 20.0)} if procs is None else procs
        points = [TracePoint(0.0, util_pct=50, mem_used_b=20 * GiB, power_w=300, temp_c=60, procs=listed)]
        if exit_at is not None:  # from then on NVML lists no process on it
            points.append(TracePoint(exit_at, util_pct=0, mem_used_b=GiB, power_w=80, procs={}))
        idle = [TracePoint(0.0, util_pct=0, mem_used_b=0, power_w=60, temp_c=30, procs={})]
        gpus = [FakeGpu(GPU0, profile="ideal", points=points), FakeGpu(GPU1, profile="ideal", points=idle)]
        self.fake = FakeNvml(gpus, clock=self.clock, start=self.clock.t)
        self.source = Scripted(claims)
        self.poller = SourcePoller("docker", lambda: self.source, clock=self.clock)
        self.warnings: list[str] = []
        self.sink = LedgerSink(url, host="node-1", boot_id=boot, warn=self.warnings.append, pusher=pusher)
        self.metrics = NodeMetrics("node-1", dcgm_names=True, clock=self.clock)
        self.agent = NodeAgent(
            AgentConfig(host="node-1", interval_s=10.0, cgroup_root=str(self.cg)),
            gpu=NvmlCollector(nvml=self.fake, clock=self.clock, all_processes=True),
            procs=ProcReader(str(self.proc)), sources=Sources([self.poller]), sink=self.sink, metrics=self.metrics,
            boot_id=boot, clock=self.clock, warn=self.warnings.append,
        )  # fmt: skip
        self.sink.start()

    def tick(self, n: int = 1) -> None:
        for _ in range(n):
            self.clock.t += 2.0
            self.poller.poll_once()
            self.agent.tick()

    def stop(self) -> None:
        self.agent.shutdown()
        assert self.sink.close(timeout_s=30.0), self.warnings


def container_process(proc: Path, pid: int, **kw: object) -> None:
    make_proc(proc, pid, "python", uid=0, cgroup="0::" + V2_SCOPE, cmdline=["python", "train.py"], pgid=300, **kw)


def make_trees(tmp: Path) -> Path:
    """A container's two processes in a crafted /proc, and its cgroup in a crafted v2 hierarchy."""
    container_process(tmp / "proc", 300, start=1000)
    container_process(tmp / "proc", 301, start=1001, ppid=300)
    v2_cgroup(tmp / "cgroup", usage_usec=0, current=GiB, inactive=0, peak=GiB, rbytes=0, wbytes=0)
    return tmp


@pytest.fixture
def trees(tmp_path: Path) -> Path:
    return make_trees(tmp_path)


def labelled(exit_code: int | None = None, finished: float | None = None) -> Claims:
    c = ContainerClaim(CID, name="yolo-train", image="ultralytics:8", labels={
        "team": "vision", "project": "defect-detection", "model_version": "yolov10s", "com.docker.compose": "x"},
        finished_at=finished, exit_code=exit_code)  # fmt: skip
    return Claims(containers={CID: c}, allocations=[Allocation(GPU1, "container", CID)])


def exit_processes(proc: Path, *pids: int) -> None:
    for pid in pids:  # zombies: ended, not yet reaped by their parent
        container_process(proc, pid, start=1000 + pid - 300, state="Z")


def test_a_labelled_container_nobody_wrapped_becomes_a_discovered_run(trees: Path, ledger_url: str) -> None:
    node = Node(trees, ledger_url, labelled(), exit_at=25.0)
    node.tick()  # NVML primes its cursors
    node.tick()  # the container's processes are seen: the run starts here
    v2_cgroup(trees / "cgroup", usage_usec=30_000_000, current=6 * GiB, inactive=GiB, peak=7 * GiB, rbytes=4096,
              wbytes=8192)  # fmt: skip
    node.tick(10)
    node.source.now = labelled(exit_code=3, finished=node.clock.t + 1)  # the Docker adapter saw it die
    exit_processes(trees / "proc", 300, 301)  # ... its processes ended, NVML lists them no more
    node.tick()
    unallocated = {f.name: f for f in node.metrics.collect()}["gpuledger_gpu_unallocated_use"].samples
    node.stop()
    with Ledger(ledger_url) as led:
        [run] = led.list_runs()
        assert (run.status, run.exit_code, run.name, run.user, run.host) == (
            DISCOVERED,
            3,
            "yolo-train",
            "root",
            "node-1",
        )
        assert run.labels == {"team": "vision", "project": "defect-detection", "model_version": "yolov10s"}
        assert run.command == ["python", "train.py"]
        assert run.started_at == T0 + 4 and run.ended_at == T0 + 26
        assert "container exited with code 3" in (run.status_reason or "")
        node_meta = run.meta["node"]
        assert node_meta["key"] == f"container:{CID}" and node_meta["owner"]["container_id"] == CID
        assert node_meta["host_figures"] == "cgroup" and sorted(node_meta["members"]) == [[300, 1000], [301, 1001]]
        assert [d.uuid for d in led.devices(run.id)] == [GPU0]  # only the GPU its processes use
        gpu = led.gpu_intervals(run.id)
        assert [iv.seq for iv in gpu] == list(range(len(gpu))) and gpu[0].t0 == T0 + 4 and gpu[-1].t1 == T0 + 26
        assert sum(iv.busy_s for iv in gpu) == pytest.approx(0.5 * 21, rel=0.02)  # 50 % busy from 4 s to 25 s
        assert max(iv.proc_mem_max_b for iv in gpu[:-1]) == 12 * GiB  # its two processes on the shared GPU
        assert gpu[0].proc_sm_util_avg_pct == pytest.approx(60.0) and gpu[0].proc_method == "pid"
        host = led.host_intervals(run.id)
        assert sum(h.cpu_s for h in host) == pytest.approx(30.0)  # from the container's cgroup
        assert sum(h.read_b for h in host) == 4096 and max(h.rss_max_b for h in host) == 6 * GiB
        events = led.events(run.id, kind="unallocated_gpu")
        assert len(events) == 2 and all(GPU0 in e.message and GPU1 in e.message for e in events)
    counted = [s for s in unallocated if s.name.endswith("_total") and s.labels["run_id"] == run.id]
    assert [(s.labels["uuid"], s.value) for s in counted] == [(GPU0, 2.0)]  # one per process, on /metrics too


def test_wrapped_processes_on_the_same_gpu_are_left_to_their_run(trees: Path, ledger_url: str) -> None:
    # `gpuledger run` inside the same container, next to a process nobody wrapped
    container_process(trees / "proc", 400, start=2000, environ={"GPULEDGER_RUN_ID": "0190aaaa-wrapped"})
    procs = {300: (8 * GiB, 40.0), 400: (10 * GiB, 55.0)}
    node = Node(trees, ledger_url, labelled(), procs=procs)
    node.tick(8)
    families = {f.name: f for f in node.metrics.collect()}
    node.stop()
    with Ledger(ledger_url) as led:
        [run] = led.list_runs()  # the wrapped process made no run of the agent's
        gpu = led.gpu_intervals(run.id)
        assert max(iv.proc_mem_max_b for iv in gpu) == 8 * GiB  # its own process only, not the wrapped one
        assert gpu[0].proc_sm_util_avg_pct == pytest.approx(40.0)
    mem = {s.labels["run_id"]: s.value for s in families["gpuledger_gpu_process_memory_bytes"].samples}
    assert mem == {run.id: 8 * GiB, "0190aaaa-wrapped": 10 * GiB}
    busy = [s for s in families["gpuledger_gpu_busy_seconds"].samples if s.labels["run_id"] == run.id]
    assert busy and busy[0].labels["team"] == "vision" and busy[0].labels["container"] == "yolo-train"
    dcgm = [s for s in families["DCGM_FI_DEV_FB_USED"].samples if s.labels["container"] == "yolo-train"]
    assert dcgm and dcgm[0].value == 20 * 1024 and dcgm[0].labels["UUID"] == GPU0
    assert dcgm[0].labels["modelName"] == "NVIDIA A100-SXM4-80GB" and dcgm[0].labels["hostname"] == "node-1"


def test_restarted_agent_resumes_its_open_run_and_ends_the_ones_whose_processes_left(
    trees: Path, ledger_url: str
) -> None:
    first = Node(trees, ledger_url, labelled())
    first.tick(8)
    first.stop()  # SIGTERM: intervals closed, the run left open
    with Ledger(ledger_url) as led:
        [before] = led.list_runs()
        seqs_before = [iv.seq for iv in led.gpu_intervals(before.id)]
        hosts_before = len(led.host_intervals(before.id))
    assert before.ended_at is None and seqs_before
    second = Node(trees, ledger_url, labelled(), t0=first.clock.t + 30)  # the agent was down for 30 s
    second.tick(8)
    second.stop()
    with Ledger(ledger_url) as led:
        [after] = led.list_runs()
        assert after.id == before.id and after.started_at == before.started_at
        seqs = [iv.seq for iv in led.gpu_intervals(after.id)]
        assert seqs == list(range(len(seqs))) and len(seqs) > len(seqs_before)  # continued, no duplicate
        assert len(led.host_intervals(after.id)) > hosts_before
    # a third agent finds the run's processes gone: it ends it at its last interval
    for pid in (300, 301):
        (trees / "proc" / str(pid) / "stat").unlink()
    third = Node(trees, ledger_url, labelled(), procs={})
    third.tick(7)
    third.stop()
    with Ledger(ledger_url) as led:
        [ended] = led.list_runs()
        assert ended.id == before.id and ended.ended_at == led.last_flush_t(ended.id)
        assert "left the GPUs when the agent started again" in (ended.status_reason or "")


def test_a_new_training_in_the_same_container_is_a_new_run(trees: Path, ledger_url: str) -> None:
    first = Node(trees, ledger_url, labelled())
    first.tick(8)
    first.stop()
    container_process(trees / "proc", 310, start=9000)  # while the agent was away, 300 and 301 ended
    for pid in (300, 301):
        (trees / "proc" / str(pid) / "stat").unlink()
    second = Node(trees, ledger_url, labelled(), procs={310: (6 * GiB, 70.0)}, t0=first.clock.t + 600)
    second.tick(8)
    second.stop()
    with Ledger(ledger_url) as led:
        old, new = sorted(led.list_runs(), key=lambda r: r.started_at)
        assert old.ended_at is not None and new.ended_at is None  # same container key, other processes
        assert new.meta["node"]["members"] == [[310, 9000]]


def test_a_reboot_ends_the_runs_of_the_previous_boot(trees: Path, ledger_url: str) -> None:
    first = Node(trees, ledger_url, labelled())
    first.tick(6)
    first.stop()
    second = Node(trees, ledger_url, labelled(), boot="boot-B", t0=first.clock.t + 100)  # same pids, other boot
    second.tick(6)
    second.stop()
    with Ledger(ledger_url) as led:
        runs = sorted(led.list_runs(), key=lambda r: r.started_at)
        assert len(runs) == 2 and runs[0].ended_at is not None and runs[1].ended_at is None
        assert "rebooted" in (runs[0].status_reason or "")


def test_a_hanging_or_failing_adapter_costs_nothing_but_its_own_claims(trees: Path, tmp_path: Path) -> None:
    release = threading.Event()

    class Hangs(Scripted):
        def claims(self, now: float) -> Claims:
            release.wait(30)
            return Claims()

    class Raises(Scripted):
        def claims(self, now: float) -> Claims:
            raise RuntimeError("socket closed")

    mono = [0.0]
    hung = SourcePoller("kubelet", lambda: Hangs(Claims()), period_s=0.01, monotonic=lambda: mono[0])
    broken = SourcePoller("slurm", lambda: Raises(Claims()), period_s=0.01)
    node = Node(trees, f"sqlite:///{tmp_path}/l.db", labelled())
    node.agent._sources = Sources([node.poller, hung, broken])
    hung.start()
    broken.start()
    started = time.monotonic()
    node.tick(6)
    assert time.monotonic() - started < 20  # the hung source held up no reading
    mono[0] = 1000.0
    states = {s.name: s for s in node.agent._sources.states()}
    assert states["docker"].up and states["docker"].status is None
    assert not states["kubelet"].up and states["kubelet"].status == "no answer yet"
    assert "failed: RuntimeError: socket closed" in (states["slurm"].status or "")
    release.set()
    hung.stop()
    broken.stop()
    node.stop()
    with Ledger(f"sqlite:///{tmp_path}/l.db") as led:
        assert led.list_runs()[0].labels["team"] == "vision"  # the working adapter's claims were used


def test_an_adapter_that_fails_and_recovers_is_said_once_each_way(trees: Path, tmp_path: Path) -> None:
    node = Node(trees, f"sqlite:///{tmp_path}/l.db", labelled())
    node.tick(2)
    good = node.source.claims
    node.source.claims = lambda now: (_ for _ in ()).throw(OSError("daemon restarting"))  # type: ignore[method-assign]
    node.tick(3)
    node.source.claims = good  # type: ignore[method-assign]
    node.tick(3)
    node.stop()
    said = [w for w in node.warnings if "docker" in w]
    assert said == [
        "gpuledger agent: docker: failed: OSError: daemon restarting",
        "gpuledger agent: docker answers again",
    ]
    with Ledger(f"sqlite:///{tmp_path}/l.db") as led:
        assert led.list_runs()[0].labels["team"] == "vision"  # its last claims stood in meanwhile


def test_an_unreachable_ledger_keeps_everything_until_it_is_back(trees: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "ledgers"
    blocker.write_text("a file where the ledger's folder should be")  # the ledger cannot be opened
    url = f"sqlite:///{blocker}/ledger.db"
    node = Node(trees, url, labelled())
    node.tick(8)
    deadline = time.monotonic() + 10
    while not node.warnings and time.monotonic() < deadline:
        time.sleep(0.05)
    assert any("cannot write to the ledger" in w for w in node.warnings)
    blocker.unlink()  # the ledger can be opened again
    node.tick(2)
    node.stop()
    assert any("writable again" in w for w in node.warnings)
    with Ledger(url) as led:
        [run] = led.list_runs()
        assert len(led.gpu_intervals(run.id)) >= 2


class FollowedLog:
    """What the Docker adapter's ContainerLog.view() gives the agent (node/docker_logs.LogView)."""

    def __init__(self) -> None:
        from gpuledger.core.training.logparse import ParsedLog

        self.parsed, self.times, self.error = ParsedLog(format="ultralytics"), {}, None

    def shows(self, epoch: int, t: float, **metrics: float) -> None:
        from gpuledger.core.training.logparse import ParsedEpoch

        self.parsed.epochs.append(ParsedEpoch(epoch, dict(metrics)))
        self.times[epoch] = t

    def view(self):  # type: ignore[no-untyped-def]
        from types import SimpleNamespace

        from gpuledger.node.yolo_console import TrainingFacts

        return SimpleNamespace(parsed=self.parsed, epoch_times=dict(self.times), error=self.error,
                               training=TrainingFacts())  # fmt: skip


def test_a_containers_training_log_gives_its_discovered_run_epochs(trees: Path, ledger_url: str) -> None:
    node = Node(trees, ledger_url, labelled(), exit_at=25.0)
    log = FollowedLog()
    followed: list[str] = []
    node.source.follow = lambda cid: (followed.append(cid), log)[1]  # type: ignore[attr-defined]
    node.tick(2)
    assert followed == [CID]  # the log is followed from the run's first sight
    log.shows(1, T0 + 9, **{"train/box_loss": 1.9, "metrics/mAP50-95(B)": 0.11})
    node.tick(5)
    log.shows(2, T0 + 19, **{"train/box_loss": 1.4, "metrics/mAP50-95(B)": 0.23})
    node.tick(5)
    node.source.now = labelled(exit_code=0, finished=node.clock.t + 1)
    exit_processes(trees / "proc", 300, 301)
    node.tick()
    node.stop()
    with Ledger(ledger_url) as led:
        [run] = led.list_runs()
        metrics = {(m.epoch, m.key): m.value for m in led.metrics(run.id)}
        assert metrics == {(1, "train/box_loss"): 1.9, (1, "metrics/mAP50-95(B)"): 0.11,
                           (2, "train/box_loss"): 1.4, (2, "metrics/mAP50-95(B)"): 0.23}  # fmt: skip
        ends = led.events(run.id, kind="epoch_end")
        assert [(e.payload["epoch"], e.t) for e in ends] == [(1, T0 + 9), (2, T0 + 19)]  # each once, when shown
        [parsed] = led.events(run.id, kind="log_parsed")
        assert parsed.payload["epochs"] == 2


def test_a_process_slurm_places_later_stays_in_its_run(tmp_path: Path, ledger_url: str) -> None:
    # An srun step's process whose cgroup path hides its job: first grouped by its process group,
    # then `scontrol listpids` says it is job 4242's. One run, re-keyed — never two on one GPU.
    from gpuledger.node.claims import JobClaim

    make_proc(tmp_path / "proc", 300, "python", uid=1000, cgroup="0::/system.slice/slurmstepd.scope/step_0/user",
              cmdline=["python", "train.py"], pgid=300, start=1000)  # fmt: skip
    v2_cgroup(tmp_path / "cgroup", usage_usec=0, current=GiB, inactive=0, peak=GiB, rbytes=0, wbytes=0)
    node = Node(tmp_path, ledger_url, Claims(), procs={300: (8 * GiB, 40.0)})
    node.tick(3)
    assert list(node.agent.tracks) == ["pgrp:1000:300"]
    node.source.now = Claims(jobs={"4242": JobClaim("4242", user="alice", pids=frozenset({300}),
                                                    labels={"team": "nlp"})})  # fmt: skip
    node.tick(6)
    assert list(node.agent.tracks) == ["slurm:4242"]
    node.stop()
    with Ledger(ledger_url) as led:
        [run] = led.list_runs()
        assert run.labels.get("team") == "nlp"
        gpu = led.gpu_intervals(run.id)
        assert [iv.seq for iv in gpu] == list(range(len(gpu)))  # one run, its intervals continuous
        assert any("regrouped" in e.message for e in led.events(run.id, kind="note"))


def test_a_resumed_run_does_not_take_the_epochs_of_its_reread_log_twice(trees: Path, ledger_url: str) -> None:
    # The new agent reads the container's log again from its first line: the same epochs, dated
    # by the log's own timestamps, are the ones the ledger holds already.
    first = Node(trees, ledger_url, labelled())
    log = FollowedLog()
    first.source.follow = lambda cid: log  # type: ignore[attr-defined]
    first.tick(2)
    log.shows(1, T0 + 3, **{"train/box_loss": 1.9})
    first.tick(5)
    first.stop()  # the run stays open
    second = Node(trees, ledger_url, labelled(), t0=first.clock.t + 30, exit_at=80.0)
    again = FollowedLog()
    second.source.follow = lambda cid: again  # type: ignore[attr-defined]
    again.shows(1, T0 + 3, **{"train/box_loss": 1.9})
    again.shows(2, T0 + 40, **{"train/box_loss": 1.4})
    second.tick(8)
    second.stop()
    with Ledger(ledger_url) as led:
        [run] = led.list_runs()
        assert sorted(e.payload["epoch"] for e in led.events(run.id, kind="epoch_end")) == [1, 2]  # each once
        assert sorted((m.epoch, m.value) for m in led.metrics(run.id)) == [(1, 1.9), (2, 1.4)]
