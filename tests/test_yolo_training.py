"""Real Ultralytics trainings on the CPU, offline, on a generated dataset, archived by gpuledger.

One module-scoped fixture trains four times (about a minute and a half on 2 cores) and every test
reads what was archived:

- ``cli``: ``gpuledger run --replay-gpus TRACE -- yolo train ...`` (zero-code capture, GPU figures
  from a replayed trace so per-epoch GPU sums are checked too);
- ``interrupted`` + ``resumed``: ``gpuledger run -- python train.py`` stopped after epoch 2 of 3,
  then ``gpuledger run -- yolo train resume model=.../last.pt``;
- ``api`` and ``own``: the Python API in one process: ``gpuledger.track()`` + ``attach(model)``,
  then ``attach(model)`` alone (the training becomes a run of its own).
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ci_support import need_module
from gpuledger.core.model import RunRecord
from gpuledger.importers.ultralytics import import_run_dir
from gpuledger.reports.run import epochs as epoch_report
from gpuledger.runs.attempts import attempt_chain
from gpuledger.store import Ledger
from yolo_support import make_dataset, prepare_config_dir, yolo_env

need_module("ultralytics", "pip install -r requirements-test.txt")

pytestmark = pytest.mark.slow

SRC = str(Path(__file__).resolve().parents[1] / "src")
TRACE = str(Path(SRC) / "gpuledger" / "collect" / "traces" / "a100x2-example.jsonl")
GPULEDGER = [sys.executable, "-m", "gpuledger"]
TIMEOUT_S = 900
COMMON = ["imgsz=64", "batch=4", "workers=0", "device=cpu", "plots=False", "exist_ok=True", "seed=0"]
TRAIN_ARGS = "dict(imgsz=64, batch=4, workers=0, device='cpu', plots=False, exist_ok=True, seed=0)"


def sha256_of(path) -> str:  # type: ignore[no-untyped-def]
    """Computed here with hashlib, independently of the code under test, over the whole file."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@dataclass
class Trained:
    root: Path
    db: str
    project: Path
    data: Path
    env: dict[str, str]
    outputs: dict[str, subprocess.CompletedProcess] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)

    def ledger(self) -> Ledger:
        return Ledger(self.db)

    def run(self, name: str) -> RunRecord:
        """The run that trained into project/name (newest first)."""
        save_dir = str(self.project / name)
        with self.ledger() as ledger:
            for run in ledger.list_runs():
                if run.meta.get("save_dir") == save_dir and run.status != "imported":
                    return run
        out = self.outputs.get(name)
        detail = ""
        if out is not None:
            detail = out.stdout.decode(errors="replace")[-3000:] + out.stderr.decode(errors="replace")[-3000:]
        raise AssertionError(f"no run recorded for {save_dir}\n{detail}")

    def results(self, name: str) -> list[dict[str, str]]:
        with open(self.project / name / "results.csv", newline="") as fh:
            return list(csv.DictReader(fh))


def _yolo() -> str:
    found = shutil.which("yolo") or str(Path(sys.executable).parent / "yolo")
    assert os.path.exists(found), "the ultralytics 'yolo' command is not installed"
    return found


def _timed(trained: Trained, key: str, argv: list[str], expect: int = 0) -> None:
    start = time.monotonic()
    out = subprocess.run(argv, env=trained.env, cwd=trained.root, capture_output=True, timeout=TIMEOUT_S)
    trained.seconds[key] = time.monotonic() - start
    trained.outputs[key] = out
    assert out.returncode == expect, (
        f"{key}: exit {out.returncode}\n{out.stdout.decode(errors='replace')[-4000:]}\n"
        f"{out.stderr.decode(errors='replace')[-4000:]}"
    )


INTERRUPTED = """
    import sys
    from ultralytics import YOLO

    def stop_after_epoch_2(trainer):  # a crash after epoch 2 of 3; last.pt holds epoch 2
        if trainer.epoch == 1:
            raise SystemExit(3)

    model = YOLO("yolov8n.yaml")
    model.add_callback("on_fit_epoch_end", stop_after_epoch_2)
    model.train(data=sys.argv[1], project=sys.argv[2], name="interrupted", epochs=3, **TRAIN_ARGS)
"""

