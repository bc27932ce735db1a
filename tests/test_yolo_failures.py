"""Failure detection from a training's output and exit status (core/training/failures.py)."""

from __future__ import annotations

from pathlib import Path

from gpuledger.core.training.failures import CUDA_OOM, DATASET_NOT_FOUND, NAN_LOSS, OOM_KILLED, explain

DATA = Path(__file__).parent / "data" / "yolo"
GIB = 2**30


def _log(name: str) -> bytes:
    return (DATA / f"{name}.log").read_bytes()


def _training_until_epoch_2() -> bytes:
    """Real output up to the middle of epoch 2 (the progress line of epoch 2 and nothing after)."""
    text = _log("yolov8n_detect")
    start = text.index(b"\x1b[K        2/2 ")  # the epoch column, not a batch counter
    return text[: text.index(b"\n", start)]


# PyTorch's message (c10/cuda/CUDACachingAllocator.cpp), as a traceback's last line.
CUDA_OOM_LINE = (
    b"\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB. GPU 0 has a total capacity of "
    b"79.19 GiB of which 1.12 GiB is free. Including non-PyTorch memory, this process has 78.06 GiB memory in use.\n"
)


def test_cuda_out_of_memory_with_its_epoch() -> None:
    diagnosis = explain(_training_until_epoch_2() + CUDA_OOM_LINE, "failed", exit_code=1)
    [oom] = diagnosis.failures
    assert oom.kind == CUDA_OOM and oom.epoch == 2 and oom.fatal
    assert oom.payload == {"tried_to_allocate": "1.50 GiB", "gpu": 0}
    assert diagnosis.reason == "CUDA out of memory at epoch 2/2 (tried to allocate 1.50 GiB)"


def test_cuda_oom_that_ultralytics_recovered_from_is_not_the_reason() -> None:
    warning = "\nWARNING ⚠️ CUDA out of memory with batch=16. Reducing to batch=8 and retrying (1/3).\n".encode()
    log = _training_until_epoch_2() + warning
    diagnosis = explain(log, "succeeded", exit_code=0)
    [oom] = diagnosis.failures
    assert not oom.fatal and oom.payload["retry_batch"] == 8
    assert diagnosis.reason is None
    assert explain(log, "failed", exit_code=1).reason is None  # something else made it fail


def test_nan_loss_from_ultralytics_recovery_and_final_error() -> None:
    diagnosis = explain(_log("fail_nan_persisted"), "failed", exit_code=1)
    [nan] = diagnosis.failures
    assert nan.kind == NAN_LOSS and nan.epoch == 2
    assert diagnosis.reason == (
        "loss became NaN/Inf at epoch 2/4: RuntimeError: Training failed: NaN persisted for 4 epochs"
    )


def test_nan_loss_seen_only_in_the_progress_line() -> None:
    log = _training_until_epoch_2().replace(b"5.937", b"  nan")
    [nan] = explain(log, "failed", exit_code=1).failures
    assert nan.kind == NAN_LOSS and nan.epoch == 2 and nan.payload == {"keys": ["train/box_loss"]}


def test_dataset_not_found() -> None:
    for name, missing in (
        ("fail_dataset_yaml_missing", "does not exist"),
        ("fail_dataset_images_missing", "images not found"),
    ):
        diagnosis = explain(_log(name), "failed", exit_code=1)
        [failure] = diagnosis.failures
        assert failure.kind == DATASET_NOT_FOUND and failure.epoch is None
        assert diagnosis.reason.startswith("dataset not found: RuntimeError: Dataset '") and missing in diagnosis.reason


def test_oom_killer_from_killed_in_the_log() -> None:
    diagnosis = explain(_log("fail_shell_killed"), "failed", exit_code=137)
    [kill] = diagnosis.failures
    assert kill.kind == OOM_KILLED and kill.epoch == 4 and kill.payload["evidence"] == "killed_in_log"
    assert diagnosis.reason == "killed by SIGKILL, most likely the OOM killer, at epoch 4/30"


def test_oom_killer_from_sigkill_at_the_memory_limit() -> None:
    log = _log("fail_sigkill_epoch4")
    at_limit = explain(log, "killed", signal=9, rss_peak_b=int(23.5 * GIB), mem_limit_b=24 * GIB)
    [kill] = at_limit.failures
    assert kill.kind == OOM_KILLED and kill.epoch == 4
    assert at_limit.reason == (
        "killed by SIGKILL with peak RSS 23.5 GiB of a 24.0 GiB limit (the OOM killer) at epoch 4/30"
    )
    # Far below the limit, or another signal: a SIGKILL from someone else, not explained here.
    assert explain(log, "killed", signal=9, rss_peak_b=2 * GIB, mem_limit_b=24 * GIB).failures == []
    assert explain(log, "killed", signal=15, rss_peak_b=int(23.5 * GIB), mem_limit_b=24 * GIB).failures == []


def test_dataloader_worker_killed() -> None:
    # torch/utils/data/_utils/signal_handling.py, captured from a real worker SIGKILL
    line = b"\nRuntimeError: DataLoader worker (pid 20186) is killed by signal: Killed. \n"
    [kill] = explain(_training_until_epoch_2() + line, "failed", exit_code=1).failures
    assert kill.kind == OOM_KILLED and kill.epoch == 2 and kill.payload["evidence"] == "dataloader_worker_killed"


def test_a_clean_run_has_no_failures() -> None:
    for name in ("yolov8n_detect", "yolo26n_pose", "yolov5_v7"):
        assert explain(_log(name), "succeeded", exit_code=0).failures == []
