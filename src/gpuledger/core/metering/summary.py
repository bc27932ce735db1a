"""The run summary: the JSON that ``gpuledger show RUN --json`` prints, and its one-screen text form.

Figures come from the stored intervals: busy = Σ busy_s, energy = Σ energy_j;
allocated = the wall time the run held each GPU; unmeasured = the time the driver's samples could
not cover and no instant reading measured (docs/METERING.md); idle = allocated - busy - unmeasured.
Absent measurements are None, never 0.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gpuledger.core.ids import short_id
from gpuledger.core.metering.busy import unmeasured_seconds
from gpuledger.core.metering.intervals import merge_gpu_intervals, merge_host_intervals
from gpuledger.core.model import GpuIdentity, GpuInterval, HostInterval, RunRecord, run_is_open
from gpuledger.core.units import (
    J_PER_KWH,
    NA,
    S_PER_H,
    fmt_bytes,
    fmt_celsius,
    fmt_duration,
    fmt_hours,
    fmt_kwh,
    fmt_pct,
    fmt_percent,
    fmt_seconds,
    fmt_watts,
    iso_utc,
)

__all__ = ["REPLAY_BANNER", "format_summary", "summarize"]

REPLAY_BANNER = "REPLAYED GPU TRACE — not real hardware"
_COMMAND_WIDTH = 100


def summarize(
    run: RunRecord,
    devices: Sequence[GpuIdentity],
    gpu_intervals: Sequence[GpuInterval],
    host_intervals: Sequence[HostInterval],
    now: float,
    counts: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """Everything a person asks about one run, JSON-serialisable (str, int, float, bool, None).

    The intervals may be pre-merged (one per device and one for the host, as the ledger's
    rollups give them); ``counts`` then says how many recording intervals each stream had
    ("host" and each device uuid).
    """
    end = _measured_end(run, gpu_intervals, host_intervals, now)
    wall = None if end is None else max(0.0, end - run.started_at)
    host = merge_host_intervals(sorted(host_intervals, key=lambda i: (i.t0, i.seq))) if host_intervals else None
    gpus = [_gpu_summary(dev, uuid, ivs, wall) for dev, uuid, ivs in _per_device(devices, gpu_intervals)]
    if counts is not None:
        for g in gpus:
            g["intervals"] = counts.get(g["uuid"], 0)
    per_stream = [counts.get("host", 0) if counts is not None else len(host_intervals), *(g["intervals"] for g in gpus)]
    summary: dict[str, Any] = {
        "id": run.id,
        "short_id": short_id(run.id),  # what people type (core/ids.py)
        "name": run.name,
        "status": run.status,
        "status_reason": run.status_reason,
        "exit_code": run.exit_code,
        "signal": run.signal,
        "command": list(run.command),
        "user": run.user,
        "host": run.host,
        "cwd": run.cwd,
        "labels": dict(run.labels),
        "meta": dict(getattr(run, "meta", None) or {}),  # hyper-parameters, model, dataset (integrations)
        "attempt_of": run.attempt_of,
        "started_at": iso_utc(run.started_at),
        "ended_at": iso_utc(run.ended_at),
        "started_at_epoch": run.started_at,
        "ended_at_epoch": run.ended_at,
        "wall_seconds": wall,
        "cpu_seconds": host.cpu_s if host else None,
        # 0 B from a tree never seen alive (a command shorter than the first reading) is no reading.
        "peak_rss_bytes": host.rss_max_b if host and (host.rss_max_b or host.procs_max) else None,
        "read_bytes": host.read_b if host else None,
        "write_bytes": host.write_b if host else None,
        "gpus": gpus,
        **_gpu_totals(gpus, wall),
        "replayed": run.replayed or any(d.source == "replay" for d in devices),
        "gpu_note": run.gpu_note,
        "git": dict(run.git),
        "versions": dict(run.versions),
        "log_path": run.log_path,
        "interval_seconds": run.interval_s,
        "intervals": max(per_stream),  # recording intervals: the longest of the host / GPU streams
    }
    return _json_safe(summary)


def _measured_end(run: RunRecord, gpu: Sequence[GpuInterval], host: Sequence[HostInterval], now: float) -> float | None:
    """Where the run's wall time stops: now while running; the last measurement for a lost run
    (its recorder died, so ended_at, if set, is when someone noticed, not when it stopped)."""
    last = max((i.t1 for i in (*gpu, *host)), default=None)
    if run_is_open(run.status, run.ended_at):
        return now
    if run.status == "lost":
        return last if last is not None else run.ended_at
    return run.ended_at if run.ended_at is not None else last


def _per_device(
    devices: Sequence[GpuIdentity], intervals: Sequence[GpuInterval]
) -> list[tuple[GpuIdentity | None, str, list[GpuInterval]]]:
    """Devices in index order with their intervals; intervals of a device missing from the list
    still count (as an unnamed GPU) rather than silently vanish."""
    by_uuid: dict[str, list[GpuInterval]] = {}
    for iv in intervals:
        by_uuid.setdefault(iv.device_uuid, []).append(iv)
    known = sorted(devices, key=lambda d: (d.index, d.uuid))
    out: list[tuple[GpuIdentity | None, str, list[GpuInterval]]] = [(d, d.uuid, by_uuid.pop(d.uuid, [])) for d in known]
    out += [(None, uuid, ivs) for uuid, ivs in sorted(by_uuid.items())]
    return out


def held_busy_share(busy_s: float | None, wall_s: float | None, unmeasured_s: float | None) -> float | None:
    """A GPU's mean utilisation as every screen shows it (summary, show, the run report's table and
    its findings): busy time over the time the run held it (its wall time) less the time nobody
    measured. Not over the recorded intervals alone: start-up before the first sample is held too."""
    measured = None if wall_s is None or unmeasured_s is None else max(0.0, wall_s - unmeasured_s)
    return None if busy_s is None or not measured else min(1.0, busy_s / measured)


def _gpu_summary(
    dev: GpuIdentity | None, uuid: str, intervals: list[GpuInterval], wall: float | None
) -> dict[str, Any]:
    merged = merge_gpu_intervals(sorted(intervals, key=lambda i: (i.t0, i.seq))) if intervals else None
    busy = merged.busy_s if merged else None
    energy = merged.energy_j if merged else None
    unmeasured = None if busy is None else math.fsum(unmeasured_seconds(iv) for iv in intervals)
    measured = None if wall is None or unmeasured is None else max(0.0, wall - unmeasured)
    return {
        "index": dev.index if dev else None,
        "uuid": uuid,
        "name": dev.name if dev else None,
        "source": dev.source if dev else None,
        "memory_total_bytes": dev.memory_total_b if dev else None,
        "mig_profile": dev.mig_profile if dev else None,
        "busy_seconds": busy,
        "allocated_seconds": wall,
        # Clamped: tick edges can put busy a hair above wall; idle is never negative. Time nobody
        # measured is not idle (it is unmeasured_seconds).
        "idle_seconds": None if busy is None or measured is None else max(0.0, measured - busy),
        "unmeasured_seconds": unmeasured,
        "mean_utilization": held_busy_share(busy, wall, unmeasured),
        "energy_joules": energy,
        "energy_kwh": None if energy is None else energy / J_PER_KWH,
        "peak_memory_bytes": merged.mem_used_max_b if merged else None,
        "peak_process_memory_bytes": merged.proc_mem_max_b if merged else None,
        "peak_utilization_pct": merged.util_max_pct if merged else None,
        "peak_power_watts": merged.power_max_w if merged else None,
        "max_temperature_c": merged.temp_max_c if merged else None,
        "sm_clock_avg_mhz": merged.sm_clock_avg_mhz if merged else None,
        "util_method": merged.util_method if merged else None,
        # How busy time was covered (samples method): unsampled time taken as idle, and time the
        # samples could not cover (measured by the instant reading, else unmeasured).
        "util_idle_seconds": merged.util_idle_s if merged else None,
        "util_unknown_seconds": merged.util_unknown_s if merged else None,
        "energy_method": merged.energy_method if merged else None,
        "process_method": merged.proc_method if merged else None,
        "throttle_seconds": dict(merged.throttle_s) if merged and merged.throttle_s is not None else None,
        "intervals": len(intervals),
    }


def _known(values: Iterable[Any]) -> list[Any]:
    return [v for v in values if v is not None]


def _total(values: Iterable[float | None]) -> float | None:
    known = _known(values)
    return math.fsum(known) if known else None


def _peak(values: Iterable[Any]) -> Any:
    known = _known(values)
    return max(known) if known else None


def _gpu_totals(gpus: list[dict[str, Any]], wall: float | None) -> dict[str, Any]:
    """Run-level GPU figures. Sums cover the GPUs that measured them; with no GPUs they are None
    (the reason is in gpu_note), since "not measured" must not read as "used nothing"."""
    busy = _total(g["busy_seconds"] for g in gpus)
    measured = [g for g in gpus if g["busy_seconds"] is not None]
    unmeasured = _total(g["unmeasured_seconds"] for g in measured)
    held = None if wall is None else max(0.0, wall * len(measured) - (unmeasured or 0.0))
    energy = _total(g["energy_joules"] for g in gpus)
    return {
        "allocated_gpu_hours": None if wall is None or not gpus else wall * len(gpus) / S_PER_H,
        "busy_gpu_hours": None if busy is None else busy / S_PER_H,
        "idle_gpu_hours": _total_hours(g["idle_seconds"] for g in gpus),
        # GPU time the samples could not cover with no instant reading: neither busy nor idle.
        "unmeasured_gpu_hours": None if unmeasured is None else unmeasured / S_PER_H,
        "mean_utilization": None if busy is None or not held else min(1.0, busy / held),
        "peak_utilization_pct": _peak(g["peak_utilization_pct"] for g in gpus),
        "peak_memory_bytes": _peak(g["peak_memory_bytes"] for g in gpus),
        "peak_process_memory_bytes": _peak(g["peak_process_memory_bytes"] for g in gpus),
        "energy_kwh": None if energy is None else energy / J_PER_KWH,
        "peak_power_watts": _peak(g["peak_power_watts"] for g in gpus),
    }


def _total_hours(seconds: Iterable[float | None]) -> float | None:
    total = _total(seconds)
    return None if total is None else total / S_PER_H


def _json_safe(value: Any) -> Any:
    """NaN / infinity are not JSON: a measurement that produced one is reported as absent."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


