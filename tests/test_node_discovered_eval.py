"""A discovered container's evaluation read from its captured console (node/discovered_eval.py),
and a discovered training's lineage from the files on its mounts (node/discovered_lineage.py).

The consoles are real Ultralytics 8.4.190 output (tests/data/yolo); the container's mounts are
directories of this test; the GPU intervals are what a replayed trace of constant power gives.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from gpuledger.core.model import GpuIdentity, GpuInterval
from gpuledger.node.container_mounts import ContainerFs, Mount
from gpuledger.node.discovered_eval import evaluation
from gpuledger.node.discovered_lineage import training_lineage
from gpuledger.node.docker_logs import STDOUT, ContainerLog, Message

DATA = Path(__file__).parent / "data" / "yolo"
GPU = GpuIdentity(uuid="GPU-1", index=0, name="NVIDIA A100-SXM4-80GB")
ROW = "                   all          6          8      0.512      0.388      0.431      0.217"


def intervals(t0: float, t1: float, watts: float = 200.0, step: float = 1.0) -> list[GpuInterval]:
    out, t, seq = [], t0, 0
    while t < t1:
        end = min(t1, t + step)
        out.append(GpuInterval("GPU-1", seq, t, end, samples=1, busy_s=0.5 * (end - t), energy_j=watts * (end - t),
                               power_max_w=watts + 10))  # fmt: skip
        t, seq = end, seq + 1
    return out


def val_log() -> bytes:
    lines = (DATA / "val_yolov8n_8.4.190.log").read_text().splitlines()
    return "\n".join(ROW if line.split()[:1] == ["all"] else line for line in lines).encode() + b"\n"


@pytest.fixture
def fs(tmp_path: Path) -> ContainerFs:
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "n.pt").write_bytes(b"weights of yolov8n")
    return ContainerFs((Mount(str(tmp_path / "models"), "/workspace/models"),), "/workspace")


def test_a_yolo_val_in_a_container_is_an_evaluation(fs: ContainerFs, tmp_path: Path) -> None:
    command = ["sh", "-c", "exec /venv/bin/yolo val model=models/n.pt data=/data/d.yaml imgsz=64 batch=2 half=True"]
    got = evaluation(val_log(), truncated=False, command=command, fs=fs, span=(100.0, 120.0),
                     intervals=intervals(102.0, 118.0), devices=[GPU])  # fmt: skip
    assert got is not None
    assert (got["mode"], got["source"], got["images"]) == ("val", "discovered", 6)
    assert got["ms_per_image"] == {"preprocess": 0.0, "inference": 48.2, "postprocess": 0.1}
    assert (got["map50"], got["map50_95"]) == (0.431, 0.217)
    assert (got["imgsz"], got["batch"], got["precision"], got["gpu_model"]) == (64, 2, "half", GPU.name)
    # the weights the container named, found through its mount and hashed
    assert got["weights"] == {"path": "models/n.pt", "host_path": str(tmp_path / "models" / "n.pt"),
                              "sha256": hashlib.sha256(b"weights of yolov8n").hexdigest()}  # fmt: skip
    assert got["split"]["data"] == "/data/d.yaml" and got["split"]["fingerprint"] is None
    # the window: the container's span, as far as the agent metered it
    assert got["window"] == [102.0, 118.0]
    assert got["energy_j"] == pytest.approx(200.0 * 16)
    assert got["j_per_image"] == pytest.approx(200.0 * 16 / 6)
    assert got["power_mean_w"] == pytest.approx(200.0) and got["power_peak_w"] == 210.0
    assert got["busy_share"] == pytest.approx(0.5)
    assert got["fps_end_to_end"] == pytest.approx(6 / 16)


def test_weights_behind_a_link_or_off_the_mounts_are_not_hashed(fs: ContainerFs, tmp_path: Path) -> None:
    (tmp_path / "secret.pt").write_bytes(b"a host file")
    (tmp_path / "models" / "link.pt").symlink_to(tmp_path / "secret.pt")
    for model, host in (("models/link.pt", str(tmp_path / "models" / "link.pt")), ("/elsewhere/n.pt", None)):
        got = evaluation(val_log(), truncated=False, command=["yolo", "val", f"model={model}"], fs=fs,
                         span=(0.0, 10.0), intervals=intervals(0.0, 10.0), devices=[GPU])  # fmt: skip
        assert got is not None and got["weights"] == {"path": model, "host_path": host, "sha256": None}


def test_a_script_is_read_from_its_output(fs: ContainerFs) -> None:
    predict = (DATA / "predict_yolov8n_8.4.190.log").read_bytes()
    got = evaluation(predict, truncated=False, command=["python", "infer.py"], fs=fs, span=(0.0, 4.0),
                     intervals=intervals(0.0, 4.0), devices=[GPU])  # fmt: skip
    assert got is not None
    assert (got["mode"], got["images"], got["batch"], got["imgsz"]) == ("predict", 6, 1, 64)
    assert got["ms_per_image"]["inference"] == 9.1 and got["weights"] is None
    # a log that lost its middle has lost image lines: the count is unknown, not short
    cut = evaluation(predict, truncated=True, command=["python", "infer.py"], fs=fs, span=(0.0, 4.0),
                     intervals=intervals(0.0, 4.0), devices=[GPU])  # fmt: skip
    assert cut is not None and cut["images"] is None and cut["j_per_image"] is None
    val = evaluation(val_log(), truncated=False, command=["python", "check.py"], fs=fs, span=(0.0, 4.0),
                     intervals=intervals(0.0, 4.0), devices=[GPU])  # fmt: skip
    assert val is not None and (val["mode"], val["map50"]) == ("val", 0.431)


def test_a_benchmark_table_is_kept(fs: ContainerFs) -> None:
    log = (DATA / "benchmark_8.4.190_cpu.log").read_bytes()
    got = evaluation(log, truncated=False, command=["yolo", "benchmark", "model=models/n.pt", "imgsz=64"], fs=fs,
                     span=(0.0, 30.0), intervals=intervals(0.0, 30.0), devices=[GPU])  # fmt: skip
    assert got is not None and got["mode"] == "benchmark" and got["source"] == "discovered"
    assert got["benchmark"][0]["format"] == "PyTorch" and got["benchmark"][0]["ms_per_image"] is not None


def test_energy_is_unknown_when_the_intervals_do_not_cover_the_window(fs: ContainerFs) -> None:
    partial = [iv for iv in intervals(0.0, 20.0) if not 5.0 <= iv.t0 < 10.0]  # older intervals dropped
    got = evaluation(val_log(), truncated=False, command=["yolo", "val"], fs=fs, span=(0.0, 20.0),
                     intervals=partial, devices=[GPU])  # fmt: skip
    assert got is not None and got["energy_j"] is None and got["j_per_image"] is None


def test_other_output_is_not_an_evaluation(fs: ContainerFs) -> None:
    got = evaluation(b"hello\nSpeedy output\n", truncated=False, command=["python", "serve.py"], fs=fs,
                     span=(0.0, 1.0), intervals=[], devices=[GPU])  # fmt: skip
    assert got is None


# -- a discovered training's lineage (node/discovered_lineage.py) -------------------------------


def _training_meta(source: str, kind: str) -> dict:
    return {"framework": "ultralytics", "save_dir": "/workspace/runs/train", "epochs": 3,
            "model": {"source": source, "kind": kind, "name": "yolov8n"}}  # fmt: skip


def test_a_discovered_training_from_weights_on_a_mount_is_a_child(tmp_path: Path) -> None:
    runs = tmp_path / "runs" / "train" / "weights"
    runs.mkdir(parents=True)
    (runs / "best.pt").write_bytes(b"fine-tuned")
    (tmp_path / "parent.pt").write_bytes(b"v1 best")
    fs = ContainerFs((Mount(str(tmp_path / "runs"), "/workspace/runs"), Mount(str(tmp_path), "/in")), "/workspace")
    got = training_lineage(_training_meta("/in/parent.pt", "weights"), {"model_version": "v2"}, fs)
    assert got == {
        "model_line": None,  # the parent's, found by the ledger
        "model_version": "v2",
        "weights_sha256": hashlib.sha256(b"fine-tuned").hexdigest(),
        "source_weights": {"path": "/in/parent.pt", "sha256": hashlib.sha256(b"v1 best").hexdigest()},
        "parent_run": None,
    }
    root = training_lineage(_training_meta("yolov8n.yaml", "yaml"), {}, fs)
    assert root is not None and root["source_weights"] is None and root["model_line"] == "yolov8n"
    # best.pt behind a link, or the run directory on no mount: no lineage rather than a guess
    (runs / "best.pt").unlink()
    (runs / "best.pt").symlink_to(tmp_path / "parent.pt")
    assert training_lineage(_training_meta("/in/parent.pt", "weights"), {}, fs) is None
    off = ContainerFs((Mount(str(tmp_path), "/in"),), "/workspace")
    assert training_lineage(_training_meta("/in/parent.pt", "weights"), {}, off) is None


# -- the window the console shows (node/eval_console.py, fed by node/docker_logs.py) ------------


@pytest.mark.parametrize(
    "name", ["val_yolov8n_8.4.190.log", "predict_yolov8n_8.4.190.log", "benchmark_8.4.190_cpu.log"]
)
def test_the_log_dates_the_evaluation_from_its_banner_to_its_summary(name: str) -> None:
    lines = (DATA / name).read_bytes().splitlines(keepends=True)
    log = ContainerLog("c" * 64)
    noise = [Message(STDOUT, 900 * 10**9, b"pip: installing requirements\n")]  # a script's setup before it
    log.add(noise + [Message(STDOUT, (1000 + i) * 10**9, line) for i, line in enumerate(lines)])
    log.finish()
    text = [line.decode("utf-8", "replace") for line in lines]
    banner = next(i for i, line in enumerate(text) if line.startswith("Ultralytics "))
    summary = max(i for i, line in enumerate(text) if line.startswith(("Speed: ", "Benchmarks complete for ")))
    assert log.view().evaluation.span() == (1000.0 + banner, 1000.0 + summary)
