"""An unwrapped YOLO container archived as fully as a wrapped run (issue 35), on a real dockerd.

A real Ultralytics training (3 epochs, CPU, the synthetic dataset of tests/yolo_support.py) runs in
a labelled container nobody wrapped, its run directory on a named volume mounted at
``/workspace/runs`` (what a YOLO image's ``VOLUME ["/workspace/runs"]`` gives). The container is
the busybox image of tests/docker_support.py with this machine's Python and virtualenv mounted
read-only, so no registry is needed. ``gpuledger agent --server`` meters it (the GPU is a replayed
trace naming the container's host pid, as the NVIDIA driver would) and:

* ``gpuledger logs`` shows the container's output, redacted, and the team server has the same log;
* its epochs carry every results.csv column at the precision Ultralytics wrote (validation losses
  and learning rates included, which the console never shows), ``epochs_source`` "results.csv";
* epoch 1 starts when training started, not with the container.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from docker_support import IMAGE, Engine, wait_for
from e2e_helpers import GPULEDGER, cli_env, run_cli, show_json
from gpuledger.runs.host import host_name
from gpuledger.store import Ledger, accounts
from gpuledger.store import lineage as store_lineage
from server_support import ServerProcess, bearer, enroll
from yolo_support import make_dataset, prepare_config_dir, yolo_env

pytestmark = pytest.mark.slow

GPU = "GPU-d0c4e2e0-0000-4000-8000-0000000035a1"
SECRET = "WANDB_API_KEY=0123456789abcdef0123456789abcdef01234567"
PROJECT = "defect-detection"


def runtime_mounts() -> list[str]:
    """This machine's Python, its libraries and the virtualenv, read-only at the same paths."""
    paths = ["/usr", "/lib", "/lib64", "/etc/ld.so.cache", sys.base_prefix, sys.prefix]
    keep = [p for p in dict.fromkeys(paths) if Path(p).exists()]
    keep = [p for p in keep if not any(p != q and p.startswith(q.rstrip("/") + "/") for q in keep)]
    return [a for p in keep for a in ("-v", f"{p}:{p}:ro")]


def trace(path: Path, pid: int) -> Path:
    header = {"format": "gpuledger-gpu-trace", "version": 1,
              "gpus": [{"uuid": GPU, "name": "NVIDIA A100-SXM4-80GB", "profile": "ideal"}]}  # fmt: skip
    point = {"t": 0, "gpu": 0, "util_pct": 70, "mem_used_b": 6 * 2**30, "power_w": 250, "temp_c": 55,
             "procs": {str(pid): {"mem_b": 5 * 2**30, "sm_pct": 70}}}  # fmt: skip
    path.write_text(json.dumps(header) + "\n" + json.dumps(point) + "\n")
    return path


def team_server(tmp_path: Path) -> tuple[ServerProcess, Path, str]:
    """A team server on SQLite; the agent's token (enrolled for this host) in a file, an admin's."""
    url = f"sqlite:///{tmp_path}/team.db"
    with Ledger(url) as led:
        accounts.add_project(led, PROJECT, actor="test")
        admin = accounts.issue_token(led, "root", role="admin", actor="test", create_user=True)[1]
    token_file = tmp_path / "agent.token"
    token_file.write_text(enroll(url, host_name(), projects=[PROJECT]) + "\n")
    token_file.chmod(0o600)
    return ServerProcess(url, log=tmp_path / "server.log").start(), token_file, admin


