"""``gpuledger agent`` on the command line: what it says it can and cannot see, bad options."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from e2e_helpers import GPULEDGER, cli_env, run_cli
from gpuledger.core.model import GpuIdentity
from gpuledger.node.sources import SourceState
from gpuledger.node.startup import Seen, report
from test_agent_procfacts import make_proc

pytestmark = pytest.mark.slow


def start_and_report(args: list[str], env: dict[str, str], log: Path) -> tuple[str, int]:
    """Start the agent, wait for its start report, SIGTERM it; (its stderr, its exit code)."""
    proc = subprocess.Popen([*GPULEDGER, "agent", *args], env=env, stdout=subprocess.DEVNULL,
                            stderr=log.open("wb"))  # fmt: skip
    deadline = time.monotonic() + 60
    while "/metrics" not in log.read_text(errors="replace") and time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    time.sleep(0.5)  # a few readings
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout=60)
    return log.read_text(errors="replace"), code


def test_without_nvml_or_host_pids_it_says_so_and_keeps_running(tmp_path: Path) -> None:
    env = cli_env(tmp_path / "home", f"sqlite:///{tmp_path}/ledger.db")
    proc_root = tmp_path / "container-proc"  # a /proc with no kthreadd: a PID namespace of its own
    make_proc(proc_root, 1, "sh")
    bad_trace = tmp_path / "trace.jsonl"
    bad_trace.write_text('{"format": "gpuledger-gpu-trace", "gpus": []}\n')
    text, code = start_and_report(["--replay-gpus", str(bad_trace), "--proc-root", str(proc_root), "--no-slurm",
                                   "--docker-socket", str(tmp_path / "no-docker.sock"), "--kubelet-socket", "none"],
                                  env, tmp_path / "agent.log")  # fmt: skip
    assert code == 0, text
    assert "--  no GPU readable: replay trace" in text and "lists no GPU" in text and "(no GPU to read)" in text
    assert "--  not in the host's PID namespace" in text and "hostPID: true" in text
    assert "--  kubelet: switched off" in text and "--  slurm: switched off" in text
    assert "--  docker: " in text and "no-docker.sock" in text  # the Docker adapter's own words on it
    assert "stopped; 0 discovered run(s) left open" in text
    assert "Traceback" not in text


@pytest.mark.parametrize(("args", "message"), [
    (["--copy-labels", "team=x"], "is not a label key"),
    (["--copy-labels", " , "], "give at least one label key"),
    (["--proc-root", "/no/such/proc"], "is not a directory"),
    (["--db", "postgresql://user@[::1"], "not a database URL"),
    (["--interval", "0.1"], "0.1 is not in the range"),
])  # fmt: skip
def test_bad_options_are_one_clear_line(tmp_path: Path, args: list[str], message: str) -> None:
    out = run_cli(["agent", *args], cli_env(tmp_path / "home", f"sqlite:///{tmp_path}/ledger.db"), timeout=60)
    err = out.stderr.decode()
    assert out.returncode == 2 and message in err and "Traceback" not in err


def test_the_start_report_names_every_gap_and_its_cost() -> None:
    seen = Seen(
        gpus=[GpuIdentity(0, "GPU-a", "NVIDIA H100 80GB HBM3", driver_version="550.54.15")] * 2, gpu_note=None,
        host_pids=True, environ_others=False, uid=1000, cgroup_root="/sys/fs/cgroup", cgroup_version=2,
        sources=[SourceState("docker", "docker: no Docker socket at /var/run/docker.sock", False, None),
                 SourceState("kubelet", None, True, 1.0)],
        disabled=["slurm"], ledger="sqlite:////var/lib/gpuledger/ledger.db", server=None, metrics="127.0.0.1:9400",
    )  # fmt: skip
    assert report(Seen(**{**seen.__dict__, "gpus": [], "gpu_note": "no NVML", "gpu_retry": True}))[0] == (
        "--  no GPU readable: no NVML; nothing is metered until NVML answers (tried again every minute)"
    )
    lines = report(seen)
    assert lines[0] == "ok  GPUs: 2 (NVIDIA H100 80GB HBM3; nvml, driver 550.54.15)"
    assert any(ln.startswith("--  other users' process environments are not readable (uid 1000") for ln in lines)
    assert "ok  cgroup v2 at /sys/fs/cgroup: CPU, memory and I/O of containers, pods and Slurm steps from their " \
           "cgroups" in lines  # fmt: skip
    assert "--  docker: no Docker socket at /var/run/docker.sock" in lines and "ok  kubelet" in lines
    assert "--  slurm: switched off" in lines and "ok  /metrics on http://127.0.0.1:9400/metrics" in lines
    assert any("no --server" in ln for ln in lines)
