"""The run report as one JSON-able dict: what ``report run --format json`` prints, and what the
HTML and Markdown renderings show (render_html.py, render_md.py). One model, three views.
"""

from __future__ import annotations

import dataclasses
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from gpuledger import __version__
from gpuledger.core.diagnosis.diagnose import Finding, Thresholds, diagnose
from gpuledger.core.units import (
    fmt_bytes,
    fmt_celsius,
    fmt_duration,
    fmt_hours,
    fmt_kwh,
    fmt_money,
    fmt_number,
    fmt_pct,
    fmt_percent,
    fmt_seconds,
    fmt_watts,
    iso_utc,
)
from gpuledger.reports.run import charts
from gpuledger.reports.run import cost_hook as costhook
from gpuledger.reports.run import data as rundata

if TYPE_CHECKING:
    from gpuledger.core.model import RunRecord
    from gpuledger.store import Ledger

REPORT_VERSION = 1
MARK_KINDS = ("epoch_end",)
QUIET_KINDS = ("epoch_start", "epoch_end", "phase", "resumed")
MAX_EVENTS = 200
# The cost block shows these (when the cost engine gives them); the JSON keeps everything.
COST_ROWS = (
    ("total", "cost"),
    ("basis", "billing basis"),
    ("rate_card", "rate card"),
    ("gpu_model", "GPU model"),
    ("rate", "rate per GPU-hour"),
    ("allocated_gpu_h", "allocated GPU-h"),
    ("busy_gpu_h", "busy GPU-h"),
    ("idle_gpu_h", "idle GPU-h"),
    ("a100eq_h", "A100-equivalent h"),
    ("energy_kwh", "energy kWh"),
    ("energy_cost", "energy cost"),
    ("idle_cost", "cost of idle time"),
    ("partial", "partial (run not finished)"),
    ("billed", "billed"),
    ("cost_per_epoch", "cost per epoch"),
    ("cost_per_1k_images", "cost per 1,000 images"),
    ("cost_per_map_point", "cost per mAP point"),
)


def build(
    ledger: Ledger, run: RunRecord, now: float | None = None, with_history: bool = True, with_cost: bool = True
) -> dict[str, Any]:
    now = time.time() if now is None else now
    # The series pass also sums each GPU's days, and the cost engine prices the run from those
    # sums instead of reading every interval again; it is imported meanwhile.
    with ThreadPoolExecutor(max_workers=1) as pool:
        if with_cost:
            pool.submit(costhook.engine)
        data = rundata.load(ledger, run, now, days=with_cost)
    cost, value = costhook.run_cost_and_value(ledger, run, data.day_sums) if with_cost else (None, None)
    trace = rundata.trace_of(ledger, data, with_history, cost=cost if with_cost else False)
    findings = diagnose(trace)
    epochs = rundata.epoch_rows(data)
    summary = data.summary
    chart_list = charts.all_charts(data, trace.cpu_cores)
    return {
        "report": "run",
        "version": REPORT_VERSION,
        "generated_at": iso_utc(now),
        "gpuledger_version": __version__,
        "run": summary,
        "cards": cards(summary, epochs, findings, cost, rundata.best_map(data.metrics)),
        "gpus": gpu_rows(summary),
        "epochs": epochs,
        "findings": [finding_dict(i, f) for i, f in enumerate(findings, 1)],
        "cost": cost,
        "cost_rows": cost_rows(cost, value),
        "events": notable_events(data.events),
        "marks": marks(data.events),
        "charts": chart_list,
        "downsampling": {
            "bucket_seconds": data.plan.width_s,
            "gpu_intervals": sum(data.counts["gpu"].values()),
            "host_intervals": data.counts["host"],
            "points_per_series": max((len(c["x"]) for c in chart_list), default=0),
            "method": "min/max per bucket" if data.downsampled else "none (every interval)",
        },
        "thresholds": dataclasses.asdict(Thresholds()),
    }


MONEY_ROWS = ("total", "energy_cost", "idle_cost", "cost_per_epoch", "cost_per_1k_images", "cost_per_map_point")


def cost_rows(cost: dict[str, Any] | None, value: dict[str, Any] | None) -> list[dict[str, str]]:
    """The cost block for people: amounts in cents (the JSON twin keeps ``cost`` exact), the rate
    as the card gives it, quantities with the usual three significant digits."""
    if not cost:
        return []
    merged = {**(value or {}), **cost}
    currency = cost.get("currency") or ""
    rows = []
    for key, label in COST_ROWS:
        v = merged.get(key)
        if v is None or isinstance(v, dict | list):
            continue
        if key in MONEY_ROWS:
            text = fmt_money(v, currency)
        elif key == "rate":
            text = f"{v} {currency}".strip()
        elif key == "partial":
            text = "yes" if v else "no"
        elif key == "billed":
            text = "yes" if v else "no: a replayed GPU trace, not real hardware"
        else:
            text = _quantity(v)
        rows.append({"label": label, "value": text})
    return rows


def _quantity(value: Any) -> str:
    try:
        return fmt_number(float(value)) if not isinstance(value, bool) else str(value)
    except (TypeError, ValueError):
        return str(value)