# -- text ---------------------------------------------------------------------------------------


def format_summary(summary: dict[str, Any], width: int | None = None) -> str:
    """The end-of-run summary: one screen of plain text, one line per GPU. With ``width`` (a
    terminal's), the command is cut to it and a GPU line goes on at a figure's boundary, never
    inside one; ``width=0`` keeps the whole command (a pipe)."""
    s = summary
    lines = [_title(s)]
    if s.get("replayed"):
        lines.append(f"  *** {REPLAY_BANNER} ***")
    if s.get("series_expired"):  # a series-only run whose store dropped some of its days
        lines.append(f"  note       {s['series_expired']['note']}")
    lines += [
        f"  command    {_shorten(shlex.join(s.get('command') or []), width)}",
        f"  started    {s.get('started_at') or NA} on {s.get('host') or NA} by {s.get('user') or NA}",
        _who_pays(s.get("labels") or {}),
        f"  wall       {fmt_duration(s.get('wall_seconds'))}",
        *_recording_lines(s),
        f"  CPU        {fmt_seconds(s.get('cpu_seconds'))} (process tree)   "
        f"peak RSS {fmt_bytes(s.get('peak_rss_bytes'))}",
        f"  I/O        read {fmt_bytes(s.get('read_bytes'))}   written {fmt_bytes(s.get('write_bytes'))}",
    ]
    gpus = s.get("gpus") or []
    if not gpus:
        lines.append(f"  GPUs       none: {s.get('gpu_note') or 'no GPU was recorded for this run'}")
        return "\n".join(lines)
    lines += [
        f"  GPU-hours  allocated {fmt_hours(s.get('allocated_gpu_hours'))}   "
        f"busy {fmt_hours(s.get('busy_gpu_hours'))}   idle {fmt_hours(s.get('idle_gpu_hours'))}"
        + (f"   unmeasured {fmt_hours(s['unmeasured_gpu_hours'])}" if s.get("unmeasured_gpu_hours") else ""),
        f"  GPU util   mean {fmt_pct(s.get('mean_utilization'))}   peak {fmt_percent(s.get('peak_utilization_pct'))}",
        f"  VRAM peak  {fmt_bytes(s.get('peak_memory_bytes'))} device   "
        f"{fmt_bytes(s.get('peak_process_memory_bytes'))} this run's processes",
        f"  energy     {fmt_kwh(s.get('energy_kwh'))}   peak power {fmt_watts(s.get('peak_power_watts'))}",
    ]
    lines += [line for g in gpus for line in _gpu_lines(g, width)]
    measured = _measured_line(gpus)
    if measured:
        lines.append(measured)
    throttled = _throttle_line(gpus)
    if throttled:
        lines.append(throttled)
    if s.get("gpu_note"):
        lines.append(f"  note       {s['gpu_note']}")
    return "\n".join(lines)


