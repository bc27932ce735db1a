"""An unwrapped ``yolo val`` container recorded as an evaluation run (issue 37), on a real dockerd.

A real Ultralytics validation (CPU, untrained YOLOv8n weights saved from its YAML, the synthetic
dataset of tests/yolo_support.py) runs in a container nobody wrapped, the weights on a bind mount
at ``/workspace/models`` named by a path relative to the container's working directory. The
container is set up as in tests/test_agent_docker_yolo.py (busybox with this machine's Python
mounted read-only); ``gpuledger agent`` meters it with a replayed GPU trace naming its host pid.
``gpuledger show --json`` must then show an evaluation whose images, per-image ms and mAP are the
ones the container printed, its source "discovered", the weights' sha256 found through the mount,
and its window the span the log dates from the validator's banner to its ``Speed:`` line.
"""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from docker_support import IMAGE, Engine, wait_for
from e2e_helpers import GPULEDGER, cli_env, run_cli, show_json
from gpuledger.store import Ledger
from test_agent_docker_yolo import _ended_run, runtime_mounts, trace  # the agent's first ended run
from yolo_support import make_dataset, prepare_config_dir, yolo_env

pytestmark = pytest.mark.slow

VAL_IMAGES = 6
SAVE = """
    import sys
    from ultralytics import YOLO

    YOLO("yolov8n.yaml").save(sys.argv[1])
"""


def test_an_unwrapped_yolo_val_container_is_an_evaluation_run(engine: Engine, tmp_path: Path) -> None:
    data = make_dataset(tmp_path / "data", n_train=2, n_val=VAL_IMAGES)
    config = prepare_config_dir(tmp_path / "yolo-config")
    models = tmp_path / "models"
    models.mkdir()
    script = tmp_path / "save.py"
    script.write_text(textwrap.dedent(SAVE))
    env_yolo = yolo_env(config)
    subprocess.run([sys.executable, str(script), str(models / "yolov8n.pt")], env=env_yolo, check=True, timeout=600)
    go = tmp_path / "go"
    go.mkdir()
    env_args = [a for k, v in yolo_env(config, base={}).items() for a in ("-e", f"{k}={v}")]
    yolo = Path(sys.prefix) / "bin" / "yolo"
    val = (f"{yolo} val model=models/yolov8n.pt data={data} imgsz=64 batch=2 workers=0 device=cpu "
           "plots=False project=/workspace/runs name=val exist_ok=True")  # fmt: skip
    cid = engine.run(
        *runtime_mounts(), *env_args, "-v", f"{tmp_path / 'data'}:{tmp_path / 'data'}:ro",
        "-v", f"{config}:{config}", "-v", f"{go}:/go:ro", "-v", f"{models}:/workspace/models:ro",
        "-w", "/workspace", IMAGE, "sh", "-c", f"while [ ! -e /go/now ]; do sleep 0.1; done; exec {val}",
    )  # fmt: skip
    pid = int(engine.inspect(cid, "{{.State.Pid}}"))
    env = cli_env(tmp_path / "home", f"sqlite:///{tmp_path}/ledger.db")
    log = tmp_path / "agent.log"
    agent = subprocess.Popen(
        [*GPULEDGER, "agent", "--interval", "1", "--replay-gpus", str(trace(tmp_path / "gpu.jsonl", pid)),
         "--docker-socket", str(engine.sock), "--no-slurm", "--kubelet-socket", "none"],
        env=env, stdout=subprocess.DEVNULL, stderr=log.open("wb"),
    )  # fmt: skip
    try:
        wait_for(lambda: "ok  docker" in log.read_text(errors="replace"), 120, 0.2, "the agent's start report")
        (go / "now").touch()
        ended = wait_for(lambda: _ended_run(env), 600, 1.0, "the discovered run's end")
        shown = show_json(ended, env)
        assert shown["exit_code"] == 0, shown
        printed = run_cli(["logs", ended], env).stdout.decode("utf-8", "replace")
        row = next(line for line in reversed(printed.splitlines()) if line.split()[:1] == ["all"])
        speed = printed.split("Speed: ")[-1].split(" per image")[0]
        meta = shown["meta"]
        ev = meta["evaluation"]
        assert meta["kind"] == "evaluation", json.dumps(meta)[:2000]
        assert (ev["mode"], ev["source"], ev["images"]) == ("val", "discovered", VAL_IMAGES)
        assert ev["images"] == int(row.split()[1])
        assert [ev["map50"], ev["map50_95"]] == [float(x) for x in row.split()[5:7]]
        assert ev["ms_per_image"]["inference"] == float(speed.split("ms inference")[0].split(", ")[-1])
        assert (ev["imgsz"], ev["batch"], ev["device"]) == (64, 2, "cpu")
        want = hashlib.sha256((models / "yolov8n.pt").read_bytes()).hexdigest()
        assert ev["weights"]["sha256"] == want and ev["weights"]["path"] == "models/yolov8n.pt"
        # the window: from the validator's banner to its Speed line, as the daemon dated them
        with Ledger(env["GPULEDGER_DB"]) as led:
            [event] = led.events(ended, kind="evaluation")
            run = led.get_run(ended)
        t0, t1 = ev["window"]
        assert ev["window_from"] == "console" and run.started_at < t0 < t1 < (run.ended_at or 0)
        # the replayed trace's constant 250 W over it
        assert ev["power_mean_w"] is not None and abs(ev["power_mean_w"] - 250.0) < 1.0
        assert abs(ev["j_per_image"] - ev["energy_j"] / VAL_IMAGES) < 1e-6
        assert event.payload["mode"] == "val" and event.payload["source"] == "discovered"
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(timeout=60)
