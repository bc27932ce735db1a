"""The diagnosis rules: each ``rule(trace, thresholds, found_so_far) -> [Finding]``.

Order matters only where a rule reads earlier findings (the under-used rule defers to the
input-pipeline rule). Thresholds: core.diagnosis.diagnose.Thresholds; docs/REPORTS.md explains each rule.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Sequence

from gpuledger.core.diagnosis.diagnose import (
    MAX_EVIDENCE,
    Evidence,
    Finding,
    Thresholds,
    Trace,
    busy_share,
    device_busy,
    gib,
    gpu_busy_on,
    gpu_index,
    linear_fit,
    longest,
    measured_s,
    merge_spans,
    minutes,
    pct,
    span_of,
    used_gpus,
)
from gpuledger.core.diagnosis.usage_rules import regression, throttling, underused
from gpuledger.core.model import GpuInterval
from gpuledger.core.training.epochs import EPOCH, spans

OOM_KINDS = ("oom", "cuda_oom", "out_of_memory")
HOST_OOM_KINDS = ("oom_killed",)
_OOM_TEXT = re.compile(r"out of memory|\bOOM\b", re.I)


# -- out of memory --------------------------------------------------------------------------------


def oom_crash(trace: Trace, th: Thresholds, found: list[Finding]) -> list[Finding]:
    out: list[Finding] = []
    gpu_events = [e for e in trace.events if e.kind in OOM_KINDS]
    host_events = [e for e in trace.events if e.kind in HOST_OOM_KINDS]
    fatal_gpu = [e for e in gpu_events if e.payload.get("fatal", True) is not False]
    recovered = [e for e in gpu_events if e.payload.get("fatal", True) is False]
    reason = trace.run.status_reason or ""
    failed = trace.run.status in ("failed", "killed", "lost")
    text_oom = failed and bool(_OOM_TEXT.search(reason))
    if fatal_gpu or (text_oom and not host_events and "kill" not in reason.lower()):
        event = fatal_gpu[0] if fatal_gpu else None
        out.append(_gpu_oom(trace, event.t if event else trace.end, event.payload if event else {}, reason))
    if host_events or (text_oom and "kill" in reason.lower() and not fatal_gpu):
        event = host_events[0] if host_events else None
        out.append(_host_oom(trace, event.t if event else trace.end, event.message if event else reason))
    if recovered:
        first = recovered[0].payload
        batches = f" (batch {first['batch']} → {first['retry_batch']})" if "batch" in first else ""
        out.append(
            Finding(
                "oom_crash",
                "info",
                f"CUDA ran out of memory {len(recovered)} time(s) and the training recovered{batches}",
                "The trainer caught the out-of-memory error and retried with a smaller batch; the run went on.",
                "Set the smaller batch yourself next time: the failed attempts cost time.",
                [Evidence(e.t - 30, e.t, "OOM, recovered", charts=("vram",)) for e in recovered[:MAX_EVIDENCE]],
                {"recovered": len(recovered)},
            )
        )
    return out


def _gpu_oom(trace: Trace, t: float, payload: dict, reason: str) -> Finding:
    t = min(t, trace.end)
    wanted = payload.get("gpu")
    best: tuple[int, str] | None = None
    for uuid, ivs in trace.gpu.items():
        if isinstance(wanted, int) and gpu_index(trace, uuid) != wanted:
            continue
        peak = max((iv.mem_used_max_b for iv in ivs if iv.t0 < t and iv.mem_used_max_b is not None), default=None)
        if peak is not None and (best is None or peak > best[0]):
            best = (peak, uuid)
    epoch = payload.get("epoch")
    where = f" at epoch {epoch}" if epoch is not None else ""
    figures: dict = {"t": t, "epoch": epoch}
    if best is None:
        detail = "No GPU memory reading was recorded before the crash."
        label = "GPU"
    else:
        peak, uuid = best
        dev = trace.device(uuid)
        total = dev.memory_total_b if dev else None
        proc = max((iv.proc_mem_max_b or 0 for iv in trace.gpu[uuid] if iv.t0 < t), default=0) or None
        share = peak / total if total else None
        label = trace.gpu_label(uuid)
        detail = f"Peak device memory before the crash: {gib(peak)} of {gib(total)} ({pct(share)}) on {label}" + (
            f"; the run's own processes held {gib(proc)}." if proc else "."
        )
        figures.update(gpu=gpu_index(trace, uuid), peak_memory_b=peak, memory_total_b=total, peak_share=share)
    if reason:
        detail += f" Status: {reason}"
    return Finding(
        "oom_crash",
        "critical",
        f"The run crashed: CUDA out of memory{where}",
        detail,
        "Lower the batch (YOLO: batch=-1 picks one that fits), lower imgsz, keep AMP on, or use a GPU with "
        "more memory. If memory rose epoch after epoch, see the memory-leak finding.",
        [Evidence(max(trace.run.started_at, t - 300), t, "before the OOM", figures.get("gpu"), ("vram",))],
        figures,
    )


def _host_oom(trace: Trace, t: float, message: str) -> Finding:
    peak = max((h.rss_max_b for h in trace.host), default=None)
    return Finding(
        "oom_crash",
        "critical",
        "The run was killed for lack of host memory (the kernel's OOM killer)",
        f"Peak resident memory of the training's processes: {gib(peak)}. {message}".strip(),
        "Use fewer data-loader workers, cache=disk or cache=False instead of cache=ram, or give the job "
        "more RAM (a higher memory limit).",
        [
            Evidence(
                max(trace.run.started_at, min(t, trace.end) - 300),
                min(t, trace.end),
                "before the kill",
                charts=("ram",),
            )
        ],
        {"peak_rss_b": peak, "t": t},
    )


# -- memory leak ----------------------------------------------------------------------------------


def memory_leak(trace: Trace, th: Thresholds, found: list[Finding]) -> list[Finding]:
    out = []
    epoch_spans = [s for s in spans(trace.events, trace.run.started_at, trace.end) if s.phase == EPOCH]
    by_epoch = epoch_spans and len(epoch_spans) >= th.leak_min_points + 1
    for uuid, ivs in trace.gpu.items():
        dev = trace.device(uuid)
        total = dev.memory_total_b if dev else None
        if not total or not ivs:
            continue
        use_proc = any(iv.proc_mem_max_b for iv in ivs)
        if by_epoch:
            windows = [(float(s.epoch or i + 1), s.t0, s.t1) for i, s in enumerate(epoch_spans)]
        elif trace.wall_s >= 1200:  # no epochs: ten windows of time
            width = trace.wall_s / 10
            windows = [
                (float(i + 1), trace.run.started_at + i * width, trace.run.started_at + (i + 1) * width)
                for i in range(10)
            ]
        else:
            continue
        points = []
        for x, t0, t1 in windows[1:]:  # the first epoch warms the allocator up
            peak = _peak_in(ivs, t0, t1, use_proc)
            if peak is not None:
                points.append((x, t0, t1, peak))
        if len(points) < th.leak_min_points:
            continue
        xs, ys = [p[0] for p in points], [float(p[3]) for p in points]
        slope, _, r2 = linear_fit(xs, ys)
        rising = sum(1 for a, b in itertools.pairwise(ys) if b > a) / (len(ys) - 1)
        if not (
            slope >= th.leak_min_step * total
            and ys[-1] - ys[0] >= th.leak_min_rise * total
            and r2 >= th.leak_min_r2
            and rising >= th.leak_rising_steps
        ):
            continue
        unit = "epoch" if by_epoch else "tenth of the run"
        left = max(0.0, total - ys[-1]) / slope
        oom_at = xs[-1] + math.ceil(left) if by_epoch else None
        planned = trace.run.meta.get("epochs") if isinstance(trace.run.meta.get("epochs"), int) else None
        when = (
            f"it would run out at about epoch {oom_at:.0f}" + (f" of {planned}" if planned else "")
            if oom_at is not None
            else f"it would run out in about {minutes(left * trace.wall_s / 10)}"
        )
        critical = oom_at is not None and planned is not None and oom_at <= planned
        out.append(
            Finding(
                "memory_leak",
                "critical" if critical or any(f.rule == "oom_crash" for f in found) else "warning",
                f"GPU memory grows every {unit} on {trace.gpu_label(uuid)}: {when}",
                f"{'The run' if use_proc else 'Device'} memory peak rose from {gib(ys[0])} to {gib(ys[-1])} "
                f"of {gib(total)}, about {gib(slope)} per {unit} (a steady rise, r² {r2:.2f}).",
                "Look for tensors kept across steps: losses or outputs appended to a list without .item() or "
                ".detach(), growing caches, or metrics accumulated on the GPU. torch.cuda.memory_summary() "
                "at each epoch end shows what grows.",
                [Evidence(points[0][1], points[-1][2], "memory rising", gpu_index(trace, uuid), ("vram",))],
                {
                    "gpu": gpu_index(trace, uuid),
                    "per_step_b": slope,
                    "r2": r2,
                    "first_b": ys[0],
                    "last_b": ys[-1],
                    "memory_total_b": total,
                    "oom_epoch": oom_at,
                    "by": "epoch" if by_epoch else "time",
                },
            )
        )
    return out


def _peak_in(ivs: Sequence[GpuInterval], t0: float, t1: float, use_proc: bool) -> int | None:
    vals = [(iv.proc_mem_max_b if use_proc else iv.mem_used_max_b) for iv in ivs if iv.t0 < t1 and iv.t1 > t0]
    known = [v for v in vals if v is not None]
    return max(known) if known else None


# -- input pipeline -------------------------------------------------------------------------------


def input_pipeline(trace: Trace, th: Thresholds, found: list[Finding]) -> list[Finding]:
    used = used_gpus(trace, th)
    host = [h for h in trace.host if span_of(h) > 0]
    if not used or not host:
        return []
    grid = [(h.t0, h.t1) for h in host]
    per_dev = [gpu_busy_on(grid, trace.gpu[u]) for u in used]
    cores = trace.cpu_cores
    flagged: list[tuple[float, float]] = []
    reasons = {"cpu": 0.0, "single_process": 0.0, "iowait": 0.0}
    measured = flagged_s = busy_sum = cpu_sum = 0.0
    for i, h in enumerate(host):
        shares = [d[i] for d in per_dev if d[i] is not None]
        if not shares:
            continue
        span = span_of(h)
        measured += span
        busy = sum(shares) / len(shares)
        rate = h.cpu_s / span
        why = None
        if (cores and rate >= th.cpu_saturated * cores) or (
            h.sys_cpu_util_avg_pct is not None and h.sys_cpu_util_avg_pct >= th.cpu_saturated * 100
        ):
            why = "cpu"
        elif h.procs_max <= 1 and rate >= th.single_core:
            why = "single_process"
        elif cores and h.iowait_s is not None and h.iowait_s / (span * cores) >= th.iowait_high:
            # iowait is summed over all cores: without their number there is no share to judge
            why = "iowait"
        if busy < th.starved_busy and why:
            flagged.append((h.t0, h.t1))
            reasons[why] += span
            flagged_s += span
            busy_sum += busy * span
            cpu_sum += h.cpu_s
    if not measured or flagged_s < th.input_min_s or flagged_s < th.input_min_share * measured:
        return []
    main = max(reasons, key=lambda k: reasons[k])
    busy_mean = busy_sum / flagged_s
    cpu_cores = cpu_sum / flagged_s
    core_text = f" of {cores}" if cores else ""
    because = {
        "cpu": f"the training's processes used {cpu_cores:.1f}{core_text} CPU cores: the CPU side is saturated",
        "single_process": f"its single process used {cpu_cores:.1f} CPU core: data loading runs in the main "
        "Python process, which cannot use more than one core",
        "iowait": "the host spent much of its time waiting for storage (iowait)",
    }[main]
    action = (
        "Storage is the bottleneck: copy the dataset to local NVMe or RAM (YOLO: cache=ram), pack many small "
        "files into fewer big ones, and prefetch."
        if main == "iowait"
        else "Give the data loader more worker processes (YOLO: workers=8; PyTorch: DataLoader(num_workers=N, "
        "pin_memory=True, persistent_workers=True)), cache decoded images (YOLO: cache=ram or cache=disk), "
        "or lighten the augmentation."
    )
    share = flagged_s / measured
    return [
        Finding(
            "input_pipeline",
            "critical" if share >= 0.5 else "warning",
            f"Input-pipeline bound: the GPUs waited for data {pct(share)} of the time",
            f"For {minutes(flagged_s)} ({pct(share)} of the measured time) the GPUs were busy only "
            f"{pct(busy_mean)} while {because}.",
            action,
            [
                Evidence(a, b, "GPU starved", charts=("gpu_util", "cpu"))
                for a, b in longest(merge_spans(flagged, gap_s=1.0))
            ],
            {
                "share": share,
                "seconds": flagged_s,
                "gpu_busy": busy_mean,
                "cpu_cores": cpu_cores,
                "cores": cores,
                "reason": main,
            },
        )
    ]


# -- idle allocated GPUs --------------------------------------------------------------------------


def idle_gpus(trace: Trace, th: Thresholds, found: list[Finding]) -> list[Finding]:
    """Idle is measured time minus busy: time the driver's samples could not cover with no instant
    reading is unmeasured (docs/METERING.md), so it neither makes a span idle nor counts in one."""
    used = set(used_gpus(trace, th))
    unused = [u for u, ivs in trace.gpu.items() if u not in used and device_busy(ivs)[1] > 0]
    wall = trace.wall_s
    min_span = th.idle_span_s if wall >= 3000 else max(60.0, 0.2 * wall)
    idle: list[tuple[str, float, float, float]] = []  # uuid, t0, t1, measured seconds in the span
    for uuid in sorted(used):
        ivs = trace.gpu[uuid]
        quiet = [iv for iv in ivs if (share := busy_share(iv)) is not None and share < th.idle_busy]
        for t0, t1 in merge_spans(((iv.t0, iv.t1) for iv in quiet), gap_s=1.0):
            if t1 - t0 >= min_span:
                idle.append((uuid, t0, t1, math.fsum(measured_s(iv) for iv in quiet if t0 <= iv.t0 and iv.t1 <= t1)))
    if not unused and not idle:
        return []
    parts, evidence = [], []
    unused_h = sum(device_busy(trace.gpu[u])[1] for u in unused) / 3600
    idle_h = sum(s for *_, s in idle) / 3600
    unmeasured_h = sum(span_of(iv) - measured_s(iv) for ivs in trace.gpu.values() for iv in ivs) / 3600
    if unused:
        names = ", ".join(trace.gpu_label(u) for u in unused)
        parts.append(
            f"{names} {'was' if len(unused) == 1 else 'were'} allocated for {minutes(wall)} but never "
            f"used (busy under {pct(th.unused_busy)}): {unused_h:.2f} GPU-hours held for nothing."
        )
        evidence += [
            Evidence(trace.run.started_at, trace.end, "never used", gpu_index(trace, u), ("gpu_util",)) for u in unused
        ]
    if idle:
        longest = max(idle, key=lambda s: s[2] - s[1])
        parts.append(
            f"{len(idle)} span(s) of at least {minutes(min_span)} under {pct(th.idle_busy)} busy on "
            f"used GPUs, {idle_h:.2f} GPU-hours in all; the longest {minutes(longest[2] - longest[1])} "
            f"on {trace.gpu_label(longest[0])}."
        )
        evidence += [
            Evidence(t0, t1, "idle", gpu_index(trace, u), ("gpu_util",))
            for u, t0, t1, _ in sorted(idle, key=lambda s: s[1] - s[2])[:MAX_EVIDENCE]
        ]
    if unmeasured_h > 0:
        parts.append(
            f"{minutes(unmeasured_h * 3600)} of GPU time the driver's samples could not cover is not "
            "measured and not counted as idle."
        )
    title = (f"{len(unused)} allocated GPU(s) never used" if unused else "") + (
        (" and " if unused else "") + f"{minutes(idle_h * 3600)} of idle GPU time" if idle else ""
    )
    return [
        Finding(
            "idle_gpus",
            "warning",
            title[0].upper() + title[1:],
            " ".join(parts),
            "Request only the GPUs the training uses (CUDA_VISIBLE_DEVICES, YOLO device=0,1) or make it use all "
            "of them (DDP); release GPUs during long evaluation or data preparation steps.",
            evidence,
            {
                "unused": [gpu_index(trace, u) for u in unused],
                "unused_gpu_h": unused_h,
                "idle_gpu_h": idle_h,
                "idle_spans": len(idle),
                "unmeasured_gpu_h": unmeasured_h,
            },
        )
    ]


RULES = (oom_crash, memory_leak, input_pipeline, idle_gpus, throttling, underused, regression)
