"""A discovered run's epochs: results.csv through the container's mounts, else the console, marked so.

The container's output is a real captured Ultralytics training (tests/data/yolo, 3 epochs, stdout
not a terminal) with the results.csv the same training wrote; it printed its run directory as
``/tmp/yl/runs/v8pipe``. Here that directory lies on a volume mounted at ``/tmp/yl/runs`` (a
folder in tmp_path stands for the volume's Mountpoint), or on no mount at all.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from gpuledger.node.container_mounts import ContainerFs, Mount
from gpuledger.node.discovered_epochs import FROM_CONSOLE, FROM_CSV, EpochTaker
from gpuledger.node.docker_logs import ContainerLog, Message

YOLO = Path(__file__).parent / "data" / "yolo"
LOG = (YOLO / "yolov8n_detect_piped.log").read_bytes()
CSV = (YOLO / "yolov8n_detect_piped.results.csv").read_bytes()
T0 = 1_800_000_000.0
ARGS = b"task: detect\nmode: train\nmodel: yolov8n.yaml\ndata: /data/data.yaml\nepochs: 3\nbatch: 4\nimgsz: 64\n"


def followed(lines_per_s: int = 20) -> ContainerLog:
    """The container's log as the daemon streams it: each line stamped, 20 lines a second."""
    log = ContainerLog("c" * 64)
    for i, line in enumerate(LOG.splitlines(keepends=True)):
        log.add([Message(1, int((T0 + i / lines_per_s) * 1e9), line)])
    log.finish()
    return log


def started_at() -> float:
    i = next(i for i, ln in enumerate(LOG.splitlines()) if b"Starting training for" in ln)
    return T0 + i / 20


def volume(tmp_path: Path, results: bytes | None = CSV) -> ContainerFs:
    run = tmp_path / "volumes" / "runs" / "_data" / "v8pipe"
    run.mkdir(parents=True)
    if results is not None:
        (run / "results.csv").write_bytes(results)
    (run / "args.yaml").write_bytes(ARGS)
    return ContainerFs((Mount(str(tmp_path / "volumes" / "runs" / "_data"), "/tmp/yl/runs", "volume"),), "/")


def csv_rows() -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(CSV.decode())))


def test_a_mounted_run_directory_gives_every_column_at_full_precision(tmp_path: Path) -> None:
    log, taker = followed(), EpochTaker()
    view = log.view()
    assert view.training.save_dir == "/tmp/yl/runs/v8pipe" and view.training.save_dir_from == "Logging results to"
    taken = taker.take(view, volume(tmp_path), now=T0 + 100, final=True)
    got = {(m.epoch, m.key): m.value for m in taken.metrics}
    want = {(int(r["epoch"]), k): float(v) for r in csv_rows() for k, v in r.items() if k != "epoch"}
    assert got == want  # every column, val losses and learning rates included, as written
    assert len({k for _, k in got}) == 14
    start = started_at()
    ends = [(p["epoch"], t, p["source"]) for t, kind, _, p in taken.events if kind == "epoch_end"]
    assert ends == [(int(r["epoch"]), start + float(r["time"]), "results.csv") for r in csv_rows()]
    [(t1, _, _, p1)] = [e for e in taken.events if e[1] == "epoch_start"]
    assert (t1, p1["epoch"]) == (start, 1)  # epoch 1 starts with training, not with the container
    assert taken.meta["epochs_source"] == FROM_CSV and taken.meta["save_dir"] == "/tmp/yl/runs/v8pipe"
    assert taken.meta["epochs"] == 3 and taken.meta["model"]["name"] == "yolov8n"
    assert taker.take(view, volume(tmp_path / "again"), now=T0 + 200, final=True).metrics == []  # taken once


def test_without_a_mount_the_console_figures_are_taken_and_marked_approximate(tmp_path: Path) -> None:
    view = followed().view()
    taken = EpochTaker().take(view, ContainerFs((), "/"), now=T0 + 100, final=True)
    keys = {m.key for m in taken.metrics}
    assert {m.epoch for m in taken.metrics} == {1, 2, 3}
    assert not any(k.startswith(("val/", "lr/")) for k in keys)  # the console never shows them
    assert taken.meta["epochs_source"] == FROM_CONSOLE and taken.meta["save_dir_host"] is None
    assert {p["source"] for _, kind, _, p in taken.events if kind == "epoch_end"} == {"log"}


def test_a_row_being_written_waits_and_missing_epochs_fall_back_at_the_end(tmp_path: Path) -> None:
    view = followed().view()
    lines = CSV.splitlines(keepends=True)
    partial = b"".join(lines[:3]) + lines[3][:-5]  # epoch 3's row: every field, the last one half written
    fs = volume(tmp_path, partial)
    taker = EpochTaker()
    taken = taker.take(view, fs, now=T0 + 100)
    assert {m.epoch for m in taken.metrics} == {1, 2}
    last = taker.take(view, fs, now=T0 + 101, final=True)  # the row never completed: the console's epoch 3
    assert {m.epoch for m in last.metrics} == {3} and "val/box_loss" not in {m.key for m in last.metrics}


def test_a_results_csv_that_is_a_symlink_out_of_the_volume_is_not_read(tmp_path: Path) -> None:
    secret = tmp_path / "elsewhere.csv"
    secret.write_bytes(CSV)
    fs = volume(tmp_path, results=None)
    (tmp_path / "volumes" / "runs" / "_data" / "v8pipe" / "results.csv").symlink_to(secret)
    taken = EpochTaker().take(followed().view(), fs, now=T0 + 100, final=True)
    assert taken.meta["epochs_source"] == FROM_CONSOLE
    assert "lr/pg0" not in {m.key for m in taken.metrics}
