"""The evaluation block of ``gpuledger show`` (``meta.evaluation`` of an evaluation run)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuledger.cli.table_fit import Column, clean, table_lines
from gpuledger.core.units import NA, fmt_bytes, fmt_duration, fmt_number, fmt_pct, fmt_watts

SHA_SHOWN = 12  # hex digits of a sha256 shown; --json has them all


def _num(value: Any, unit: str = "") -> str:
    text = fmt_number(value)
    return text if text == NA or not unit else f"{text} {unit}"


def _sha(value: Any) -> str:
    return clean(value)[:SHA_SHOWN] if value else NA


def _split_line(split: Mapping[str, Any]) -> str:
    where = split.get("data") or split.get("path")
    head = f"{clean(split.get('name') or '?')} of {clean(where)}" if where else clean(split.get("name") or NA)
    if split.get("fingerprint"):
        files = split.get("files")
        size = fmt_bytes(split.get("bytes"))
        return f"{head}: {files:,} files, {size}, fingerprint {_sha(split['fingerprint'])}"
    why = split.get("fingerprint_error")
    return f"{head}: fingerprint n/a" + (f" ({clean(why)})" if why else "")


def _speed(ms: Mapping[str, Any] | None) -> str:
    if not ms:
        return NA
    parts = [f"{_num(ms.get(k), 'ms')} {k}" for k in ("preprocess", "inference", "postprocess") if k in ms]
    return "  ".join(parts) + " per image"


def _benchmark_lines(rows: list[Mapping[str, Any]], width: int | None) -> list[str]:
    """`yolo benchmark`'s table by the CLI's one table rule: format and status whole, numbers never
    cut, fitted to a terminal's ``width``; piped (None), whole values not padded past a long cell."""
    metric = clean(next((r.get("metric_name") for r in rows if r.get("metric_name")), "metric"))
    columns = [
        Column("format", "key"),
        Column("status", "text", priority=5, min_width=8),
        Column("size MB", "number", priority=1, right=True),
        Column(metric, "number", priority=4, right=True),
        Column("ms/image", "number", priority=3, right=True),
        Column("FPS", "number", priority=2, right=True),
    ]
    cells = [
        [
            clean(r.get("format")),
            clean(r.get("status")),
            _num(r.get("size_mb")),
            _num(r.get("metric")),
            _num(r.get("ms_per_image")),
            _num(r.get("fps")),
        ]
        for r in rows
    ]
    inner = None if width is None else max(1, width - 2)  # the block's two-space indent
    return ["  " + line for line in table_lines(columns, cells, inner)]


def evaluation_text(meta: Mapping[str, Any], width: int | None = None) -> str:
    """The block, or "" for a run that is not an evaluation; its benchmark table fitted to a
    terminal's ``width`` (None: piped)."""
    ev = meta.get("evaluation")
    if meta.get("kind") != "evaluation" or not isinstance(ev, Mapping):
        return ""
    weights = ev.get("weights") or {}
    window = ev.get("window") or [None, None]
    seconds = window[1] - window[0] if None not in window else None
    images = ev.get("images")
    versions = ev.get("versions") or {}
    lines = [
        f"Evaluation ({clean(ev.get('mode') or NA)}, {clean(ev.get('source') or NA)})",
        f"  weights    {clean(weights.get('path') or NA)}  sha256 {_sha(weights.get('sha256'))}",
        f"  split      {_split_line(ev.get('split') or {})}",
        f"  setting    imgsz {clean(ev.get('imgsz') or NA)}  batch {clean(ev.get('batch') or NA)}  "
        f"{clean(ev.get('precision') or NA)}  device {clean(ev.get('device') or NA)}  "
        f"GPU {clean(ev.get('gpu_model') or NA)}",
        f"  images     {NA if images is None else f'{images:,}'} in {fmt_duration(seconds)}",
        f"  speed      {_speed(ev.get('ms_per_image'))}",
        f"  FPS        {_num(ev.get('fps_end_to_end'))} end to end   {_num(ev.get('fps_inference'))} inference only",
        f"  energy     {_num(ev.get('energy_j'), 'J')}   {_num(ev.get('j_per_image'), 'J/image')}   "
        f"power mean {fmt_watts(ev.get('power_mean_w'))}  peak {fmt_watts(ev.get('power_peak_w'))}   "
        f"GPU busy {fmt_pct(ev.get('busy_share'))}",
        f"  mAP        mAP50 {_num(ev.get('map50'))}   mAP50-95 {_num(ev.get('map50_95'))}",
        f"  versions   ultralytics {clean(versions.get('ultralytics') or NA)}  "
        f"torch {clean(versions.get('torch') or NA)}  CUDA {clean(versions.get('cuda') or NA)}",
    ]
    rows = ev.get("benchmark")
    if rows:
        lines += ["", "Benchmark", *_benchmark_lines(rows, width)]
    return "\n".join(lines)