API = """
    import sys
    import gpuledger
    from ultralytics import YOLO
    from gpuledger.integrations.ultralytics import attach

    data, project, db = sys.argv[1:4]
    args = TRAIN_ARGS
    with gpuledger.track(name="api", db=db, interval=1.0, project="vision") as run:
        attach(YOLO("yolov8n.yaml")).train(data=data, project=project, name="api", epochs=2, **args)
    model = attach(YOLO("yolov8n.yaml"), name="own", db=db, interval=1.0)
    model.train(data=data, project=project, name="own", epochs=2, **args)
    print("api run", run.id)
"""


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Trained:
    root = tmp_path_factory.mktemp("yolo")
    config = prepare_config_dir(root / "config")
    data = make_dataset(root / "dataset", "detect")
    db = f"sqlite:///{root}/ledger.db"
    env = yolo_env(config)
    env.update(GPULEDGER_HOME=str(root / "home"), GPULEDGER_DB=db)
    env["PYTHONPATH"] = os.pathsep.join([SRC, *filter(None, [env.get("PYTHONPATH")])])
    env.pop("CUDA_VISIBLE_DEVICES", None)
    t = Trained(root, db, root / "runs", data, env)
    project = f"project={t.project}"
    yolo = _yolo()

    _timed(
        t,
        "cli",
        [
            *GPULEDGER,
            "run",
            "--interval",
            "1",
            "--replay-gpus",
            TRACE,
            "--",
            yolo,
            "train",
            "model=yolov8n.yaml",
            f"data={data}",
            "epochs=2",
            project,
            "name=cli",
            *COMMON,
        ],
    )
    script = root / "train_interrupted.py"
    script.write_text(textwrap.dedent(INTERRUPTED).replace("TRAIN_ARGS", TRAIN_ARGS))
    _timed(
        t,
        "interrupted",
        [*GPULEDGER, "run", "--interval", "1", "--", sys.executable, str(script), str(data), str(t.project)],
        expect=3,
    )
    last = t.project / "interrupted" / "weights" / "last.pt"
    _timed(t, "resumed", [*GPULEDGER, "run", "--interval", "1", "--", yolo, "train", "resume", f"model={last}"])
    script = root / "train_api.py"
    script.write_text(textwrap.dedent(API).replace("TRAIN_ARGS", TRAIN_ARGS))
    _timed(t, "api", [sys.executable, str(script), str(data), str(t.project), db])
    print("YOLO training timings (s):", json.dumps({k: round(v, 1) for k, v in t.seconds.items()}))
    return t


def _live_by_epoch(ledger: Ledger, run: RunRecord) -> dict[int, dict[str, float]]:
    return epoch_report.metrics_by_epoch(ledger.metrics(run.id))


def _csv_by_epoch(rows: list[dict[str, str]]) -> dict[int, dict[str, float]]:
    return {int(r["epoch"]): {k: float(v) for k, v in r.items() if k != "epoch"} for r in rows}


def _same(a: dict[int, dict[str, float]], b: dict[int, dict[str, float]]) -> bool:
    if a.keys() != b.keys() or any(a[e].keys() != b[e].keys() for e in a):
        return False
    return all(
        x == y or (math.isnan(x) and math.isnan(y))
        for e in a
        for x, y in zip([a[e][k] for k in sorted(a[e])], [b[e][k] for k in sorted(b[e])], strict=True)
    )


@pytest.mark.parametrize("name", ["cli", "api", "own"])
def test_archived_epoch_metrics_equal_results_csv(trained: Trained, name: str) -> None:
    run = trained.run(name)
    with trained.ledger() as ledger:
        live = _live_by_epoch(ledger, run)
    expected = _csv_by_epoch(trained.results(name))
    assert list(expected) == [1, 2]
    assert _same(live, expected), (live, expected)


def test_no_phantom_epoch_from_the_final_validation(trained: Trained) -> None:
    run = trained.run("cli")
    with trained.ledger() as ledger:
        ends = [e.payload["epoch"] for e in ledger.events(run.id, kind="epoch_end")]
        phases = [e.payload["name"] for e in ledger.events(run.id, kind="phase")]
    assert ends == [1, 2]
    assert phases == ["final validation", "after training"]
    assert run.meta["result"]["final_validation"]  # kept as the result, not as epoch 3


