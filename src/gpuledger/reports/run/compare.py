"""``gpuledger compare``: load each run's figures and per-epoch curves, then core.diagnosis.compare does the rest.

Money comes from the cost engine when it prices the runs (reports/run/cost_hook.py): the run's cost and
the engine's value for money (cost per mAP point, per epoch). Without it, the comparison shows
resource figures only, including busy GPU-hours per mAP point.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import TYPE_CHECKING, Any

from gpuledger import __version__
from gpuledger.core.diagnosis import compare as core_compare
from gpuledger.core.diagnosis.diagnose import diagnose
from gpuledger.core.ids import short_id
from gpuledger.core.units import fmt_number, fmt_pct, iso_utc
from gpuledger.reports.run import comparability
from gpuledger.reports.run import cost_hook as costhook
from gpuledger.reports.run import data as rundata

if TYPE_CHECKING:
    from gpuledger.core.model import RunRecord
    from gpuledger.store import Ledger

CURVES = (
    # (chart id, title, unit, value of an epoch row)
    ("epoch_time", "Time per epoch", "s", lambda r: r.get("wall_s")),
    ("map", "mAP50-95 per epoch", "", lambda r: _metric(r, rundata.MAP_KEYS)),
    ("box_loss", "Training box loss per epoch", "", lambda r: _metric(r, ("train/box_loss", "train/loss"))),
    ("gpu_busy", "GPU busy per epoch (all GPUs)", "GPU-s", lambda r: r.get("gpu_busy_s")),
    (
        "vram",
        "Peak VRAM per epoch",
        "GiB",
        lambda r: None if r.get("gpu_mem_peak_b") is None else r["gpu_mem_peak_b"] / 2**30,
    ),
)


def _num(significant: int) -> Any:
    return lambda v: fmt_number(v, significant)


def _unit(unit: str, significant: int = 3) -> Any:
    return lambda v: "n/a" if v is None else f"{fmt_number(v, significant)} {unit}"


# An evaluation run's figures (meta.evaluation, issue 37): shown first, their % marked "not
# comparable" against a run whose comparability verdict fails.
EVAL_FIGURES: tuple[core_compare.Figure, ...] = (
    core_compare.Figure("eval_settings", "evaluation (mode · imgsz · batch · precision · device)", str, diff=False),
    core_compare.Figure("eval_images", "images evaluated", lambda v: "n/a" if v is None else f"{v:,}", diff=False),
    core_compare.Figure("inference_ms", "inference ms / image", _unit("ms"), "lower"),
    core_compare.Figure("total_ms", "pre + inference + post ms / image", _unit("ms"), "lower"),
    core_compare.Figure("fps_inference", "FPS (inference only)", _num(4), "higher"),
    core_compare.Figure("fps_end_to_end", "FPS (end to end)", _num(4), "higher"),
    core_compare.Figure("j_per_image", "energy per image", _unit("J"), "lower"),
    core_compare.Figure("power_mean_w", "mean GPU power", _unit("W"), "lower"),
    core_compare.Figure("power_peak_w", "peak GPU power", _unit("W")),
    core_compare.Figure("busy_share", "GPU busy share", fmt_pct),
    core_compare.Figure("map50", "mAP50", _num(4), "higher"),
    core_compare.Figure("map50_95", "mAP50-95", _num(4), "higher"),
)
EVAL_KEYS = frozenset(f.key for f in EVAL_FIGURES)


def evaluation_of(run: RunRecord) -> dict[str, Any] | None:
    record = run.meta.get("evaluation") if run.meta.get("kind") == "evaluation" else None
    return record if isinstance(record, dict) else None


def gpus_of(ledger: Ledger, run: RunRecord) -> list[dict[str, Any]]:
    return [dataclasses.asdict(g) for g in ledger.devices(run.id)]


def eval_figures(evaluation: dict[str, Any]) -> dict[str, Any]:
    ms = evaluation.get("ms_per_image") or {}
    parts = [ms.get(k) for k in ("preprocess", "inference", "postprocess")]
    settings = [evaluation.get(k) for k in ("mode", "imgsz", "batch", "precision", "device")]
    return {
        "eval_settings": " · ".join("–" if v is None else str(v) for v in settings),
        "eval_images": evaluation.get("images"),
        "inference_ms": ms.get("inference"),
        "total_ms": sum(parts) if all(isinstance(p, int | float) for p in parts) else None,
        "fps_inference": comparability.inference_fps(evaluation),
        "fps_end_to_end": evaluation.get("fps_end_to_end"),
        "j_per_image": evaluation.get("j_per_image"),
        "power_mean_w": evaluation.get("power_mean_w"),
        "power_peak_w": evaluation.get("power_peak_w"),
        "busy_share": evaluation.get("busy_share"),
        "map50": evaluation.get("map50"),
        "map50_95": evaluation.get("map50_95"),
    }


def _metric(row: dict[str, Any], keys: tuple[str, ...]) -> float | None:
    for key in keys:
        value = (row.get("metrics") or {}).get(key)
        if value is not None:
            return value
    return None


def label_of(run: RunRecord) -> str:
    return f"{run.name} ({short_id(run.id)})" if run.name else short_id(run.id)


def side(
    ledger: Ledger, run: RunRecord, now: float, with_cost: bool = True
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One run's figures (flat, keyed like core.diagnosis.compare.FIGURES) and its epoch rows."""
    data = rundata.load(ledger, run, now)
    s = data.summary
    epochs = rundata.epoch_rows(data)
    epoch_rows = [r for r in epochs if r["phase"] == "epoch"]
    n, per_epoch = rundata.sec_per_epoch(data.events, run.started_at, data.end)
    best = rundata.best_map(data.metrics)
    rates = [r["images_per_s"] for r in epoch_rows if r.get("images_per_s")]
    findings = diagnose(rundata.trace_of(ledger, data, with_history=False))
    counts = [sum(1 for f in findings if f.severity == sev) for sev in ("critical", "warning", "info")]
    names = sorted({g.get("name") or "unknown" for g in s["gpus"]})
    key = rundata.config_key(run)
    fig: dict[str, Any] = {
        "status": s["status"],
        "gpus": f"{len(s['gpus'])} × {', '.join(names)}" if s["gpus"] else "none",
        "config": None if key is None else " · ".join("–" if v is None else str(v) for v in key),
        "wall_seconds": s["wall_seconds"],
        "epochs": n or None,
        "sec_per_epoch": per_epoch,
        "images_per_s": statistics.median(rates) if rates else None,
        "best_map": best,
        "busy_gpu_hours": s["busy_gpu_hours"],
        "allocated_gpu_hours": s["allocated_gpu_hours"],
        "idle_gpu_hours": s["idle_gpu_hours"],
        "mean_utilization": s["mean_utilization"],
        "peak_memory_bytes": s["peak_memory_bytes"],
        "energy_kwh": s["energy_kwh"],
        "cpu_seconds": s["cpu_seconds"],
        "peak_rss_bytes": s["peak_rss_bytes"],
        "busy_h_per_map_point": (s["busy_gpu_hours"] / (best * 100)) if best and s["busy_gpu_hours"] else None,
        "findings": " / ".join(str(c) for c in counts),
    }
    evaluation = evaluation_of(run)
    if evaluation is not None:
        fig.update(eval_figures(evaluation))
    cost = costhook.run_cost(ledger, run) if with_cost else None
    if cost:
        total = costhook.cost_value(cost)
        currency = cost.get("currency") or ""
        fig["cost"] = f"{cost.get('total')} {currency}".strip() if total else None
        value = costhook.value_for_money(ledger, run) or {}
        for key_ in ("cost_per_map_point", "cost_per_epoch"):
            if value.get(key_) is not None:
                fig[key_] = f"{value[key_]} {value.get('currency') or currency}".strip()
        if "cost_per_map_point" not in fig and total and best:
            fig["cost_per_map_point"] = f"{total[0] / (best * 100):.6f} {currency}".strip()
    return fig, epochs


