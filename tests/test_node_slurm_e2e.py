"""``gpuledger agent`` on a Slurm node, end to end: the real agent, the real prolog, a real process.

The job's prolog writes its files; ``scontrol`` (a fake on PATH, tests/slurm_support.py) lists the
process as the job's; the GPU is a replayed trace naming the process's pid. The process's cgroup
here names no Slurm job, as Slurm 26.05 may leave it, so only ``listpids`` ties it to its job.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from e2e_helpers import GPULEDGER, cli_env
from gpuledger.store import Ledger
from slurm_support import FakeSlurm, listpids

pytestmark = pytest.mark.slow

GiB = 2**30
GPU0 = "GPU-5a0e2e00-0000-4000-8000-000000000000"
GPU1 = "GPU-5a0e2e00-0000-4000-8000-000000000001"
PROLOG = Path(__file__).parent.parent / "deploy" / "slurm" / "gpuledger-prolog.sh"


def trace(path: Path, pid: int, gpu: int) -> Path:
    header = {"format": "gpuledger-gpu-trace", "version": 1,
              "gpus": [{"uuid": GPU0, "name": "NVIDIA A100-SXM4-80GB", "profile": "ideal"},
                       {"uuid": GPU1, "name": "NVIDIA A100-SXM4-80GB", "profile": "ideal"}]}  # fmt: skip
    point = {"t": 0, "gpu": gpu, "util_pct": 80, "mem_used_b": 8 * GiB, "power_w": 300, "temp_c": 50,
             "procs": {str(pid): {"mem_b": 6 * GiB, "sm_pct": 70.0}}}  # fmt: skip
    path.write_text(json.dumps(header) + "\n" + json.dumps(point) + "\n")
    return path


def discovered(url: str) -> list:  # type: ignore[type-arg]
    with Ledger(url) as led:
        return [(r, led.events(r.id)) for r in led.list_runs() if r.status == "discovered"]


def wait_for(what: str, check, timeout: float = 60.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.parametrize(("gpu", "allocated"), [(1, True), (0, False)])
def test_a_slurm_jobs_unwrapped_process_is_discovered_as_the_job(tmp_path: Path, gpu: int, allocated: bool) -> None:
    slurm = FakeSlurm(tmp_path)
    dirs = {"GPULEDGER_GPUSTAT_DIR": str(tmp_path / "gpustat"), "GPULEDGER_SLURM_JOB_DIR": str(tmp_path / "jobs")}
    prolog = subprocess.run(
        ["bash", str(PROLOG)], capture_output=True, text=True, check=False,
        env={**dirs, "SLURM_JOB_ID": "4242", "SLURM_JOB_UID": "1001", "SLURM_JOB_USER": "alice",
             "SLURM_JOB_ACCOUNT": "vision", "SLURM_JOB_PARTITION": "gpu", "CUDA_VISIBLE_DEVICES": "1",
             "SLURM_JOB_COMMENT": "team=vision,project=defect-detection,model_version=yolov10s"},
    )  # fmt: skip
    assert prolog.returncode == 0, prolog.stderr
    ledger = f"sqlite:///{tmp_path}/ledger.db"
    env = cli_env(tmp_path / "home", ledger, PATH=slurm.env()["PATH"] + ":" + str(Path(sys.executable).parent),
                  GPULEDGER_SLURM_NODE="gpu07", **dirs)  # fmt: skip
    trainer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    log = tmp_path / "agent.log"
    agent = None
    try:
        slurm.answer("listpids.out", listpids([(trainer.pid, "4242", "0")]))
        gpus = trace(tmp_path / "t.jsonl", trainer.pid, gpu)
        agent = subprocess.Popen(
            [*GPULEDGER, "agent", "--interval", "1", "--replay-gpus", str(gpus), "--docker-socket", "none",
             "--kubelet-socket", "none"],
            env=env, stdout=subprocess.DEVNULL, stderr=log.open("wb"),
        )  # fmt: skip
        [(run, events)] = wait_for("a discovered run", lambda: discovered(ledger))
        assert "ok  slurm" in log.read_text(errors="replace")
        assert run.user == "alice"
        assert {k: run.labels.get(k) for k in ("team", "project", "model_version")} == {
            "team": "vision", "project": "defect-detection", "model_version": "yolov10s"}  # fmt: skip
        owner = run.meta["node"]["owner"]
        assert (owner["slurm_job"], owner["slurm_step"], owner["slurm_from"]) == ("4242", "0", "claim")
        assert owner["slurm_account"] == "vision"
        if not allocated:  # the job was given GPU 1; its process is on GPU 0
            [(run, events)] = wait_for("the unallocated_gpu event", lambda: [
                (r, e) for r, e in discovered(ledger) if any(ev.kind == "unallocated_gpu" for ev in e)])  # fmt: skip
        assert any(ev.kind == "unallocated_gpu" for ev in events) is not allocated
        assert slurm.calls() == ["listpids"] * len(slurm.calls())  # the prolog's files: no RPC at all
    finally:
        if agent is not None:
            agent.send_signal(signal.SIGTERM)
            assert agent.wait(timeout=60) == 0, log.read_text(errors="replace")
        trainer.kill()
        trainer.wait()