def _sum(rows: list[dict], key: str) -> float:
    return sum(r[key] for r in rows if r[key] is not None)


@pytest.mark.parametrize("name", ["cli", "api"])
def test_per_epoch_resources_add_up_to_the_run_totals(trained: Trained, name: str) -> None:
    run = trained.run(name)
    with trained.ledger() as ledger:
        rows = epoch_report.epoch_table(ledger, run)
        host = ledger.host_totals(run.id)
        gpus = ledger.gpu_totals(run.id)
    epochs = [r for r in rows if r["phase"] == "epoch"]
    assert [r["epoch"] for r in epochs] == [1, 2]
    assert rows[0]["phase"] == "setup" and "final validation" in {r["phase"] for r in rows}
    assert math.isclose(_sum(rows, "cpu_s"), host["cpu_s"], rel_tol=1e-9, abs_tol=1e-6)
    assert math.isclose(_sum(rows, "wall_s"), run.ended_at - run.started_at, rel_tol=1e-9)
    for r in epochs:
        assert r["images"] == 8 and r["images_per_s"] > 0 and r["wall_s"] > 0
        assert r["cpu_s"] > 0 and r["rss_peak_b"] > 0
    if name == "cli":  # cut at every boundary by the recorder: exact; GPUs replayed
        assert all(r["exact"] for r in rows)
        busy = sum(t["busy_s"] for t in gpus.values())
        energy = sum(t["energy_j"] for t in gpus.values())
        assert busy > 0 and energy > 0
        assert math.isclose(_sum(rows, "gpu_busy_s"), busy, rel_tol=1e-9)
        assert math.isclose(_sum(rows, "gpu_energy_j"), energy, rel_tol=1e-9)
        assert all(r["gpu_mem_peak_b"] for r in epochs)


def test_run_metadata(trained: Trained) -> None:
    import ultralytics

    run = trained.run("cli")
    meta = run.meta
    assert run.labels["model"] == "yolov8n" and run.labels["dataset"] == "dataset"
    assert meta["task"] == "detect" and meta["imgsz"] == 64 and meta["batch"] == 4 and meta["epochs"] == 2
    assert meta["device"] == "cpu" and meta["save_dir"] == str(trained.project / "cli")
    assert meta["hyperparameters"]["epochs"] == 2 and meta["args_yaml"]["model"] == "yolov8n.yaml"
    assert meta["model"]["kind"] == "yaml" and meta["model"]["parameters"] > 1_000_000
    dataset = meta["dataset"]
    assert dataset["sha256"] == sha256_of(trained.data) and dataset["classes"] == ["square", "disc"]
    assert dataset["images"] == {"train": 8, "val": 4, "test": None}
    assert meta["versions"]["ultralytics"] == ultralytics.__version__
    result = meta["result"]
    assert result["best_epoch"] in (1, 2) and result["best_map50_95"] is not None
    assert set(result["speed_ms_per_image"]) >= {"preprocess", "inference", "postprocess"}
    weights = {w["name"]: w for w in meta["weights"]}
    assert set(weights) == {"best.pt", "last.pt"}
    best = trained.project / "cli" / "weights" / "best.pt"
    assert weights["best.pt"]["sha256"] == sha256_of(best) and weights["best.pt"]["size_b"] == best.stat().st_size


def test_resumed_run_is_chained_to_its_first_attempt(trained: Trained) -> None:
    with trained.ledger() as ledger:
        runs = [r for r in ledger.list_runs() if r.meta.get("save_dir") == str(trained.project / "interrupted")]
        assert len(runs) == 2, [(r.id, r.status) for r in runs]
        second = max(runs, key=lambda r: r.started_at)
        first = min(runs, key=lambda r: r.started_at)
        assert first.status == "failed" and second.status == "succeeded"
        assert second.attempt_of == first.id
        assert {m.epoch for m in ledger.metrics(first.id)} == {1, 2}
        assert {m.epoch for m in ledger.metrics(second.id)} == {3}
        chain = attempt_chain(ledger, first.id)
        assert [a["id"] for a in chain["attempts"]] == [first.id, second.id] and chain["position"] == 0
        assert chain["totals"]["epochs"] == 3 and chain["totals"]["attempts"] == 2
        both = {**_live_by_epoch(ledger, first), **_live_by_epoch(ledger, second)}
        assert attempt_chain(ledger, second.id)["position"] == 1
    assert _same(both, _csv_by_epoch(trained.results("interrupted")))


