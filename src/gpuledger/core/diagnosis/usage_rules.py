"""Diagnosis rules about how well the GPUs were used: throttling, under-use, regression.

Same contract as diagnose_rules.py: ``rule(trace, thresholds, found_so_far) -> [Finding]``.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import replace

from gpuledger.core.diagnosis.diagnose import (
    MAX_EVIDENCE,
    PERF_THROTTLE,
    Evidence,
    Finding,
    RunFacts,
    Thresholds,
    Trace,
    device_busy,
    gib,
    gpu_index,
    longest,
    pct,
    runs_where,
    span_of,
    used_gpus,
)
from gpuledger.core.metering.busy import unmeasured_seconds
from gpuledger.core.metering.summary import held_busy_share

# -- throttling -----------------------------------------------------------------------------------


def throttling(trace: Trace, th: Thresholds, found: list[Finding]) -> list[Finding]:
    covered = slowed = 0.0
    by_reason: dict[str, float] = {}
    evidence = []
    for uuid, ivs in trace.gpu.items():
        for iv in ivs:
            if iv.throttle_s is None:
                continue
            span = span_of(iv)
            covered += span
            perf = {r: s for r, s in iv.throttle_s.items() if r in PERF_THROTTLE and s > 0}
            slowed += min(span, sum(perf.values()))  # reasons can overlap in time: never above the span
            for r, s in perf.items():
                by_reason[r] = by_reason.get(r, 0.0) + s
        spans_ = runs_where(
            ivs,
            lambda iv: (
                iv.throttle_s is not None
                and span_of(iv) > 0
                and sum(s for r, s in iv.throttle_s.items() if r in PERF_THROTTLE) / span_of(iv) > th.throttle_span
            ),
        )
        evidence += [
            Evidence(a, b, "throttled", gpu_index(trace, uuid), ("clocks", "power", "temp")) for a, b in longest(spans_)
        ]
    if not covered or slowed / covered < th.throttle_share:
        return []
    share = slowed / covered
    main = max(by_reason, key=lambda r: by_reason[r])
    temp = max((iv.temp_max_c for ivs in trace.gpu.values() for iv in ivs if iv.temp_max_c is not None), default=None)
    thermal = main in ("thermal", "hw_slowdown")
    breakdown = ", ".join(f"{r} {pct(s / covered)}" for r, s in sorted(by_reason.items(), key=lambda kv: -kv[1]))
    action = (
        f"The GPU slowed itself down to stay cool (peak {temp:.0f} °C): check airflow, fans, dust and the "
        "room's inlet temperature."
        if thermal and temp is not None
        else "The GPU ran at its power limit. At full load this is normal on some models; if the limit was "
        "lowered (nvidia-smi -q -d POWER), raise it, and check the power supply for hw_power_brake."
    )
    return [
        Finding(
            "throttling",
            "warning",
            f"GPU clocks were throttled {pct(share)} of the time ({main})",
            f"Power or thermal limits slowed the GPUs for {pct(share)} of their time: {breakdown}.",
            action,
            sorted(evidence, key=lambda e: e.t0)[:MAX_EVIDENCE],
            {
                "share": share,
                "by_reason": {r: s / covered for r, s in by_reason.items()},
                "main": main,
                "peak_temp_c": temp,
            },
        )
    ]


# -- under-used GPU -------------------------------------------------------------------------------


def underused(trace: Trace, th: Thresholds, found: list[Finding]) -> list[Finding]:
    rows = []
    for uuid in used_gpus(trace, th):
        ivs = trace.gpu[uuid]
        dev = trace.device(uuid)
        total = dev.memory_total_b if dev else None
        proc = [iv.proc_mem_max_b for iv in ivs if iv.proc_mem_max_b]
        mem = [iv.mem_used_max_b for iv in ivs if iv.mem_used_max_b is not None]
        peak = max(proc) if proc else (max(mem) if mem else None)
        # The share the run's summary and the report's GPU table show (one source of truth).
        busy, _covered = device_busy(ivs)
        unmeasured = math.fsum(unmeasured_seconds(iv) for iv in ivs)
        share = held_busy_share(busy, trace.wall_s, unmeasured)
        if (
            total
            and peak is not None
            and share is not None
            and peak < th.underused_mem * total
            and share < th.underused_busy
        ):
            rows.append((uuid, peak, total, share))
    if not rows:
        return []
    text = "; ".join(
        f"{trace.gpu_label(u)} used at most {gib(p)} of {gib(t)} ({pct(p / t)}) and was busy {pct(b)} of the time"
        for u, p, t, b in rows
    )
    starved = any(f.rule == "input_pipeline" for f in found)
    action = (
        "Fix the input pipeline first (see above): a bigger batch does not help a GPU waiting for data. "
        if starved
        else ""
    )
    action += (
        "A larger batch (YOLO: batch=-1, or batch=0.8 for 80 % of memory) or a larger imgsz gives the GPU "
        "more work per step; or share it: several experiments per GPU, a MIG slice or a smaller GPU."
    )
    return [
        Finding(
            "underused",
            "info",
            "GPU under-used: little memory and low utilisation",
            text + ".",
            action,
            [],
            {"gpus": [{"gpu": gpu_index(trace, u), "peak_b": p, "total_b": t, "busy": b} for u, p, t, b in rows]},
        )
    ]


# -- regression -----------------------------------------------------------------------------------


def _per_map_point(f: RunFacts) -> float | None:
    spent = f.cost if f.cost is not None else f.busy_gpu_h
    if spent is None or not f.best_map:
        return None
    return spent / (f.best_map * 100)


def regression(trace: Trace, th: Thresholds, found: list[Finding]) -> list[Finding]:
    me = trace.facts
    if me is None or not trace.history:
        return []
    base = sorted((h for h in trace.history if h.started_at < me.started_at), key=lambda h: -h.started_at)
    base = base[: th.regression_baseline_runs]
    if not base:
        return []
    lines, figures = [], {"baseline_runs": [h.run_id for h in base]}
    known = [h.sec_per_epoch for h in base if h.sec_per_epoch]
    if me.sec_per_epoch and known:
        ref = statistics.median(known)
        if me.sec_per_epoch >= (1 + th.regression) * ref:
            lines.append(
                f"{pct(me.sec_per_epoch / ref - 1)} slower per epoch ({me.sec_per_epoch:.0f} s against "
                f"a median of {ref:.0f} s)"
            )
            figures.update(sec_per_epoch=me.sec_per_epoch, baseline_sec_per_epoch=ref)
    use_cost = me.cost is not None and all(h.cost is not None for h in base)
    mine = _per_map_point(me) if use_cost else _per_map_point(_no_cost(me))
    refs = [v for v in (_per_map_point(h if use_cost else _no_cost(h)) for h in base) if v is not None]
    if mine is not None and refs:
        ref = statistics.median(refs)
        if ref > 0 and mine >= (1 + th.regression) * ref:
            unit = me.currency or "" if use_cost else "busy GPU-h"
            lines.append(f"{pct(mine / ref - 1)} costlier per mAP point ({mine:.3g} against {ref:.3g} {unit})".strip())
            figures.update(per_map_point=mine, baseline_per_map_point=ref, basis="cost" if use_cost else "busy_gpu_h")
    if not lines:
        return []
    return [
        Finding(
            "regression",
            "warning",
            "Regression against earlier runs of the same configuration",
            "Compared with the latest "
            + f"{len(base)} earlier run(s) of the same configuration: "
            + "; ".join(lines)
            + ".",
            f"Compare side by side: gpuledger compare {base[0].run_id[:13]} {me.run_id[:13]}. Look for a changed "
            "dataset or code (git), another GPU model or host, jobs sharing the GPU, throttling or a starved input.",
            [],  # the whole run: nothing to shade
            figures,
        )
    ]


def _no_cost(f: RunFacts) -> RunFacts:
    return replace(f, cost=None)
