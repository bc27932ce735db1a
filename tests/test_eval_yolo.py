"""Real Ultralytics evaluations on the CPU, offline, recorded by ``gpuledger run`` (issue 37).

One module-scoped fixture saves untrained YOLOv8n and YOLOv8s weights (from their YAMLs) and
evaluates them on one generated split: ``yolo val`` of both sizes, ``yolo predict``, ``model.val()``
from a Python script, ``yolo benchmark`` (the PyTorch format only) and a ``yolo val`` whose
callbacks are off (read from the console). The GPU is a replayed trace (``ideal`` profile: an
energy counter without steps, utilisation sampled on a grid) at a constant power and utilisation,
so the energy and busy share over each evaluation's window are known here without gpuledger:
power × window length and the trace's utilisation. (A replayed trace starts when each run's
replay opens, a moment no record keeps, so a power that changed during the run could not be
placed exactly on the window here.)
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ci_support import need_module
from gpuledger.core.model import RunRecord
from gpuledger.store import Ledger
from yolo_support import make_dataset, prepare_config_dir, yolo_env

need_module("ultralytics", "pip install -r requirements-test.txt")

pytestmark = pytest.mark.slow

SRC = str(Path(__file__).resolve().parents[1] / "src")
GPULEDGER = [sys.executable, "-m", "gpuledger"]
TIMEOUT_S = 900
VAL_IMAGES = 16
POWER_W = 275.0
UTIL = 0.4
UUID = "GPU-0e7a1b2c-3d4e-4f50-8a6b-7c8d9e0f1a2b"
COMMON = ["imgsz=64", "batch=4", "device=cpu", "plots=False", "exist_ok=True"]


@dataclass
class Evaluated:
    root: Path
    db: str
    data: Path
    weights: dict[str, Path]
    env: dict[str, str]
    outputs: dict[str, subprocess.CompletedProcess] = field(default_factory=dict)

    def run(self, key: str) -> RunRecord:
        with Ledger(self.db) as ledger:
            for run in ledger.list_runs():
                if run.name == key:
                    return run
        raise AssertionError(f"no run {key}\n{self.tail(key)}")

    def tail(self, key: str) -> str:
        out = self.outputs.get(key)
        return "" if out is None else (out.stdout[-3000:] + out.stderr[-3000:]).decode(errors="replace")


def _write_trace(path: Path) -> None:
    header = {
        "format": "gpuledger-gpu-trace",
        "version": 1,
        "gpus": [{"uuid": UUID, "name": "NVIDIA A100-SXM4-80GB", "profile": "ideal"}],
    }
    point = {"t": 0, "gpu": UUID, "util_pct": UTIL * 100, "mem_used_b": 2 << 30, "power_w": POWER_W}
    path.write_text(json.dumps(header) + "\n" + json.dumps(point) + "\n")  # held for as long as the run lasts


def _yolo() -> str:
    found = shutil.which("yolo") or str(Path(sys.executable).parent / "yolo")
    assert os.path.exists(found), "the ultralytics 'yolo' command is not installed"
    return found


SAVE = """
    import sys
    from ultralytics import YOLO

    for name in sys.argv[2:]:
        YOLO(name + ".yaml").save(f"{sys.argv[1]}/{name}.pt")
"""

PREDICT_LOOP = """
    import sys
    from pathlib import Path
    from ultralytics import YOLO

    model = YOLO(sys.argv[1])
    for image in sorted(Path(sys.argv[2]).glob("*.jpg"))[:5]:  # one call per image, as a video loop does
        model.predict(str(image), imgsz=64, device="cpu", verbose=False)
"""

API = """
    import sys
    from ultralytics import YOLO

    YOLO(sys.argv[1]).val(data=sys.argv[2], imgsz=64, batch=4, device="cpu", plots=False, project=sys.argv[3])
