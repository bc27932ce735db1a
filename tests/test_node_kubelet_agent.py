"""A pod's GPU process nobody wrapped, through the agent's real loop with the Kubernetes adapter:
the fake kubelet says which GPU the pod was allocated, the local API server names and labels the
pod, a crafted /proc puts the process in the pod's cgroup, a scripted NVML lists it on a GPU."""

from __future__ import annotations

from importlib.util import find_spec
from pathlib import Path

from ci_support import missing

if find_spec("grpc") is None:  # a dropped extra fails in CI, never skips there
    missing("the kubernetes extra (grpcio)", "pip install 'gpuledger[kubernetes]'")

from gpuledger.collect.fake_nvml import FakeGpu, FakeNvml, TracePoint
from gpuledger.collect.nvml import NvmlCollector
from gpuledger.core.model import DISCOVERED
from gpuledger.node.agent import AgentConfig, NodeAgent
from gpuledger.node.kubelet import KubeletSource
from gpuledger.node.kubelet_api import ApiConfig, ApiServerClient
from gpuledger.node.procfacts import ProcReader
from gpuledger.node.sink import LedgerSink
from gpuledger.node.sources import SourcePoller, Sources
from gpuledger.store import Ledger
from kubelet_support import GPU_A, GPU_B, NODE, ApiServer, Container, FakeKubelet, Pod
from test_agent_procfacts import make_proc

UID = "3f9a1c2e-7b4d-4e8f-9a1b-2c3d4e5f6a7b"  # ml/train-yolo-0 of the recorded pod list
CONTAINER = "4f0c9d1e2b3a4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5"
# A Guaranteed pod's container under the systemd driver, as containerd names it.
CGROUP = f"0::/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/cri-containerd-{CONTAINER}.scope"
GiB = 2**30
T0 = 1_800_000_000.0


class Clock:
    def __init__(self) -> None:
        self.t = T0

    def __call__(self) -> float:
        return self.t


def test_a_pods_process_becomes_a_labelled_run_and_its_unallocated_gpu_is_flagged(tmp_path: Path) -> None:
    sock = tmp_path / "kubelet.sock"
    kubelet = FakeKubelet(sock, [Pod("ml", "train-yolo-0", [Container("main", [("nvidia.com/gpu", [GPU_A])])])])
    kubelet.start()
    api = ApiServer(token=None)
    clock = Clock()
    make_proc(tmp_path / "proc", 300, "python", uid=0, cgroup=CGROUP, cmdline=["python", "train.py"], pgid=300,
              start=1000)  # fmt: skip
    # The pod was given GPU_A; its process runs on GPU_B.
    busy = [TracePoint(0.0, util_pct=50, mem_used_b=20 * GiB, power_w=300, temp_c=60, procs={300: (8 * GiB, 40.0)})]
    idle = [TracePoint(0.0, util_pct=0, mem_used_b=0, power_w=60, temp_c=30, procs={})]
    nvml = FakeNvml([FakeGpu(GPU_A, profile="ideal", points=idle), FakeGpu(GPU_B, profile="ideal", points=busy)],
                    clock=clock, start=clock.t)  # fmt: skip
    url = f"sqlite:///{tmp_path}/ledger.db"
    source = KubeletSource(str(sock), gpus=((0, GPU_A), (1, GPU_B)), node_name=NODE,
                           api=ApiServerClient(ApiConfig(api.url)))  # fmt: skip
    poller = SourcePoller("kubelet", lambda: source, clock=clock)
    warnings: list[str] = []
    sink = LedgerSink(url, host="node-1", boot_id="boot-A", warn=warnings.append)
    agent = NodeAgent(
        AgentConfig(host="node-1", interval_s=10.0, cgroup_root=str(tmp_path / "cgroup")),
        gpu=NvmlCollector(nvml=nvml, clock=clock, all_processes=True), procs=ProcReader(str(tmp_path / "proc")),
        sources=Sources([poller]), sink=sink, boot_id="boot-A", clock=clock, warn=warnings.append,
    )  # fmt: skip
    sink.start()
    try:
        for _ in range(8):
            clock.t += 2.0
            poller.poll_once()
            agent.tick()
        assert poller.state().status is None
    finally:
        agent.shutdown()
        assert sink.close(timeout_s=30.0), warnings
        source.close()
        api.close()
        kubelet.stop()
    with Ledger(url) as led:
        [run] = led.list_runs()
        assert run.status == DISCOVERED and run.name == "ml/train-yolo-0"
        assert run.labels == {"team": "vision", "project": "defect-detection", "model_version": "yolov10s"}
        owner = run.meta["node"]["owner"]
        assert (owner["pod_uid"], owner["pod_namespace"], owner["pod_name"], owner["pod_qos"]) == (
            UID, "ml", "train-yolo-0", "Guaranteed",
        )  # fmt: skip
        [event] = led.events(run.id, kind="unallocated_gpu")
        assert GPU_B in event.message and GPU_A in event.message