def finding_dict(number: int, f: Finding) -> dict[str, Any]:
    out = dataclasses.asdict(f)
    out["number"] = number
    out["evidence"] = [{**e, "charts": list(e["charts"])} for e in out["evidence"]]
    return out


def _card(label: str, value: str, detail: str = "", tone: str = "") -> dict[str, str]:
    return {"label": label, "value": value, "detail": detail, "tone": tone}


def cards(
    summary: dict[str, Any],
    epochs: list[dict[str, Any]],
    findings: list[Finding],
    cost: dict[str, Any] | None,
    best: float | None,
) -> list[dict[str, str]]:
    s = summary
    gpus = s.get("gpus") or []
    names = sorted({g.get("name") or "unknown GPU" for g in gpus})
    status_tone = {"succeeded": "good", "running": "info", "discovered": "info"}.get(s.get("status") or "", "bad")
    out = [
        _card("Status", str(s.get("status")), s.get("status_reason") or "", status_tone),
        _card("Wall time", fmt_duration(s.get("wall_seconds")), f"started {s.get('started_at') or 'n/a'}"),
        _card("GPUs", str(len(gpus)), ", ".join(names) if names else (s.get("gpu_note") or "none")),
        _card(
            "Busy GPU-hours",
            fmt_hours(s.get("busy_gpu_hours")),
            f"allocated {fmt_hours(s.get('allocated_gpu_hours'))} · idle {fmt_hours(s.get('idle_gpu_hours'))}"
            + (f" · unmeasured {fmt_hours(s['unmeasured_gpu_hours'])}" if s.get("unmeasured_gpu_hours") else ""),
        ),
        _card(
            "Mean utilisation", fmt_pct(s.get("mean_utilization")), f"peak {fmt_percent(s.get('peak_utilization_pct'))}"
        ),
        _card(
            "Peak VRAM",
            fmt_bytes(s.get("peak_memory_bytes")),
            f"this run's processes {fmt_bytes(s.get('peak_process_memory_bytes'))}",
        ),
        _card("Energy", fmt_kwh(s.get("energy_kwh")), f"peak power {fmt_watts(s.get('peak_power_watts'))}"),
        _card("CPU", fmt_seconds(s.get("cpu_seconds")), f"peak RSS {fmt_bytes(s.get('peak_rss_bytes'))}"),
    ]
    n_epochs = sum(1 for r in epochs if r.get("phase") == "epoch")
    if n_epochs:
        out.append(_card("Epochs", str(n_epochs), f"best mAP50-95 {best:.3f}" if best is not None else ""))
    if cost:
        total = next((cost[k] for k in costhook.TOTAL_KEYS if k in cost), None)
        out.append(_card("Cost", fmt_money(total, cost.get("currency")), cost.get("basis") or ""))
    worst = findings[0].severity if findings else None
    out.append(
        _card(
            "Findings",
            str(len(findings)),
            findings[0].title if findings else "nothing to report",
            {"critical": "bad", "warning": "warn"}.get(worst or "", "good"),
        )
    )
    return out


def gpu_rows(summary: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for g in summary.get("gpus") or []:
        throttle = g.get("throttle_seconds") or {}
        perf = sum(v for k, v in throttle.items() if k in charts.PERF_THROTTLE)
        rows.append(
            {
                "index": g.get("index"),
                "name": g.get("name"),
                "uuid": g.get("uuid"),
                "busy": fmt_pct(g.get("mean_utilization")),
                "busy_h": fmt_hours(_h(g.get("busy_seconds"))),
                "idle_h": fmt_hours(_h(g.get("idle_seconds"))),
                "energy": fmt_kwh(g.get("energy_kwh")),
                "peak_vram": fmt_bytes(g.get("peak_memory_bytes")),
                "peak_run_vram": fmt_bytes(g.get("peak_process_memory_bytes")),
                "memory_total": fmt_bytes(g.get("memory_total_bytes")),
                "peak_power": fmt_watts(g.get("peak_power_watts")),
                "max_temp": fmt_celsius(g.get("max_temperature_c")),
                "throttled": fmt_duration(perf) if g.get("throttle_seconds") is not None else "n/a",
                "methods": " / ".join(m for m in (g.get("util_method"), g.get("energy_method")) if m) or "n/a",
                "intervals": g.get("intervals"),
            }
        )
    return rows


def _h(seconds: float | None) -> float | None:
    return None if seconds is None else seconds / 3600


def marks(events: list[Any]) -> list[dict[str, Any]]:
    out = []
    for e in events:
        if e.kind == "epoch_end":
            epoch = e.payload.get("epoch")
            out.append({"t": e.t, "label": f"e{epoch}" if epoch is not None else "epoch", "kind": "epoch"})
    return out


def notable_events(events: list[Any]) -> dict[str, Any]:
    shown = [e for e in events if e.kind not in QUIET_KINDS]
    return {
        "total": len(shown),
        "items": [{"t": e.t, "time": iso_utc(e.t), "kind": e.kind, "message": e.message} for e in shown[:MAX_EVENTS]],
    }
