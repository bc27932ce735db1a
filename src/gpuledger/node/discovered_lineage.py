"""A discovered YOLO training's place in its model's line (``meta.lineage``), as a wrapped one's.

integrations/ultralytics/lineage.py makes the record from the run's metadata; here the files it
names are the container's, so they are hashed through its mounts (node/discovered_eval.py: no
``..``, no symbolic link followed), never at the container's path on the host:

* ``weights_sha256``: ``<save_dir>/weights/best.pt``; without it (the run directory on no mount,
  unreadable) no lineage is recorded;
* ``source_weights``: the ``model=`` weights it started from, when they lie on a mount.

The parent (the training whose best.pt has the source's sha256) is found by the ledger when the
metadata is written (store/lineage.py), whichever of the two it receives first; a training started
from a YAML heads its line, named by the ``model_line`` or ``model`` label, else the model's name.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from typing import Any

from gpuledger.integrations.ultralytics.lineage import lineage_of
from gpuledger.node.container_mounts import ContainerFs
from gpuledger.node.discovered_eval import container_file_sha256


def training_lineage(
    meta: Mapping[str, Any], labels: Mapping[str, str], fs: ContainerFs | None
) -> dict[str, Any] | None:
    """``meta.lineage`` of a discovered Ultralytics training whose best.pt is readable, else None."""
    save_dir = meta.get("save_dir")
    if fs is None or meta.get("framework") != "ultralytics" or not isinstance(save_dir, str) or not save_dir:
        return None
    _, produced = container_file_sha256(posixpath.join(save_dir, "weights", "best.pt"), fs)
    if produced is None:
        return None  # lineage_of would look for best.pt at the container's path, on the host
    model = dict(meta["model"]) if isinstance(meta.get("model"), Mapping) else {}
    source = model.get("source")
    if model.get("kind") == "weights" and isinstance(source, str) and source:
        model.update(path=source, sha256=container_file_sha256(source, fs)[1])
    lineage = lineage_of({**meta, "model": model, "weights": [{"name": "best.pt", "sha256": produced}]}, labels)
    if lineage is not None and lineage["source_weights"] is None and lineage["model_line"] is None:
        lineage["model_line"] = labels.get("model") or model.get("name") or None
    return lineage