def _title(s: dict[str, Any]) -> str:
    name = f' "{s["name"]}"' if s.get("name") else ""
    status = str(s.get("status") or NA)
    details = []
    if s.get("exit_code") is not None:
        details.append(f"exit {s['exit_code']}")
    if s.get("signal") is not None:
        details.append(f"signal {s['signal']}")
    if details:
        status += f" ({', '.join(details)})"
    if s.get("status_reason"):
        status += f": {s['status_reason']}"
    short = f" ({s['short_id']})" if s.get("short_id") and s["short_id"] != s.get("id") else ""
    return f"run {s.get('id')}{short}{name}  {status}"


def _recording_lines(s: dict[str, Any]) -> list[str]:
    """A run still recording: how far its written figures reach (the rest is still in the recorder)."""
    if "measured_until" not in s:  # runview.summary sets it for a run still recording
        return []
    running = f"running for {fmt_duration(s.get('elapsed_seconds'))}"
    if s.get("measured_until") is None:
        return [f"  recording  {running}; nothing written yet: the recorder writes its first figures within seconds"]
    return [f"  recording  {running}; figures up to {s['measured_until']}, the latest the recorder has written"]


def _who_pays(labels: dict[str, Any]) -> str:
    """Project and team (what a chargeback groups by), then the other labels."""
    others = ", ".join(f"{k}={v}" for k, v in sorted(labels.items()) if k not in ("project", "team"))
    line = f"  project    {labels.get('project') or NA}   team {labels.get('team') or NA}"
    return line + (f"   labels {others}" if others else "")


