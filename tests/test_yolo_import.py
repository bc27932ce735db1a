"""``gpuledger import ultralytics``: past run directories into the ledger (no training needed here)."""

from __future__ import annotations

import csv
import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from gpuledger.cli.import_cmd import import_cmd
from gpuledger.importers.ultralytics import NotARunDirectory, import_run_dir
from gpuledger.reports.run.epochs import metrics_by_epoch
from gpuledger.store import Ledger

DATA = Path(__file__).parent / "data" / "yolo"


def sha256_of(path) -> str:  # type: ignore[no-untyped-def]
    """Computed here with hashlib, independently of the code under test, over the whole file."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def make_run_dir(root: Path, name: str = "train", fixture: str = "yolo11n_segment") -> Path:
    """A run directory as ``yolo train`` leaves it, from a captured results.csv."""
    dataset = root / "shapes"
    (dataset / "images" / "train").mkdir(parents=True, exist_ok=True)
    (dataset / "images" / "val").mkdir(parents=True, exist_ok=True)
    for split, n in (("train", 3), ("val", 2)):
        for i in range(n):
            (dataset / "images" / split / f"{i}.jpg").write_bytes(b"jpg")
    names = "names:\n  0: square\n  1: disc\n"
    (dataset / "shapes.yaml").write_text(f"path: .\ntrain: images/train\nval: images/val\n{names}")
    run = root / "runs" / "segment" / name
    (run / "weights").mkdir(parents=True)
    shutil.copy(DATA / f"{fixture}.results.csv", run / "results.csv")
    args = {
        "task": "segment",
        "mode": "train",
        "model": "yolo11n-seg.yaml",
        "data": str(dataset / "shapes.yaml"),
        "epochs": 2,
        "imgsz": 64,
        "batch": 4,
        "device": "cpu",
        "save_dir": str(run),
    }
    (run / "args.yaml").write_text(yaml.safe_dump(args, sort_keys=False))
    (run / "weights" / "best.pt").write_bytes(b"best weights")
    (run / "weights" / "last.pt").write_bytes(b"last weights")
    return run


def _csv(run: Path) -> dict[int, dict[str, float]]:
    with open(run / "results.csv", newline="") as fh:
        return {int(r["epoch"]): {k: float(v) for k, v in r.items() if k != "epoch"} for r in csv.DictReader(fh)}


def test_import_stores_epochs_and_configuration(tmp_path: Path, ledger_url: str) -> None:
    run_dir = make_run_dir(tmp_path)
    with Ledger(ledger_url) as ledger:
        result = import_run_dir(ledger, run_dir, labels={"team": "vision"})
        run = ledger.get_run(result.run_id)
        assert result.created and result.epochs == 2
        assert metrics_by_epoch(ledger.metrics(run.id)) == _csv(run_dir)
        assert not ledger.host_intervals(run.id) and not ledger.events(run.id)
    assert run.status == "imported" and run.ended_at >= run.started_at
    assert run.labels == {"model": "yolo11n-seg", "dataset": "shapes", "team": "vision"}
    assert run.command == [
        "yolo",
        "segment",
        "train",
        "model=yolo11n-seg.yaml",
        f"data={tmp_path}/shapes/shapes.yaml",
        "epochs=2",
        "imgsz=64",
        "batch=4",
        "device=cpu",
    ]
    meta = run.meta
    assert meta["save_dir"] == str(run_dir) and meta["task"] == "segment" and meta["args_yaml"]["epochs"] == 2
    assert meta["dataset"]["classes"] == ["square", "disc"] and meta["dataset"]["images"]["train"] == 3
    assert meta["dataset"]["sha256"] == sha256_of(tmp_path / "shapes" / "shapes.yaml")
    assert meta["result"]["best_epoch"] == 2 and meta["result"]["epochs_completed"] == 2
    assert {w["name"]: w["sha256"] for w in meta["weights"]} == {
        "best.pt": sha256_of(run_dir / "weights" / "best.pt"),
        "last.pt": sha256_of(run_dir / "weights" / "last.pt"),
    }


def test_import_is_idempotent_and_a_longer_training_is_a_new_run(tmp_path: Path) -> None:
    run_dir = make_run_dir(tmp_path)
    with Ledger(tmp_path / "ledger.db") as ledger:
        first = import_run_dir(ledger, run_dir)
        again = import_run_dir(ledger, run_dir)
        assert (again.run_id, again.created) == (first.run_id, False)
        assert len(ledger.list_runs()) == 1 and len(ledger.metrics(first.run_id)) == 2 * 22
        with open(run_dir / "results.csv", "a") as fh:
            fh.write("3,1.1,5,9,3,3,0,0,0,0,0,0,0,0,0,2,5,1,1,0,0.0008,0.0008,0.0008\n")
        third = import_run_dir(ledger, run_dir)
        assert third.created and third.run_id != first.run_id and third.epochs == 3


def test_yolov5_run_directory(tmp_path: Path) -> None:
    run_dir = tmp_path / "exp"
    run_dir.mkdir()
    (run_dir / "results.csv").write_text(
        "               epoch,      train/box_loss,  metrics/mAP_0.5,metrics/mAP_0.5:0.95\n"
        "                   0,            0.1173,           0.00517,            0.00141\n"
        "                   1,           0.09421,            0.0951,             0.0403\n"
    )
    (run_dir / "opt.yaml").write_text("weights: yolov5s.pt\ndata: coco128.yaml\nepochs: 2\n")
    with Ledger(tmp_path / "ledger.db") as ledger:
        result = import_run_dir(ledger, run_dir)
        by_epoch = metrics_by_epoch(ledger.metrics(result.run_id))
        run = ledger.get_run(result.run_id)
    assert by_epoch[1] == {"train/box_loss": 0.09421, "metrics/mAP_0.5": 0.0951, "metrics/mAP_0.5:0.95": 0.0403}
    assert run.labels == {"model": "yolov5s", "dataset": "coco128"} and run.meta["result"]["best_epoch"] == 1


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda root: root / "missing", "no such directory"),
        (lambda root: (root / "f.txt").write_text("x") and root / "f.txt", "is a file"),
        (lambda root: (root / "empty").mkdir() or root / "empty", "no results.csv"),
        (lambda root: make_run_dir(root).parents[1], "contains run directories"),
    ],
)
def test_not_a_run_directory(tmp_path: Path, make: Callable[[Path], Path], message: str) -> None:
    with Ledger(tmp_path / "ledger.db") as ledger, pytest.raises(NotARunDirectory, match=message):
        import_run_dir(ledger, make(tmp_path))


def test_results_without_epochs(tmp_path: Path) -> None:
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "results.csv").write_text("epoch,time,train/box_loss\n")
    with Ledger(tmp_path / "ledger.db") as ledger, pytest.raises(NotARunDirectory, match="no epoch rows"):
        import_run_dir(ledger, tmp_path / "r")


def test_cli(tmp_path: Path) -> None:
    first, second = make_run_dir(tmp_path, "train"), make_run_dir(tmp_path / "b", "train2")
    db = str(tmp_path / "ledger.db")
    runner = CliRunner()
    missing = runner.invoke(import_cmd, ["ultralytics", str(first), str(tmp_path / "nothing"), "--db", db])
    assert missing.exit_code == 2 and "Error: Invalid value for 'PATHS...': Path" in missing.stderr
    assert "nothing' does not exist" in missing.stderr and not Path(db).exists()  # refused before any work
    (tmp_path / "empty").mkdir()
    out = runner.invoke(import_cmd, ["ultralytics", str(first), str(tmp_path / "empty"), "--db", db, "--project", "p1"])
    assert out.exit_code == 1
    assert out.stdout.startswith("imported ") and "2 epochs" in out.stdout
    assert out.stderr.startswith("Error: ") and "empty is not an Ultralytics run directory" in out.stderr
    out = runner.invoke(import_cmd, ["ultralytics", "-r", str(tmp_path), "--db", db, "--json"])
    assert out.exit_code == 0, out.output
    rows = json.loads(out.stdout)
    assert sorted((Path(r["path"]).name, r["created"]) for r in rows) == [("train", False), ("train2", True)]
    with Ledger(db) as ledger:
        assert {r.labels.get("project") for r in ledger.list_runs()} == {"p1", None}
    assert second.exists()


def test_imported_run_holds_no_secret(tmp_path: Path) -> None:
    """The folder's name and args.yaml (a dataset path with a token) are text the ledger keeps:
    redacted as a recorded run's are."""
    token = "hf_" + "FolderTokGhIjKlMnOpQrStUvWxYz012345"
    run_dir = make_run_dir(tmp_path, name=f"train-{token}")
    args = yaml.safe_load((run_dir / "args.yaml").read_text())
    args["data"] = "/data/shapes.yaml?token=" + "DataTok4411"
    (run_dir / "args.yaml").write_text(yaml.safe_dump(args, sort_keys=False))
    db = tmp_path / "ledger.db"
    with Ledger(db) as ledger:
        run = ledger.get_run(import_run_dir(ledger, run_dir).run_id)
    assert run is not None and "[REDACTED:" in run.name and any("[REDACTED:secret-field]" in c for c in run.command)
    stored = b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.name.startswith("ledger.db"))
    assert token.encode() not in stored and b"DataTok4411" not in stored
