"""The node agent's promise, as a newcomer tries it: start `gpuledger agent` next to a Docker engine,
run a labelled container that nobody wrapped, and find it in `gpuledger runs`, `show`, `cost` and
the chargeback by team — with its training epochs read from its log.

The engine is real (tests/docker_support.py); the GPU is a replayed trace whose process list names
the container's host pid, as the NVIDIA driver would.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from docker_support import IMAGE, YOLO_DATA, Engine
from e2e_helpers import GPULEDGER, cli_env, run_cli, runs_json, show_json

pytestmark = pytest.mark.slow

GPU = "GPU-d0c4e2e0-0000-4000-8000-00000000d0c4"
LABELS = {"team": "vision", "project": "defect-detection", "model_version": "yolov10s"}


def trace(path: Path, pid: int) -> Path:
    header = {"format": "gpuledger-gpu-trace", "version": 1,
              "gpus": [{"uuid": GPU, "name": "NVIDIA A100-SXM4-80GB", "profile": "ideal"}]}  # fmt: skip
    point = {"t": 0, "gpu": 0, "util_pct": 80, "mem_used_b": 9 * 2**30, "power_w": 300, "temp_c": 60,
             "procs": {str(pid): {"mem_b": 8 * 2**30, "sm_pct": 80}}}  # fmt: skip
    path.write_text(json.dumps(header) + "\n" + json.dumps(point) + "\n")
    return path


def test_a_labelled_container_nobody_wrapped_is_in_runs_show_cost_and_the_chargeback(
    engine: Engine, tmp_path: Path
) -> None:
    env = cli_env(tmp_path / "home", f"sqlite:///{tmp_path}/ledger.db")
    label_args = [a for k, v in LABELS.items() for a in ("--label", f"{k}={v}")]
    cid = engine.run(*label_args, "-v", f"{YOLO_DATA}:/data:ro", IMAGE, "sh", "-c",
                     "cat /data/yolov8n_detect.log; sleep 8")  # fmt: skip
    pid = int(engine.inspect(cid, "{{.State.Pid}}"))
    log = tmp_path / "agent.log"
    agent = subprocess.Popen(
        [*GPULEDGER, "agent", "--interval", "1", "--replay-gpus", str(trace(tmp_path / "gpu.jsonl", pid)),
         "--docker-socket", str(engine.sock), "--no-slurm", "--kubelet-socket", "none", "--metrics-port", "0"],
        env=env, stdout=subprocess.DEVNULL, stderr=log.open("wb"),
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:  # the container exits after ~8 s; the agent ends its run
            rows = runs_json(env) if (tmp_path / "ledger.db").exists() else []
            if rows and show_json(rows[0]["id"], env).get("ended_at"):
                break
            time.sleep(0.5)
        else:
            raise AssertionError(f"no ended discovered run; agent said:\n{log.read_text(errors='replace')}")
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(timeout=60)
    [run] = runs_json(env)
    assert run["status"] == "discovered"
    shown = show_json(run["id"], env)
    assert {k: shown["labels"].get(k) for k in LABELS} == LABELS
    assert shown["exit_code"] == 0 and shown["gpus"][0]["uuid"] == GPU
    assert shown["busy_gpu_hours"] > 0
    # its per-epoch losses and mAP, from the log nobody wrapped
    metrics = json.loads(run_cli(["export", run["id"], "--metrics", "--format", "jsonl"], env).stdout.splitlines()[0])
    assert metrics["epoch"] == 1 and any(k.startswith("metrics/mAP50") for k in metrics)
    cost = run_cli(["cost", run["id"]], env)
    assert cost.returncode == 0 and b"A100" in cost.stdout, cost.stderr
    month = datetime.fromtimestamp(shown["started_at_epoch"], tz=timezone.utc).strftime("%Y-%m")
    # the GPU is a replayed trace: a demo run is billed only when asked for (docs/CHARGEBACK.md)
    out = run_cli(["report", "chargeback", "--month", month, "--by", "team", "--format", "json", "--include-replayed"],
                  env)  # fmt: skip
    assert out.returncode == 0, out.stderr.decode()
    groups = {tuple(g["key"].values()) if isinstance(g.get("key"), dict) else g.get("team"): g
              for g in json.loads(out.stdout)["groups"]}  # fmt: skip
    vision = next(g for k, g in groups.items() if "vision" in (k if isinstance(k, tuple) else (k,)))
    assert vision["runs"] == 1 and float(vision["cost"]) > 0