def test_import_of_the_same_directory_yields_the_same_metrics(trained: Trained) -> None:
    live_run = trained.run("cli")
    with trained.ledger() as ledger:
        first = import_run_dir(ledger, trained.project / "cli")
        again = import_run_dir(ledger, trained.project / "cli")
        imported = ledger.get_run(first.run_id)
        assert first.created and not again.created and first.run_id == again.run_id
        assert first.also_recorded_as == live_run.id
        assert imported.status == "imported"
        assert _live_by_epoch(ledger, imported) == _live_by_epoch(ledger, live_run)
        assert len(ledger.metrics(imported.id)) == len(ledger.metrics(live_run.id))
        assert not ledger.host_intervals(imported.id) and not ledger.gpu_intervals(imported.id)
    assert imported.labels == {"model": "yolov8n", "dataset": "dataset"}
    assert imported.meta["dataset"]["sha256"] == live_run.meta["dataset"]["sha256"]
    assert imported.meta["result"]["best_epoch"] == live_run.meta["result"]["best_epoch"]


def test_epoch_table_text_and_export(trained: Trained, tmp_path: Path) -> None:
    run = trained.run("cli")
    with trained.ledger() as ledger:
        rows = epoch_report.epoch_table(ledger, run)
    text = epoch_report.format_epoch_table(rows)
    print(text)
    lines = text.splitlines()
    assert lines[0].split()[:4] == ["epoch", "wall", "s", "img/s"] and "GPU busy s" in lines[0]
    assert any(line.startswith("1 ") for line in lines) and lines[-1].startswith("total")
    columns, flat = epoch_report.export_rows(run.id, rows)
    assert "metrics/mAP50-95(B)" in columns and "lr/pg0" in columns and "gpu_busy_s" in columns
    csv_rows = list(csv.DictReader(epoch_report.to_csv(columns, flat).splitlines()))
    assert [r["epoch"] for r in csv_rows if r["phase"] == "epoch"] == ["1", "2"]
    jsonl = [json.loads(line) for line in epoch_report.to_jsonl(columns, flat).splitlines()]
    assert len(jsonl) == len(rows)
    need_module("pyarrow", "pip install 'gpuledger[parquet]'")
    import pyarrow.parquet as pq

    epoch_report.write_parquet(columns, flat, str(tmp_path / "epochs.parquet"))
    table = pq.read_table(tmp_path / "epochs.parquet")
    assert table.column_names == columns and table.num_rows == len(rows)


def test_api_run_is_the_track_block(trained: Trained) -> None:
    api, own = trained.run("api"), trained.run("own")
    assert api.name == "api" and api.labels["project"] == "vision" and api.status == "succeeded"
    assert own.name == "own" and own.status == "succeeded" and own.id != api.id
    assert f"api run {api.id}" in trained.outputs["api"].stdout.decode()


def _run_named(trained: Trained, name: str) -> RunRecord:
    with trained.ledger() as ledger:
        return next(r for r in ledger.list_runs() if r.name == name)


def test_without_the_callbacks_epochs_are_read_from_the_log(trained: Trained) -> None:
    env = {**trained.env, "GPULEDGER_AUTOLOAD": "0"}
    argv = [
        *GPULEDGER,
        "run",
        "--name",
        "logonly",
        "--",
        _yolo(),
        "train",
        "model=yolov8n.yaml",
        f"data={trained.data}",
        "epochs=2",
        f"project={trained.project}",
        "name=logonly",
        *COMMON,
    ]
    out = subprocess.run(argv, env=env, cwd=trained.root, capture_output=True, timeout=TIMEOUT_S)
    assert out.returncode == 0, out.stderr.decode(errors="replace")[-3000:]
    run = _run_named(trained, "logonly")
    assert "save_dir" not in run.meta  # the callbacks really were off
    with trained.ledger() as ledger:
        parsed = _live_by_epoch(ledger, run)
        [event] = ledger.events(run.id, kind="log_parsed")
    expected = _csv_by_epoch(trained.results("logonly"))
    assert sorted(parsed) == [1, 2] and event.payload["format"] == "ultralytics"
    for epoch, row in expected.items():
        for key, value in parsed[epoch].items():
            if key in row:  # what the console shows, at the console's precision
                assert math.isclose(value, row[key], rel_tol=1e-3, abs_tol=1e-3), (epoch, key)