def verdicts(ledger: Ledger, runs: list[RunRecord]) -> list[dict[str, Any] | None]:
    """Each run's comparability verdict against the first run (None for the first, and for a run
    that is not an evaluation when the first is one, or the reverse: nothing to judge)."""
    evals = [evaluation_of(r) for r in runs]
    if evals[0] is None:
        return [None] * len(runs)
    base = comparability.facts(evals[0], gpus_of(ledger, runs[0]))
    out: list[dict[str, Any] | None] = [None]
    for run, ev in zip(runs[1:], evals[1:], strict=True):
        if ev is None:
            out.append(None)
            continue
        v = comparability.verdict(base, comparability.facts(ev, gpus_of(ledger, run)))
        out.append(v.as_dict())
    return out


def _mark_not_comparable(rows: list[dict[str, Any]], judged: list[dict[str, Any] | None]) -> None:
    """An evaluation figure's % against a run that is not comparable says so, and is no verdict."""
    for row in rows:
        if row["key"] not in EVAL_KEYS:
            continue
        for cell, v in zip(row["cells"], judged, strict=True):
            if v is not None and not v["comparable"] and cell.get("diff"):
                cell["diff"] = f"{cell['diff']} not comparable"
                cell["verdict"] = "not-comparable"
                cell["comparable"] = False


