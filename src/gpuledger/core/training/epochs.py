"""Resource usage per epoch: a run's intervals cut at its epoch boundary events.

Boundaries are run events: ``epoch_start`` / ``epoch_end`` (payload ``epoch``, 1-based) and
``phase`` (payload ``name``, e.g. "final validation", "after training"). They divide the run's
time into spans: ``setup`` before the first epoch, each epoch, ``between epochs``, and whatever
phases the integration marks after the last epoch (by default ``after training``). The spans cover
the whole run, so the figures of all spans add up to the run's totals.

Under ``gpuledger run`` the recorder closes its intervals exactly at each boundary, so every interval
falls in one span and the split is exact. Where a boundary falls inside an interval (in-process
``track()``, or an interval closed a few ms early) the interval's integrals are shared out in
proportion to the time on each side, and the span is marked ``exact=False``; peaks (VRAM, RSS) are
then the interval's peak, which may have happened on the other side.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuledger.core.model import Event, GpuInterval, HostInterval

SETUP = "setup"
EPOCH = "epoch"
BETWEEN = "between epochs"
AFTER = "after training"
BOUNDARY_KINDS = ("epoch_start", "epoch_end", "phase")
SNAP_S = 0.05  # a boundary this close to an interval's edge is taken to be at the edge


@dataclass
class Span:
    phase: str
    epoch: int | None
    t0: float
    t1: float
    payload: dict[str, Any] = field(default_factory=dict)  # the epoch_end payload (images, train_s ...)


@dataclass
class SpanUsage:
    phase: str
    epoch: int | None
    t0: float
    t1: float
    wall_s: float
    gpu_busy_s: float | None = None  # summed over the run's GPUs (GPU-seconds)
    gpu_energy_j: float | None = None
    gpu_mem_peak_b: int | None = None  # highest device memory used, any GPU
    proc_gpu_mem_peak_b: int | None = None  # highest GPU memory held by the run's processes
    cpu_s: float | None = None  # process tree
    rss_peak_b: int | None = None
    images: int | None = None
    train_s: float | None = None  # the epoch's training part (without validation), when known
    images_per_s: float | None = None
    exact: bool = True
    payload: dict[str, Any] = field(default_factory=dict)


def _epoch_of(event: Event) -> int | None:
    try:
        return int(event.payload["epoch"])
    except (KeyError, TypeError, ValueError):
        return None


def spans(events: Iterable[Event], started_at: float, ended_at: float) -> list[Span]:
    """The run's time from ``started_at`` to ``ended_at`` divided at its boundary events."""
    marks = sorted((e for e in events if e.kind in BOUNDARY_KINDS), key=lambda e: e.t)
    out: list[Span] = []
    current = Span(SETUP, None, started_at, ended_at)

    def move_to(t: float, phase: str, epoch: int | None) -> Span:
        current.t1 = max(current.t0, min(t, ended_at))
        out.append(current)
        return Span(phase, epoch, current.t1, ended_at)

    for mark in marks:
        epoch = _epoch_of(mark)
        if mark.kind == "epoch_start":
            if current.phase == EPOCH and current.epoch == epoch:
                continue  # an epoch restarted (OOM retry, NaN recovery) stays one epoch
            current = move_to(mark.t, EPOCH, epoch)
        elif mark.kind == "epoch_end":
            if current.phase != EPOCH:  # no start seen: the epoch ran since the previous boundary
                current.phase, current.epoch = EPOCH, epoch
            current.payload = dict(mark.payload)
            current = move_to(mark.t, BETWEEN, None)
        else:
            current = move_to(mark.t, str(mark.payload.get("name") or mark.message or "phase"), None)
    out.append(current)
    # Time after the last epoch is not "between epochs": it belongs to the phase marked next
    # (e.g. saving the weights before the final validation), else it is "after training".
    last_epoch = max((i for i, s in enumerate(out) if s.phase == EPOCH), default=-1)
    for i in range(last_epoch + 1, len(out)):
        if out[i].phase == BETWEEN:
            following = out[i + 1].phase if i + 1 < len(out) else None
            out[i].phase = following if following not in (None, EPOCH, BETWEEN) else AFTER
    return out


def _snap(value: float, t0: float, t1: float, snap_s: float) -> float:
    edge = t0 if abs(value - t0) <= abs(value - t1) else t1
    return edge if abs(value - edge) <= snap_s else value


def _shares(t0: float, t1: float, edges: Sequence[float], snap_s: float) -> list[tuple[int, float]]:
    """(span index, share of the interval) for the spans an interval (t0, t1] overlaps.

    ``edges`` are the inner span boundaries (span i runs from edges[i-1] to edges[i]; the first and
    last spans are open-ended, so every interval is shared out whole). Boundaries are snapped to
    the interval's edges in order and never move backwards, so the spans still partition it.
    """
    if t1 <= t0:
        return [(sum(1 for e in edges if e <= t0), 1.0)]
    cuts, previous = [], -math.inf
    for edge in edges:
        previous = max(previous, _snap(edge, t0, t1, snap_s))
        cuts.append(previous)
    bounds = [-math.inf, *cuts, math.inf]
    shares = []
    for i in range(len(bounds) - 1):
        a, b = max(t0, bounds[i]), min(t1, bounds[i + 1])
        if b > a:
            shares.append((i, (b - a) / (t1 - t0)))
    return shares