"""


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory: pytest.TempPathFactory) -> Evaluated:
    root = tmp_path_factory.mktemp("yolo-eval")
    config = prepare_config_dir(root / "config")
    data = make_dataset(root / "dataset", "detect", n_train=2, n_val=VAL_IMAGES)
    db = f"sqlite:///{root}/ledger.db"
    env = yolo_env(config)
    env.update(GPULEDGER_HOME=str(root / "home"), GPULEDGER_DB=db)
    env["PYTHONPATH"] = os.pathsep.join([SRC, *filter(None, [env.get("PYTHONPATH")])])
    env.pop("CUDA_VISIBLE_DEVICES", None)
    script = root / "save.py"
    script.write_text(textwrap.dedent(SAVE))
    subprocess.run([sys.executable, str(script), str(root), "yolov8n", "yolov8s"], env=env, check=True, timeout=600)
    trace = root / "trace.jsonl"
    _write_trace(trace)
    t = Evaluated(root, db, data, {"n": root / "yolov8n.pt", "s": root / "yolov8s.pt"}, env)
    yolo = _yolo()
    project = f"project={root / 'runs'}"

    def record(key: str, *cmd: str, extra_env: dict[str, str] | None = None) -> None:
        argv = [*GPULEDGER, "run", "--name", key, "--interval", "0.5", "--replay-gpus", str(trace), "--", *cmd]
        out = subprocess.run(argv, env={**env, **(extra_env or {})}, cwd=root, capture_output=True, timeout=TIMEOUT_S)
        t.outputs[key] = out
        assert out.returncode == 0, f"{key}: exit {out.returncode}\n{t.tail(key)}"

    for size in ("n", "s"):
        record(f"val-{size}", yolo, "val", f"model={t.weights[size]}", f"data={data}", project, *COMMON)
    record("predict-n", yolo, "predict", f"model={t.weights['n']}", f"source={root / 'dataset/images/val'}",
           project, "save=False", *COMMON)  # fmt: skip
    api = root / "val_api.py"
    api.write_text(textwrap.dedent(API))
    record("api-s", sys.executable, str(api), str(t.weights["s"]), str(data), str(root / "runs"))
    loop = root / "predict_loop.py"
    loop.write_text(textwrap.dedent(PREDICT_LOOP))
    record("loop-n", sys.executable, str(loop), str(t.weights["n"]), str(root / "dataset/images/val"))
    record("benchmark-n", yolo, "benchmark", f"model={t.weights['n']}", f"data={data}", "imgsz=64", "device=cpu",
           "format=-")  # fmt: skip
    record("console-n", yolo, "val", f"model={t.weights['n']}", f"data={data}", project, *COMMON,
           extra_env={"GPULEDGER_AUTOLOAD": "0"})  # fmt: skip
    return t


def _expected_fingerprint(root: Path, images_only: bool = False) -> str:
    """The documented fingerprint, from the files on disk, with hashlib."""
    files = sorted((root / "images" / "val").glob("*.jpg"))
    if not images_only:
        files += sorted((root / "labels" / "val").glob("*.txt"))
    base = root if not images_only else root / "images" / "val"
    lines = []
    for f in files:
        content = f.read_bytes()
        lines.append(f"{f.relative_to(base).as_posix()}\t{len(content)}\t{hashlib.sha256(content).hexdigest()}\n")
    return hashlib.sha256("".join(sorted(lines)).encode()).hexdigest()


def _printed_all_row(log: str) -> list[float]:
    row = next(line for line in reversed(log.splitlines()) if line.split()[:1] == ["all"])
    return [float(x) for x in row.split()[1:7]]


@pytest.mark.parametrize("key", ["val-n", "val-s", "api-s"])
def test_val_is_recorded_as_an_evaluation(evaluated: Evaluated, key: str) -> None:
    run = evaluated.run(key)
    assert run.meta.get("kind") == "evaluation", evaluated.tail(key)
    ev = run.meta["evaluation"]
    assert ev["mode"] == "val"
    assert ev["source"] == ("python-api" if key.startswith("api") else "wrapped")
    assert ev["images"] == VAL_IMAGES
    weights = evaluated.weights[key[-1]]
    assert ev["weights"] == {"path": str(weights), "sha256": hashlib.sha256(weights.read_bytes()).hexdigest()}
    assert (ev["imgsz"], ev["batch"], ev["precision"], ev["device"]) == (64, 4, "fp32", "cpu")
    assert ev["gpu_model"] is None  # evaluated on the CPU (the replayed GPU only meters)
    assert set(ev["ms_per_image"]) == {"preprocess", "inference", "postprocess"}
    assert math.isclose(ev["fps_inference"], 1000 / ev["ms_per_image"]["inference"])
    t0, t1 = ev["window"]
    assert run.started_at < t0 < t1 < run.ended_at
    assert math.isclose(ev["fps_end_to_end"], VAL_IMAGES / (t1 - t0))
    assert ev["versions"]["ultralytics"] and ev["versions"]["torch"]
    printed = _printed_all_row(evaluated.tail(key))
    assert printed[0] == VAL_IMAGES
    assert round(ev["map50"], 3) == printed[4] and round(ev["map50_95"], 3) == printed[5]
    split = ev["split"]
    assert split["name"] == "val" and split["data"] == str(evaluated.data)
    assert split["fingerprint"] == _expected_fingerprint(evaluated.data.parent)
    assert split["files"] == 2 * VAL_IMAGES


@pytest.mark.parametrize("key", ["val-n", "val-s", "predict-n", "api-s"])
def test_energy_per_image_is_the_trace_integral_over_the_window(evaluated: Evaluated, key: str) -> None:
    run = evaluated.run(key)
    ev = run.meta["evaluation"]
    t0, t1 = ev["window"]
    expected = POWER_W * (t1 - t0)
    # The window's own energy, not the run's (which includes seconds of start-up): whole
    # intervals (0.5 s) on the wrong side of an edge would be far off.
    assert math.isclose(ev["energy_j"], expected, rel_tol=0.01), (ev["energy_j"], expected)
    assert math.isclose(ev["j_per_image"], expected / VAL_IMAGES, rel_tol=0.01)
    assert math.isclose(ev["power_mean_w"], POWER_W, rel_tol=0.01)
    assert ev["power_peak_w"] == POWER_W
    # Utilisation is sampled every 1/6 s: a window shorter than a second cannot place its busy
    # time (core/evaluation/window.py) and reads None, never a share of where the samples fell.
    if t1 - t0 < 1.0:
        assert ev["busy_share"] is None
    else:
        assert math.isclose(ev["busy_share"], UTIL, abs_tol=0.1)


def test_two_sizes_same_split_different_weights_and_speed(evaluated: Evaluated) -> None:
    n, s = (evaluated.run(k).meta["evaluation"] for k in ("val-n", "val-s"))
    assert n["split"]["fingerprint"] == s["split"]["fingerprint"]
    assert n["weights"]["sha256"] != s["weights"]["sha256"]
    assert n["ms_per_image"] != s["ms_per_image"]


def test_predict_is_recorded_with_its_source_folder(evaluated: Evaluated) -> None:
    ev = evaluated.run("predict-n").meta["evaluation"]
    assert (ev["mode"], ev["source"], ev["images"]) == ("predict", "wrapped", VAL_IMAGES)
    assert ev["split"]["name"] == "source"
    assert ev["split"]["fingerprint"] == _expected_fingerprint(evaluated.data.parent, images_only=True)
    assert (ev["imgsz"], ev["batch"], ev["precision"], ev["map50"]) == (64, 4, "fp32", None)  # imgsz as val writes it
    assert math.isclose(ev["fps_inference"], 1000 / ev["ms_per_image"]["inference"])


def test_predict_calls_of_one_model_add_up_to_one_evaluation(evaluated: Evaluated) -> None:
    run = evaluated.run("loop-n")
    ev = run.meta["evaluation"]
    assert (ev["mode"], ev["source"], ev["images"]) == ("predict", "python-api", 5)
    assert run.started_at < ev["window"][0] < ev["window"][1] < run.ended_at
    with Ledger(evaluated.db) as ledger:
        events = ledger.events(run.id, "evaluation")
        phases = [e.message for e in ledger.events(run.id, "phase")]
    assert len(events) == 1 and events[0].payload["images"] == 5  # one event, sent at exit
    assert ev["split"] is None  # single images: not their folder's 16
    assert phases == ["evaluation"]  # the first call's start only


def test_benchmark_table_is_recorded(evaluated: Evaluated) -> None:
    run = evaluated.run("benchmark-n")
    ev = run.meta["evaluation"]
    assert (ev["mode"], ev["source"], ev["imgsz"]) == ("benchmark", "wrapped", 64)
    assert [r["format"] for r in ev["benchmark"]] == ["PyTorch"]
    row = ev["benchmark"][0]
    assert row["status"] == "success" and row["metric_name"] == "metrics/mAP50-95(B)"
    assert row["fps"] > 0 and row["ms_per_image"] > 0
    assert ev["split"]["fingerprint"] == _expected_fingerprint(evaluated.data.parent)
    # The validation and prediction benchmark() runs per format are not evaluations of their own
    with Ledger(evaluated.db) as ledger:
        assert [e.payload["mode"] for e in ledger.events(run.id, "evaluation")] == ["benchmark"]


def test_without_callbacks_the_console_is_read(evaluated: Evaluated) -> None:
    ev = evaluated.run("console-n").meta["evaluation"]
    assert (ev["mode"], ev["source"], ev["images"]) == ("val", "console", VAL_IMAGES)
    assert ev["split"]["fingerprint"] == _expected_fingerprint(evaluated.data.parent)
    speed = evaluated.tail("console-n").split("Speed: ")[-1].split("ms inference")[0].split(", ")[-1]
    assert ev["ms_per_image"]["inference"] == float(speed)
    assert ev["energy_j"] is not None  # over the whole run: the window is not printed


def test_show_prints_the_evaluation_block(evaluated: Evaluated) -> None:
    run = evaluated.run("val-s")
    out = subprocess.run(
        [*GPULEDGER, "show", run.id], env=evaluated.env, capture_output=True, text=True, timeout=120, check=True
    ).stdout
    ev = run.meta["evaluation"]
    assert "Evaluation (val, wrapped)" in out
    assert f"fingerprint {ev['split']['fingerprint'][:12]}" in out
    assert f"sha256 {ev['weights']['sha256'][:12]}" in out
    assert "J/image" in out and f"{VAL_IMAGES} in " in out