def _gpu_lines(g: dict[str, Any], width: int | None = None) -> list[str]:
    """One line per GPU; on a terminal narrower than it, continued at a figure's boundary."""
    index = NA if g.get("index") is None else g["index"]
    parts = [
        f"GPU {index}",
        g.get("name") or "unknown GPU",
        str(g.get("uuid")),
        f"busy {fmt_pct(g.get('mean_utilization'))} (peak {fmt_percent(g.get('peak_utilization_pct'))})",
        f"VRAM {fmt_bytes(g.get('peak_memory_bytes'))} (run {fmt_bytes(g.get('peak_process_memory_bytes'))})",
        fmt_kwh(g.get("energy_kwh")),
        fmt_watts(g.get("peak_power_watts")),
        fmt_celsius(g.get("max_temperature_c")),
    ]
    lines = ["  " + parts[0]]
    for part in parts[1:]:
        if width and len(lines[-1]) + 2 + len(part) > width and lines[-1].strip():
            lines.append(" " * 13 + part)  # under the figures, as the labels above are indented
        else:
            lines[-1] += "  " + part
    return lines


def _measured_line(gpus: list[dict[str, Any]]) -> str | None:
    """Said only when busy time is not all from the sample buffer (docs/METERING.md)."""
    parts = []
    unknown = sum(g.get("util_unknown_seconds") or 0.0 for g in gpus)
    if unknown >= 0.05:
        by_instant = any("instant" in (g.get("util_method") or "") for g in gpus)
        how = "measured by the instant reading" if by_instant else "not measured"
        parts.append(f"{fmt_seconds(unknown)} of GPU time the samples could not cover ({how})")
    instant_only = [str(g.get("index")) for g in gpus if g.get("util_method") == "instant"]
    if instant_only:
        parts.append(f"GPU {', '.join(instant_only)}: busy time from instant readings (no sample buffer)")
    absent = [str(g.get("index")) for g in gpus if g.get("busy_seconds") is None]
    if absent:
        parts.append(f"GPU {', '.join(absent)}: busy time not reported by the driver (absent, not 0)")
    return f"  measured   {'; '.join(parts)}" if parts else None


def _throttle_line(gpus: list[dict[str, Any]]) -> str | None:
    totals: dict[str, float] = {}
    for g in gpus:
        for reason, seconds in (g.get("throttle_seconds") or {}).items():
            totals[reason] = totals.get(reason, 0.0) + seconds
    shown = [f"{reason} {fmt_duration(sec)}" for reason, sec in sorted(totals.items()) if sec >= 0.5]
    return f"  throttled  {', '.join(shown)} (GPU time, all GPUs)" if shown else None


def _shorten(text: str, width: int | None = None) -> str:
    """The command cut to the terminal (``width``), whole for a pipe (0), or to 100 characters."""
    if width == 0:
        return text
    room = _COMMAND_WIDTH if width is None else max(8, width - len("  command    "))
    return text if len(text) <= room else text[: room - 1] + "…"
