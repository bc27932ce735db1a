"""A discovered container that evaluated a model: ``yolo val | predict | benchmark`` nobody wrapped.

When such a container's run ends, the agent reads what a wrapped run without callbacks would be
read from (integrations/ultralytics/eval_postrun.py): its console, as archived (redacted, head and
tail). The run becomes an evaluation (``meta.kind``) whose ``meta.evaluation`` has
``source: "discovered"``:

* what was evaluated, from the command line (``yolo [task] val|predict|benchmark k=v ...``) or,
  for another command (a script calling ``model.val()``), from the validator's or predictor's own
  output; a container that trained (``Starting training for``, epochs read) is a training, even
  though each epoch's validation prints the same lines;
* images, per-image ms, mAP, the benchmark table, imgsz, batch, precision: as printed
  (core/evaluation/console.py). A prediction's image count comes from its ``image i/N`` lines, so
  it is unknown (None) when the archived log lost its middle;
* the window (``window_from``): the log's times of the evaluation's first banner and last
  summary line (``console``, node/eval_console.py), else the container's start and end
  (``container``), else the run's (``run``), limited to the span the agent metered (its
  intervals); energy, mean and peak power, busy share and J/image over it from the run's
  intervals (core/evaluation/window.py);
* the weights: the path the container named, mapped to the host through its mounts
  (node/container_mounts.py: no ``..``, no symbolic link followed) and hashed when it is there;
  else its sha256 is None. The split is named as the container named it, not fingerprinted: its
  files would be read through paths the container controls.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from typing import Any

from gpuledger.core.model import GpuIdentity, GpuInterval
from gpuledger.core.training.logparse import screen_lines
from gpuledger.integrations.ultralytics.eval_postrun import add_usage, console_record
from gpuledger.integrations.ultralytics.evaluation import EVALUATION
from gpuledger.node.container_mounts import ContainerFs, open_file, to_host

DISCOVERED_SOURCE = "discovered"
WEIGHTS_MAX_B = 8 * 2**30  # larger than any YOLO checkpoint; a bigger file is not hashed

NOT_FINGERPRINTED = "a discovered container's split is not read: its paths are the container's"


def _output_mode(log: bytes) -> str | None:
    """An evaluation the output shows without a ``yolo`` command line: the validator's speed line
    names a loss, the predictor's does not."""
    if b"Benchmarks complete for" in log:
        return "benchmark"
    if b"Speed: " not in log:
        return None  # most containers' logs: not screened line by line at all
    speeds = [line for line in screen_lines(log) if line.lstrip().startswith("Speed: ")]
    if not speeds:
        return None
    return "val" if "loss" in speeds[-1] else "predict"


def container_file_sha256(path: str, fs: ContainerFs | None) -> tuple[str | None, str | None]:
    """(the host path, the sha256) of a file the container named, found through its mounts and
    read without following a link; None for what could not be found or read."""
    where = to_host(path, fs) if fs is not None else None
    fd = open_file(where, max_b=WEIGHTS_MAX_B) if where is not None else None
    digest = None
    if fd is not None:
        try:
            h = hashlib.sha256()
            while piece := os.read(fd, 1 << 20):
                h.update(piece)
            digest = h.hexdigest()
        except OSError:
            digest = None
        finally:
            os.close(fd)
    return (str(where) if where is not None else None), digest


def _weights(path: str | None, fs: ContainerFs | None) -> dict[str, Any] | None:
    if not path:
        return None
    host, digest = container_file_sha256(path, fs)
    return {"path": path, "host_path": host, "sha256": digest}


def _window(span: tuple[float, float], intervals: Sequence[GpuInterval]) -> tuple[float, float]:
    if not intervals:
        return span
    t0 = max(span[0], min(iv.t0 for iv in intervals))
    t1 = min(span[1], max(iv.t1 for iv in intervals))
    return (t0, t1) if t1 > t0 else span


def evaluation(
    log: bytes,
    *,
    truncated: bool,
    command: Sequence[str],
    fs: ContainerFs | None,
    span: tuple[float, float],
    span_from: str = "container",
    intervals: Sequence[GpuInterval],
    devices: Sequence[GpuIdentity],
) -> dict[str, Any] | None:
    """``meta.evaluation`` of a discovered run that evaluated a model (module doc), or None."""
    t0, t1 = _window(span, intervals)
    found = console_record(log, command, t0, t1)
    if found is None:
        mode = _output_mode(log)
        found = console_record(log, command, t0, t1, mode=mode) if mode else None
    if found is None:
        return None
    record, args = found
    record["source"] = DISCOVERED_SOURCE
    record["window_from"] = span_from
    if record["mode"] == "predict" and truncated:
        record["images"] = record["fps_end_to_end"] = None  # image lines lost with the log's middle
    record["weights"] = _weights(args.get("model"), fs)
    if record["mode"] in ("val", "benchmark") and args.get("data"):
        record["split"] = {"name": args.get("split") or "val", "data": args["data"], "path": None}
    elif record["mode"] == "predict" and args.get("source"):
        record["split"] = {"name": "source", "data": None, "path": args["source"]}
    if isinstance(record.get("split"), dict):
        record["split"].update(fingerprint=None, fingerprint_error=NOT_FINGERPRINTED)
    add_usage(record, intervals)
    device = str(record.get("device") or "")
    if devices and not device.startswith(("cpu", "mps")):
        record["gpu_model"] = devices[0].name
    return record


def evaluation_meta(record: dict[str, Any]) -> dict[str, Any]:
    return {"kind": EVALUATION, "evaluation": record}


def summary(record: dict[str, Any]) -> str:
    return f"{record['mode']} of {record.get('images') or '?'} images, read from the container's output"