def test_a_missing_dataset_is_why_the_run_failed(trained: Trained) -> None:
    argv = [
        *GPULEDGER,
        "run",
        "--name",
        "nodata",
        "--",
        _yolo(),
        "train",
        "model=yolov8n.yaml",
        f"data={trained.root / 'missing' / 'data.yaml'}",
        "epochs=1",
        f"project={trained.project}",
        *COMMON,
    ]
    out = subprocess.run(argv, env=trained.env, cwd=trained.root, capture_output=True, timeout=TIMEOUT_S)
    assert out.returncode == 1
    run = _run_named(trained, "nodata")
    assert run.status == "failed" and run.status_reason.startswith("dataset not found: ")
    with trained.ledger() as ledger:
        [event] = ledger.events(run.id, kind="dataset_not_found")
    assert event.payload["epoch"] is None


DIES_SAVING = """
    import os
    import sys
    from ultralytics import YOLO

    def die_saving_epoch_2(trainer):  # epoch 2's row is in results.csv; its on_fit_epoch_end never comes
        if trainer.epoch == 1:
            os._exit(5)

    model = YOLO("yolov8n.yaml")
    model.add_callback("on_model_save", die_saving_epoch_2)
    model.train(data=sys.argv[1], project=sys.argv[2], name="dies_saving", epochs=3, **TRAIN_ARGS)
"""


def test_an_epoch_written_before_a_crash_saving_its_checkpoint_is_taken_from_results_csv(trained: Trained) -> None:
    """Ultralytics writes the epoch's results.csv row, then saves last.pt, then reports the epoch:
    a training dying in the save still finished the epoch, and the ledger holds it."""
    script = trained.root / "train_dies_saving.py"
    script.write_text(textwrap.dedent(DIES_SAVING).replace("TRAIN_ARGS", TRAIN_ARGS))
    _timed(
        trained,
        "dies_saving",
        [
            *GPULEDGER,
            "run",
            "--interval",
            "1",
            "--",
            sys.executable,
            str(script),
            str(trained.data),
            str(trained.project),
        ],
        expect=5,
    )
    run = trained.run("dies_saving")
    expected = _csv_by_epoch(trained.results("dies_saving"))
    assert list(expected) == [1, 2]  # the file Ultralytics wrote: two whole epochs
    with trained.ledger() as ledger:
        live = _live_by_epoch(ledger, run)
        ends = [(e.payload["epoch"], e.payload.get("source")) for e in ledger.events(run.id, kind="epoch_end")]
    assert _same(live, expected), (live, expected)
    assert ends == [(1, None), (2, "results.csv")]  # epoch 1 reported live, epoch 2 read from the file
    assert run.status == "failed"


def test_an_evaluation_of_a_trainings_best_pt_is_labelled_with_the_trainings_model(trained: Trained) -> None:
    """``yolo val model=.../weights/best.pt``: the model is the one the training was given
    (yolov8n, from its args.yaml), as the training's own label says, not the file name "best"."""
    best = trained.project / "cli" / "weights" / "best.pt"
    argv = [*GPULEDGER, "run", "--name", "val-best", "--", _yolo(), "val", f"model={best}", f"data={trained.data}",
            f"project={trained.project}", "name=val-best", *COMMON]  # fmt: skip
    out = subprocess.run(argv, env=trained.env, cwd=trained.root, capture_output=True, timeout=TIMEOUT_S)
    assert out.returncode == 0, out.stderr.decode(errors="replace")[-3000:]
    evaluation, training = _run_named(trained, "val-best"), trained.run("cli")
    assert evaluation.meta.get("kind") == "evaluation"
    assert evaluation.labels["model"] == training.labels["model"] == "yolov8n"
