"""``gpuledger agent --kubelet-socket PATH``: the agent opens the Kubernetes adapter and its start
report says what it sees (a fake kubelet in this process, the agent in a real child process)."""

from __future__ import annotations

from importlib.util import find_spec
from pathlib import Path

import pytest

from ci_support import missing

if find_spec("grpc") is None:  # a dropped extra fails in CI, never skips there
    missing("the kubernetes extra (grpcio)", "pip install 'gpuledger[kubernetes]'")

from e2e_helpers import cli_env
from kubelet_support import GPU_A, NODE, ApiServer, Container, FakeKubelet, Pod, env_without_cluster
from test_agent_cli import start_and_report
from test_agent_procfacts import make_proc

pytestmark = pytest.mark.slow


def agent_args(tmp_path: Path, kubelet_socket: Path) -> list[str]:
    proc_root = tmp_path / "proc"
    make_proc(proc_root, 1, "sh")
    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"format": "gpuledger-gpu-trace", "gpus": []}\n')
    return ["--replay-gpus", str(trace), "--proc-root", str(proc_root), "--no-slurm", "--docker-socket", "none",
            "--kubelet-socket", str(kubelet_socket), "--metrics-port", "0"]  # fmt: skip


def test_the_start_report_says_the_kubelet_is_seen(tmp_path: Path) -> None:
    sock = tmp_path / "kubelet.sock"
    kubelet = FakeKubelet(sock, [Pod("ml", "train-yolo-0", [Container("main", [("nvidia.com/gpu", [GPU_A])])])])
    kubelet.start()
    api = ApiServer(token=None)
    try:
        home_env = cli_env(tmp_path / "home", f"sqlite:///{tmp_path}/ledger.db")
        env = env_without_cluster(home_env, GPULEDGER_KUBE_API=api.url, NODE_NAME=NODE)
        text, code = start_and_report(agent_args(tmp_path, sock), env, tmp_path / "agent.log")
    finally:
        api.close()
        kubelet.stop()
    assert code == 0, text
    assert "ok  kubelet" in text
    assert "List" in kubelet.calls and api.requests  # it asked both
    assert "Traceback" not in text


def test_the_start_report_says_when_there_is_no_kubelet(tmp_path: Path) -> None:
    env = env_without_cluster(cli_env(tmp_path / "home", f"sqlite:///{tmp_path}/ledger.db"))
    missing = tmp_path / "pod-resources" / "kubelet.sock"
    text, code = start_and_report(agent_args(tmp_path, missing), env, tmp_path / "agent.log")
    assert code == 0, text
    assert f"--  kubelet: cannot see which pod holds which GPU: no pod-resources socket at {missing}" in text
    assert "Traceback" not in text
