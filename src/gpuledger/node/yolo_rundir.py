"""A YOLO training's run directory read from the host: results.csv and args.yaml at full precision.

The console shows some of results.csv's columns rounded (losses ``%.4g``, metrics ``%.3g``) and
none of the validation losses or learning rates; results.csv has every column at ``%.6g``, and
its ``time`` column counts seconds from the trainer's start, not the container's. When the
directory lies on a mount (node/container_mounts.py) the agent reads it as the wrapped path does
(integrations/ultralytics/describe.py parses both): only complete lines of results.csv, at most
``describe.RESULTS_MAX_B`` of it, and args.yaml once.
"""

from __future__ import annotations

from typing import Any

from gpuledger.integrations.ultralytics import describe
from gpuledger.node.container_mounts import HostPath, read_file

ARGS_MAX_B = 1024 * 1024
ARGS_FILES = ("args.yaml", "opt.yaml")  # Ultralytics, YOLOv5


def results_rows(where: HostPath) -> list[dict[str, float]] | None:
    """results.csv's complete rows (a row being written is left for the next look); None when
    the file cannot be read (missing yet, too large, behind a symbolic link)."""
    data = read_file(where, "results.csv", max_b=describe.RESULTS_MAX_B)
    return None if data is None else describe.complete_epoch_rows(data)


def run_args(where: HostPath) -> dict[str, Any] | None:
    """The training's arguments (args.yaml, YOLOv5's opt.yaml); None when not readable yet."""
    for name in ARGS_FILES:
        data = read_file(where, name, max_b=ARGS_MAX_B)
        if data is None:
            continue
        try:
            import yaml

            loaded = yaml.safe_load(data.decode("utf-8", "replace"))
        except Exception:  # a half-written or foreign file: the console's figures stand
            return None
        return loaded if isinstance(loaded, dict) else None
    return None


def args_meta(args: dict[str, Any], save_dir: str) -> dict[str, Any]:
    """The run metadata a wrapped YOLO run gets from its arguments (describe.py's layout), with no
    look at paths the container named (they are the container's, not the host's)."""
    model = args.get("model") or args.get("weights") or args.get("cfg")
    text = str(model) if model is not None else ""
    name = text.rsplit("/", 1)[-1].rsplit(".", 1)[0] or None
    kind = "yaml" if text.endswith((".yaml", ".yml")) else "weights"
    return {**describe.args_fields(args, save_dir), "model": {"source": text or None, "kind": kind, "name": name}}