def _add(current: float | None, value: float | None, share: float) -> float | None:
    if value is None:
        return current
    return (current or 0.0) + value * share


def _peak(current: int | None, value: int | None) -> int | None:
    if value is None:
        return current
    return value if current is None else max(current, value)


def account(
    events: Iterable[Event],
    gpu: Iterable[GpuInterval],
    host: Iterable[HostInterval],
    started_at: float,
    ended_at: float,
    snap_s: float = SNAP_S,
) -> list[SpanUsage]:
    """Usage per span, in time order. Integrals of all spans add up to the run's totals."""
    found = spans(events, started_at, ended_at)
    usage = [SpanUsage(s.phase, s.epoch, s.t0, s.t1, max(0.0, s.t1 - s.t0), payload=s.payload) for s in found]
    edges = [s.t1 for s in found[:-1]]
    for iv in gpu:
        for i, share in _shares(iv.t0, iv.t1, edges, snap_s):
            u = usage[i]
            u.exact = u.exact and math.isclose(share, 1.0)
            u.gpu_busy_s = _add(u.gpu_busy_s, iv.busy_s, share)
            u.gpu_energy_j = _add(u.gpu_energy_j, iv.energy_j, share)
            u.gpu_mem_peak_b = _peak(u.gpu_mem_peak_b, iv.mem_used_max_b)
            u.proc_gpu_mem_peak_b = _peak(u.proc_gpu_mem_peak_b, iv.proc_mem_max_b)
    for iv in host:
        for i, share in _shares(iv.t0, iv.t1, edges, snap_s):
            u = usage[i]
            u.exact = u.exact and math.isclose(share, 1.0)
            u.cpu_s = _add(u.cpu_s, iv.cpu_s, share)
            u.rss_peak_b = _peak(u.rss_peak_b, iv.rss_max_b)
    for u in usage:
        _throughput(u)
    return usage


def _throughput(u: SpanUsage) -> None:
    images = u.payload.get("images")
    train_s = u.payload.get("train_s")
    u.images = int(images) if isinstance(images, (int, float)) else None
    u.train_s = float(train_s) if isinstance(train_s, (int, float)) else None
    if u.images is None:
        return
    seconds = u.train_s if u.train_s else u.wall_s
    u.images_per_s = u.images / seconds if seconds > 0 else None


def totals(usage: Iterable[SpanUsage]) -> SpanUsage:
    """All spans summed (integrals) and maxed (peaks): equals the run's totals."""
    items = list(usage)
    total = SpanUsage(
        "total",
        None,
        min((u.t0 for u in items), default=0.0),
        max((u.t1 for u in items), default=0.0),
        sum(u.wall_s for u in items),
    )
    for u in items:
        total.gpu_busy_s = _add(total.gpu_busy_s, u.gpu_busy_s, 1.0)
        total.gpu_energy_j = _add(total.gpu_energy_j, u.gpu_energy_j, 1.0)
        total.cpu_s = _add(total.cpu_s, u.cpu_s, 1.0)
        total.gpu_mem_peak_b = _peak(total.gpu_mem_peak_b, u.gpu_mem_peak_b)
        total.proc_gpu_mem_peak_b = _peak(total.proc_gpu_mem_peak_b, u.proc_gpu_mem_peak_b)
        total.rss_peak_b = _peak(total.rss_peak_b, u.rss_peak_b)
        total.exact = total.exact and u.exact
        if u.images is not None:
            total.images = (total.images or 0) + u.images
    return total


def merge_phases(usage: Sequence[SpanUsage]) -> list[SpanUsage]:
    """Epoch spans one by one; other spans summed per phase (all "between epochs" in one row).

    Order: setup, epochs by number, then the other phases in the order they first occurred.
    """
    epochs: dict[int | None, SpanUsage] = {}
    others: dict[str, list[SpanUsage]] = {}
    for u in usage:
        if u.phase == EPOCH:
            epochs[u.epoch] = u if u.epoch not in epochs else _merge([epochs[u.epoch], u], EPOCH, u.epoch)
        else:
            others.setdefault(u.phase, []).append(u)
    rows = [_merge(others.pop(SETUP), SETUP, None)] if SETUP in others else []
    rows += [epochs[e] for e in sorted(epochs, key=lambda e: (e is None, e or 0))]
    rows += [_merge(group, phase, None) for phase, group in others.items()]
    return [r for r in rows if r.phase == EPOCH or r.wall_s > 0 or r.cpu_s or r.gpu_busy_s]


def _merge(items: list[SpanUsage], phase: str, epoch: int | None) -> SpanUsage:
    if len(items) == 1:
        return items[0]
    merged = totals(items)
    merged.phase, merged.epoch = phase, epoch
    return merged