def claim(ledger: Ledger, runs: list[RunRecord], claimed: str) -> str:
    """``--claim``: run B's inference speed-up over run A, against the claimed one, in one line."""
    if len(runs) != 2:
        raise comparability.ClaimError("--claim compares exactly two runs: the baseline A, then B")
    pct = comparability.parse_claim(claimed)
    evals = [evaluation_of(r) for r in runs]
    for run, ev in zip(runs, evals, strict=True):
        if ev is None:
            raise comparability.ClaimError(f"--claim needs two evaluation runs; {short_id(run.id)} is not one")
    a, b = evals[0] or {}, evals[1] or {}
    v = comparability.verdict(
        comparability.facts(a, gpus_of(ledger, runs[0])), comparability.facts(b, gpus_of(ledger, runs[1]))
    )
    return comparability.claim_line(pct, a, b, v)


def build(
    ledger: Ledger,
    runs: list[RunRecord],
    now: float | None = None,
    with_cost: bool = True,
    claimed: str | None = None,
) -> dict[str, Any]:
    now = time.time() if now is None else now
    claim_text = None if claimed is None else claim(ledger, runs, claimed)
    sides = [side(ledger, run, now, with_cost) for run in runs]
    figures = [f for f, _ in sides]
    charts = []
    for cid, title, unit, get in CURVES:
        per_run = [
            {r["epoch"]: get(r) for r in rows if r["phase"] == "epoch" and r["epoch"] is not None} for _, rows in sides
        ]
        epochs, values = core_compare.aligned_curves(per_run)
        if not epochs or all(v is None for vs in values for v in vs):
            continue
        charts.append(
            {
                "id": cid,
                "title": title,
                "group": "compare",
                "time": False,
                "xlabel": "epoch",
                "x": epochs,
                "series": [
                    {"label": label_of(run), "unit": unit, "values": [_round(v) for v in vs]}
                    for run, vs in zip(runs, values, strict=True)
                ],
            }
        )
    judged = verdicts(ledger, runs)
    rows = core_compare.rows(figures, EVAL_FIGURES) + core_compare.rows(figures)
    _mark_not_comparable(rows, judged)
    verdict_notes = [
        f"{label_of(run)} against {label_of(runs[0])}: {v['summary']}."
        for run, v in zip(runs, judged, strict=True)
        if v is not None
    ]
    if claim_text:
        verdict_notes.insert(0, f"Claim: {claim_text}.")
    notes = list(verdict_notes)
    keys = {rundata.config_key(r) for r in runs}
    if len(keys) > 1:
        notes.append("The runs differ in configuration (model, dataset, imgsz, batch or workers).")
    if not any("cost" in f for f in figures):
        notes.append("No rate card priced these runs (set GPULEDGER_RATES, or --cost): resource figures only.")
    return {
        "report": "compare",
        "version": 1,
        "generated_at": iso_utc(now),
        "gpuledger_version": __version__,
        "runs": [
            {
                "id": r.id,
                "label": label_of(r),
                "name": r.name,
                "status": r.status,
                "started_at": iso_utc(r.started_at),
                "user": r.user,
                "host": r.host,
            }
            for r in runs
        ],
        "rows": rows,
        "charts": charts,
        "notes": notes,
        "comparability": judged,
        "verdict_notes": verdict_notes,  # also in notes (every format shows notes; the HTML shows them apart)
        "claim": claim_text,
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(float(value), 6)