def test_an_unwrapped_yolo_container_gets_its_log_and_every_results_column(engine: Engine, tmp_path: Path) -> None:
    data = make_dataset(tmp_path / "data", n_train=8, n_val=4)
    config = prepare_config_dir(tmp_path / "yolo-config")
    go = tmp_path / "go"
    go.mkdir()
    volume = engine.docker("volume", "create", "yolo-runs-35").stdout.strip()
    env_args = [a for k, v in yolo_env(config, base={}).items() for a in ("-e", f"{k}={v}")]
    yolo = Path(sys.prefix) / "bin" / "yolo"
    train = (f"{yolo} train model=yolov8n.yaml data={data} epochs=3 imgsz=64 batch=4 workers=0 device=cpu "
             "project=/workspace/runs name=train exist_ok=True plots=False val=True seed=0")  # fmt: skip
    script = f"echo {SECRET}; while [ ! -e /go/now ]; do sleep 0.1; done; exec {train}"
    cid = engine.run(
        "--label", "team=vision", "--label", f"project={PROJECT}", *runtime_mounts(), *env_args,
        "-v", f"{tmp_path / 'data'}:{tmp_path / 'data'}:ro", "-v", f"{config}:{config}", "-v", f"{go}:/go:ro",
        "-v", f"{volume}:/workspace/runs", "-w", "/workspace", IMAGE, "sh", "-c", script,
    )  # fmt: skip
    pid = int(engine.inspect(cid, "{{.State.Pid}}"))
    server, token_file, admin = team_server(tmp_path)
    env = cli_env(tmp_path / "home", f"sqlite:///{tmp_path}/ledger.db")
    log = tmp_path / "agent.log"
    agent = subprocess.Popen(
        [*GPULEDGER, "agent", "--interval", "1", "--replay-gpus", str(trace(tmp_path / "gpu.jsonl", pid)),
         "--docker-socket", str(engine.sock), "--no-slurm", "--kubelet-socket", "none",
         "--server", server.url, "--token-file", str(token_file)],
        env=env, stdout=subprocess.DEVNULL, stderr=log.open("wb"),
    )  # fmt: skip
    try:
        wait_for(lambda: "ok  docker" in log.read_text(errors="replace"), 120, 0.2, "the agent's start report")
        (go / "now").touch()  # the training starts with the agent watching
        ended = wait_for(lambda: _ended_run(env), 600, 1.0, "the discovered run's end")
        shown = show_json(ended, env)
        assert shown["exit_code"] == 0 and shown["labels"]["team"] == "vision"
        # 1. its log, redacted, in `gpuledger logs`
        out = run_cli(["logs", ended], env)
        assert out.returncode == 0, out.stderr.decode()
        text = out.stdout
        assert b"Starting training for 3 epochs" in text and b"epochs completed in" in text, text[-3000:]
        assert b"0123456789abcdef0123456789abcdef" not in out.stdout and b"WANDB_API_KEY=" in out.stdout
        # 2. every results.csv column, exactly as written, read through the volume's mount point
        mountpoint = Path(engine.docker("volume", "inspect", "-f", "{{.Mountpoint}}", volume).stdout.strip())
        rows = list(csv.DictReader(io.StringIO((mountpoint / "train" / "results.csv").read_text())))
        assert len(rows) == 3
        with Ledger(env["GPULEDGER_DB"]) as led:
            got = {(m.epoch, m.key): m.value for m in led.metrics(ended)}
            run = led.get_run(ended)
            starts = led.events(ended, kind="epoch_start")
            ends = led.events(ended, kind="epoch_end")
        want = {(int(r["epoch"]), k.strip()): float(v) for r in rows for k, v in r.items() if k != "epoch"}
        assert got == want and any(k.startswith("lr/") for _, k in got) and any(k.startswith("val/") for _, k in got)
        assert run.meta["epochs_source"] == "results.csv" and run.meta["save_dir"] == "/workspace/runs/train"
        assert run.meta["epochs"] == 3 and run.meta["task"] == "detect"
        assert "evaluation" not in run.meta  # its epochs' validations print val lines: still a training
        # its place in its model's line: best.pt read through the volume (node/discovered_lineage.py)
        best = hashlib.sha256((mountpoint / "train" / "weights" / "best.pt").read_bytes()).hexdigest()
        assert run.meta["lineage"]["weights_sha256"] == best and run.meta["lineage"]["model_line"] == "yolov8n"
        with Ledger(env["GPULEDGER_DB"]) as led:
            assert led.read(lambda conn: store_lineage.get(conn, ended))["weights_sha256"] == best
        # 3. epoch 1 is the training's first epoch, without the setup before it
        [start] = starts
        assert start.payload["epoch"] == 1 and start.t > run.started_at
        first_end = min(e.t for e in ends if e.payload["epoch"] == 1)
        assert first_end - start.t == pytest.approx(float(rows[0]["time"]), abs=1e-3)
        # 4. the team server has the run and the same log
        headers = bearer(admin)
        served = wait_for(lambda: _served_log(server.url, ended, headers), 120, 0.5, "the log on the server")
        assert served == out.stdout
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(timeout=60)
        server.stop()


def _ended_run(env: dict[str, str]) -> str | None:
    db = Path(env["GPULEDGER_DB"].removeprefix("sqlite:///"))
    if not db.exists():
        return None
    with Ledger(env["GPULEDGER_DB"]) as led:
        runs = [r for r in led.list_runs() if r.ended_at is not None]
    return runs[0].id if runs else None


def _served_log(url: str, run_id: str, headers: dict[str, str]) -> bytes | None:
    resp = httpx.get(f"{url}/api/v1/runs/{run_id}/log", headers=headers, timeout=10)
    return resp.content if resp.status_code == 200 and re.search(rb"epochs completed in", resp.content) else None
