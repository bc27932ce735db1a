"""``gpuledger lineage ID|MODEL_VERSION``: a model's whole line, one version per training (issue 37).

From any run of the line (a training, an evaluation of its weights, or a ``model_version`` label)
the chain is walked through run_lineage (store/lineage.py): up to the first training, down through
every training that started from a version's best.pt. Each version: its training run, host, GPU
model, dataset, GPU-hours, energy, cost (rate card when configured), best mAP, its evaluation runs
(inference FPS, J/image, mAP) and the change against the previous version (its parent).
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Any

from gpuledger import __version__
from gpuledger.core.diagnosis.inference_rules import inference_slower
from gpuledger.core.ids import short_id
from gpuledger.core.units import iso_utc
from gpuledger.reports.run import comparability
from gpuledger.reports.run import cost_hook as costhook
from gpuledger.reports.run import data as rundata
from gpuledger.store import lineage as store_lineage

if TYPE_CHECKING:
    from gpuledger.store import Ledger

# ``ledger``: where runs are read (a Ledger, or the server's ScopedLedger: runs outside the reader's
# projects do not exist there and are left out of the line); ``index``: the Ledger whose run_lineage
# is looked up (the same Ledger on the CLI).


class NoLineage(LookupError):
    """The reference names no run or model version with a recorded line."""


def _visible(ledger: Any, run_id: str) -> bool:
    try:
        ledger.get_run(run_id)
    except Exception:  # RunNotFound: deleted, or outside the reader's scope
        return False
    return True


def start_row(ledger: Any, ref: str, index: Ledger) -> dict[str, Any]:
    """The training a reference points at: a model_version, a training run, or an evaluation run
    (the training that produced the evaluated weights)."""
    row = index.read(lambda conn: store_lineage.by_version(conn, ref))
    if row is not None and _visible(ledger, row["run_id"]):
        return row
    try:
        run_id = ledger.resolve(ref)
    except Exception as exc:
        raise NoLineage(f"{ref!r} is neither a model_version in the ledger nor a run ({exc})") from exc
    row = index.read(lambda conn: store_lineage.get(conn, run_id))
    if row is not None and row["kind"] == store_lineage.EVALUATION:
        sha = row["weights_sha256"]
        row = index.read(lambda conn: store_lineage.producer(conn, sha))
        if row is None:
            raise NoLineage(f"run {short_id(run_id)} evaluated weights that no recorded training produced")
    if row is None:
        raise NoLineage(
            f"run {short_id(run_id)} has no recorded lineage (an Ultralytics training records one when it ends)"
        )
    return row


def chain_rows(index: Ledger, start: dict[str, Any]) -> list[dict[str, Any]]:
    """The line through ``start``: its ancestors from the first training, then itself and every
    descendant (depth first, oldest child first). A cycle (hand-edited meta) stops the walk."""
    seen = {start["run_id"]}
    up: list[dict[str, Any]] = []
    row = start
    while row.get("parent_run") and row["parent_run"] not in seen:
        parent_id = row["parent_run"]
        parent = index.read(lambda conn, pid=parent_id: store_lineage.get(conn, pid))
        if parent is None:
            break
        seen.add(parent["run_id"])
        up.append(parent)
        row = parent
    down: list[dict[str, Any]] = []
    stack = [start]
    while stack:
        row = stack.pop()
        down.append(row)
        kids = index.read(lambda conn, rid=row["run_id"]: store_lineage.children(conn, rid))
        for kid in reversed([k for k in kids if k["run_id"] not in seen]):
            seen.add(kid["run_id"])
            stack.append(kid)
    return [*reversed(up), *down]


def _evaluation(ledger: Any, run_id: str) -> dict[str, Any]:
    run = ledger.get_run(run_id)
    ev = run.meta.get("evaluation") if isinstance(run.meta.get("evaluation"), dict) else {}
    split = ev.get("split") if isinstance(ev.get("split"), dict) else {}
    gpus = [dataclasses.asdict(g) for g in ledger.devices(run_id)]
    return {
        "run_id": run.id,
        "short_id": short_id(run.id),
        "name": run.name,
        "started_at": iso_utc(run.started_at),
        "host": run.host,
        "mode": ev.get("mode"),
        "gpu_model": ev.get("gpu_model"),
        "split": split.get("name"),
        "split_fingerprint": split.get("fingerprint"),
        "images": ev.get("images"),
        "imgsz": ev.get("imgsz"),
        "precision": ev.get("precision"),
        "inference_ms": (ev.get("ms_per_image") or {}).get("inference"),
        "fps_inference": comparability.inference_fps(ev),
        "j_per_image": ev.get("j_per_image"),
        "map50_95": ev.get("map50_95"),
        "conditions": comparability.facts(ev, gpus),  # what the comparability verdict compares
    }


def version(ledger: Any, index: Ledger, row: dict[str, Any], now: float, with_cost: bool) -> dict[str, Any]:
    """One version; its run is visible in ``ledger`` (checked by the caller), its figures are read
    from ``index`` (the report code reads through the Ledger's connection)."""
    run = index.get_run(row["run_id"])
    data = rundata.load(index, run, now)
    s = data.summary
    names = sorted({g.get("name") or "unknown" for g in s["gpus"]})
    dataset = run.meta.get("dataset") if isinstance(run.meta.get("dataset"), dict) else {}
    lineage = run.meta.get("lineage") if isinstance(run.meta.get("lineage"), dict) else {}
    cost = costhook.run_cost(index, run) if with_cost else None
    total = costhook.cost_value(cost)
    sha = row["weights_sha256"]
    evals = [] if not sha else index.read(lambda conn: store_lineage.evaluations(conn, sha))
    evals = [rid for rid in evals if _visible(ledger, rid)]
    return {
        "run_id": run.id,
        "short_id": short_id(run.id),
        "name": run.name,
        "status": run.status,
        "started_at": iso_utc(run.started_at),
        "user": run.user,
        "host": run.host,
        "model_line": row["model_line"],
        "model_version": row["model_version"],
        "parent_run": row["parent_run"],
        "source_weights": lineage.get("source_weights"),
        "weights_sha256": sha,
        "gpu_model": ", ".join(names) or None,
        "dataset": {"name": dataset.get("name"), "fingerprint": dataset.get("sha256")},
        "gpu_hours": s["allocated_gpu_hours"],
        "busy_gpu_hours": s["busy_gpu_hours"],
        "energy_kwh": s["energy_kwh"],
        "cost": None if total is None else f"{cost.get('total')} {total[1] or ''}".strip(),  # exact, as compare
        "best_map": rundata.best_map(data.metrics),
        "evaluations": [_evaluation(index, rid) for rid in evals],
    }


def _best_fps(v: dict[str, Any]) -> float | None:
    fps = [e["fps_inference"] for e in v["evaluations"] if e.get("fps_inference")]
    return max(fps) if fps else None


def change(v: dict[str, Any], prev: dict[str, Any] | None) -> dict[str, Any] | None:
    """Against the previous version (the parent): mAP in points, GPU-hours, energy, inference FPS in %."""
    if prev is None:
        return None

    def pct(a: float | None, b: float | None) -> float | None:
        return None if a is None or not b else (a / b - 1.0) * 100.0

    a, b = v.get("best_map"), prev.get("best_map")
    return {
        "against": prev["run_id"],
        "best_map_points": None if a is None or b is None else (a - b) * 100.0,
        "gpu_hours_pct": pct(v.get("gpu_hours"), prev.get("gpu_hours")),
        "energy_pct": pct(v.get("energy_kwh"), prev.get("energy_kwh")),
        "fps_inference_pct": pct(_best_fps(v), _best_fps(prev)),
    }


def _comparable(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return comparability.verdict(a["conditions"], b["conditions"]).comparable


def build(
    ledger: Any, ref: str, now: float | None = None, with_cost: bool = False, index: Ledger | None = None
) -> dict[str, Any]:
    """The line through ``ref``; versions the reader may not see (ScopedLedger) are left out (a
    version whose parent is hidden has no change figures)."""
    now = time.time() if now is None else now
    index = ledger if index is None else index
    start = start_row(ledger, ref, index)
    if not _visible(ledger, start["run_id"]):  # an evaluation the reader sees of a training they do not
        raise NoLineage(f"the training behind {ref!r} is not visible to you")
    rows = [row for row in chain_rows(index, start) if _visible(ledger, row["run_id"])]
    versions = [version(ledger, index, row, now, with_cost) for row in rows]
    by_id = {v["run_id"]: v for v in versions}
    for v in versions:
        prev = by_id.get(v["parent_run"] or "")
        v["change"] = change(v, prev)
        slower = (
            None
            if prev is None
            else inference_slower(v["run_id"], prev["run_id"], v["evaluations"], prev["evaluations"], _comparable)
        )
        v["findings"] = [] if slower is None else [slower.as_dict()]
    return {
        "report": "lineage",
        "version": 1,
        "generated_at": iso_utc(now),
        "gpuledger_version": __version__,
        "ref": ref,
        "selected": start["run_id"],
        "model_line": next((v["model_line"] for v in versions if v["model_line"]), None),
        "versions": versions,
    }
