"""A training's place in its model's line, recorded at its end as ``meta.lineage`` (issue 37).

Called from postrun.explain_run once CMD has ended. A training started from weights (``model=X.pt``)
whose sha256 is the best.pt another training produced is that training's child. The record:

- ``model_version``: the run's ``model_version`` label (``gpuledger run -l model_version=v2``);
- ``model_line``: the ``model_line`` label, else the parent's line, else the ``model`` label / the
  model's name (``yolov8n``): a fine-tune of ``best.pt`` stays in its parent's line;
- ``weights_sha256``: the best.pt this training produced (the callbacks' weights list, else the file);
- ``source_weights``: the ``model=`` weights it started from (path, sha256); None for a YAML;
- ``parent_run``: the training whose best.pt has that sha256 (an indexed lookup in run_lineage).

The ledger keeps run_lineage in step with the meta (store/lineage.py), and finds the parent itself
where the recorder could not (a run pushed by an agent before its parent).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuledger.integrations.ultralytics.describe import file_info

if TYPE_CHECKING:
    from gpuledger.recorder.session import Session


def best_sha256(meta: Mapping[str, Any]) -> str | None:
    for info in meta.get("weights") or []:
        if isinstance(info, Mapping) and info.get("name") == "best.pt" and info.get("sha256"):
            return str(info["sha256"])
    save_dir = meta.get("save_dir")
    info = file_info(Path(str(save_dir)) / "weights" / "best.pt") if save_dir else None
    return None if info is None else str(info["sha256"])


def lineage_of(meta: Mapping[str, Any], labels: Mapping[str, str]) -> dict[str, Any] | None:
    """``meta.lineage`` of an Ultralytics training, before its parent is looked up; None otherwise."""
    if meta.get("framework") != "ultralytics" or meta.get("kind") == "evaluation" or not meta.get("save_dir"):
        return None
    model = meta.get("model") if isinstance(meta.get("model"), Mapping) else {}
    source = None
    if model.get("kind") == "weights" and model.get("sha256"):
        source = {"path": str(model.get("path") or model.get("source")), "sha256": str(model["sha256"])}
    produced = best_sha256(meta)
    if produced is None and source is None:
        return None
    return {
        "model_line": labels.get("model_line") or None,
        "model_version": labels.get("model_version") or None,
        "weights_sha256": produced,
        "source_weights": source,
        "parent_run": None,
    }


def record_lineage(session: Session) -> None:
    """Add ``meta.lineage`` to a finished Ultralytics training (nothing for other runs)."""
    run = session.run
    lineage = lineage_of(run.meta, run.labels)
    if lineage is None:
        return
    source = lineage["source_weights"]
    if source is not None:
        from gpuledger.store import lineage as store_lineage

        parent = None
        with contextlib.suppress(Exception):  # an unreachable ledger: the ledger finds the parent later
            ledger = session.ledger()
            parent = ledger.read(lambda conn: store_lineage.producer(conn, source["sha256"], run.started_at))
        if parent is not None and parent["run_id"] != run.id:
            lineage["parent_run"] = parent["run_id"]
            lineage["model_line"] = lineage["model_line"] or parent["model_line"]
    if lineage["model_line"] is None and lineage["parent_run"] is None:
        model = run.meta.get("model") if isinstance(run.meta.get("model"), Mapping) else {}
        lineage["model_line"] = run.labels.get("model") or model.get("name") or None
    session.update_meta(labels={}, meta={"lineage": lineage})
    session.recorder.flush(force=True)  # the run's meta is written with the flush
