"""The Ultralytics callbacks' own rules, on a minimal trainer (the real trainer: test_yolo_training.py)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ci_support import need_module
from gpuledger.core.model import RunRecord
from gpuledger.integrations.ultralytics import attach, callbacks, describe
from gpuledger.runs.attempts import find_earlier_attempt
from gpuledger.store import Ledger


class Sink:
    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []

    def send(self, msg_type: str, **fields: Any) -> bool:
        self.sent.append((msg_type, fields))
        return True

    def types(self) -> list[str]:
        return [t for t, _ in self.sent]


@pytest.fixture
def sink(monkeypatch: pytest.MonkeyPatch) -> Sink:
    found = Sink()
    monkeypatch.setattr(callbacks, "resolve", lambda: found)
    monkeypatch.delenv("RANK", raising=False)
    return found


def trainer(tmp_path: Path, epoch: int = 0) -> SimpleNamespace:
    csv = tmp_path / "results.csv"
    csv.write_text("epoch,time,train/box_loss,metrics/mAP50-95(B)\n1,0.5,6.84318,0.0125\n")
    return SimpleNamespace(
        epoch=epoch,
        csv=csv,
        train_loader=SimpleNamespace(dataset=list(range(8))),
        epoch_time=1.5,
        batch_size=4,
        epochs=2,
        metrics={"metrics/mAP50-95(B)": 0.0125},
        tloss=None,
    )


def test_one_epoch_then_the_final_validation_is_not_an_epoch(tmp_path: Path, sink: Sink) -> None:
    t = trainer(tmp_path)
    callbacks.on_pretrain_routine_start(t)
    callbacks.on_train_epoch_start(t)
    callbacks.on_train_epoch_end(t)
    callbacks.on_fit_epoch_end(t)
    t.epoch += 1  # what BaseTrainer.final_eval does before its extra on_fit_epoch_end
    t.metrics = {"metrics/mAP50-95(B)": 0.02}
    callbacks.on_val_start(SimpleNamespace(training=False))
    callbacks.on_fit_epoch_end(t)
    assert sink.types() == ["epoch_start", "epoch_end", "phase"]
    _, end = sink.sent[1]
    assert end["epoch"] == 1
    assert end["metrics"] == {"time": 0.5, "train/box_loss": 6.84318, "metrics/mAP50-95(B)": 0.0125}  # the csv row
    assert end["payload"]["images"] == 8 and end["payload"]["train_s"] >= 0
    assert getattr(t, callbacks.STATE_ATTR).final == {"metrics/mAP50-95(B)": 0.02}


def test_row_rebuilt_like_save_metrics_when_the_csv_has_not_got_it(tmp_path: Path, sink: Sink) -> None:
    t = trainer(tmp_path, epoch=1)  # results.csv only has epoch 1; this is epoch 2
    t.label_loss_items = lambda loss: {"train/box_loss": 1.234567891}
    t.lr, t.train_time_start = {"lr/pg0": 0.000841835123}, 0.0
    callbacks.on_train_epoch_start(t)
    callbacks.on_fit_epoch_end(t)
    metrics = sink.sent[-1][1]["metrics"]
    assert metrics["train/box_loss"] == 1.23457 and metrics["lr/pg0"] == 0.000841835  # "%.6g", as results.csv


def test_best_epoch_is_the_one_best_pt_holds_on_a_tie(tmp_path: Path, sink: Sink) -> None:
    # Epochs 1 and 2 validate the same: Ultralytics' stopper keeps epoch 1, but save_model rewrites
    # best.pt at epoch 2 (best_fitness == fitness), and an import of the folder says 2 as well.
    t = trainer(tmp_path)
    t.save_dir, t.epochs = tmp_path, 3
    t.stopper = SimpleNamespace(best_epoch=1)
    callbacks.on_pretrain_routine_start(t)
    rows = "epoch,time,metrics/mAP50-95(B)\n"
    for epoch, fitness in enumerate((0.0577, 0.0577, 0.01)):
        rows += f"{epoch + 1},{epoch + 1}.0,{fitness}\n"
        t.csv.write_text(rows)  # save_metrics writes the row before on_fit_epoch_end
        t.epoch, t.fitness, t.best_fitness = epoch, fitness, 0.0577
        callbacks.on_train_epoch_start(t)
        callbacks.on_fit_epoch_end(t)
    callbacks.on_train_end(t)
    result = next(f["meta"]["result"] for m, f in sink.sent if m == "metadata" and "result" in f["meta"])
    assert result["best_epoch"] == 2 and result["best_map50_95"] == 0.0577
    assert describe.best_row(describe.read_results_csv(t.csv))["epoch"] == 2  # the importer's answer


def test_a_resumed_training_is_named_by_its_architecture_not_last(tmp_path: Path, sink: Sink) -> None:
    last = tmp_path / "weights" / "last.pt"
    net = SimpleNamespace(yaml={"yaml_file": "yolov8n.yaml"}, parameters=lambda: [])
    t = trainer(tmp_path)
    t.save_dir, t.model, t.start_epoch = tmp_path, net, 2  # what check_resume and resume_training set
    t.args = SimpleNamespace(model=str(last), resume=str(last), task="detect", data=None, imgsz=64, batch=4)
    callbacks.on_pretrain_routine_start(t)
    callbacks.on_pretrain_routine_end(t)
    fields = next(f for m, f in sink.sent if m == "metadata")
    assert fields["meta"]["model"]["source"] == str(last)
    assert fields["meta"]["model"]["name"] == "yolov8n" and fields["labels"]["model"] == "yolov8n"
    t.start_epoch, t.args.resume = 0, False  # a training that starts from a copy of last.pt keeps its name
    callbacks.on_pretrain_routine_end(t)
    assert [f for m, f in sink.sent if m == "metadata"][-1]["labels"]["model"] == "last"


def test_only_rank_zero_reports(tmp_path: Path, sink: Sink, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    t = trainer(tmp_path)
    for fn in (callbacks.on_pretrain_routine_start, callbacks.on_train_epoch_start, callbacks.on_fit_epoch_end):
        fn(t)
    assert sink.sent == []


def test_callback_errors_never_reach_the_training(tmp_path: Path, sink: Sink) -> None:
    broken = SimpleNamespace(epoch="not a number")
    for fn in (callbacks.on_train_epoch_start, callbacks.on_fit_epoch_end, callbacks.on_pretrain_routine_end,
               callbacks.on_train_end):  # fmt: skip
        assert fn(broken) is None  # swallowed: the training goes on
    assert "epoch_end" not in sink.types()  # nothing half-made is reported
    # the same callbacks on a well-formed trainer do report: the guard is not a blanket no-op
    good = trainer(tmp_path)
    callbacks.on_pretrain_routine_start(good)
    callbacks.on_train_epoch_start(good)
    callbacks.on_fit_epoch_end(good)
    assert "epoch_end" in sink.types()


def test_attach_is_idempotent_and_picklable_for_ddp() -> None:
    model = SimpleNamespace(callbacks={"on_fit_epoch_end": [print]})
    attach(model)
    attach(model)
    assert model.callbacks["on_fit_epoch_end"] == [print, callbacks.on_fit_epoch_end]
    assert len(model.callbacks["on_pretrain_routine_start"]) == 2  # own-run starter + ours
    cloudpickle = need_module("cloudpickle", "pip install -r requirements-test.txt")  # how DDP workers get callbacks
    restored = cloudpickle.loads(cloudpickle.dumps(model.callbacks))
    assert restored["on_fit_epoch_end"][1] is callbacks.on_fit_epoch_end


def test_earlier_attempt_is_the_newest_run_of_the_same_save_dir(tmp_path: Path) -> None:
    def run(n: int, save_dir: str) -> RunRecord:
        return RunRecord(
            id=f"0190abcd-{n:04x}-7000-8000-{n:012x}",
            command=["yolo"],
            user="u",
            host="h",
            cwd="/",
            started_at=1000.0 + n,
            meta={"save_dir": save_dir},
        )

    with Ledger(tmp_path / "ledger.db") as ledger:
        for r in (run(1, "/runs/a"), run(2, "/runs/b"), run(3, "/runs/a/"), run(5, "/runs/a")):
            ledger.create_run(r)
        now = run(4, "/runs/a")
        ledger.create_run(now)
        assert find_earlier_attempt(ledger, "/runs/a", before=now).id == run(3, "").id
        assert find_earlier_attempt(ledger, "/runs/c", before=now) is None
