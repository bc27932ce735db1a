"""Everything a run report reads from the ledger, loaded once, fast for huge runs.

Small runs (at most ``core.metering.series.MAX_POINTS`` intervals per stream) are read interval by interval
and bucketed one interval per bucket: exact in every field. Bigger runs are bucketed by the
database (store/series_queries.py), so a 72-hour, 8-GPU, 1-second run reads 16,000 buckets
instead of 2 million rows. The summary, epoch figures and diagnosis then work on the buckets
(exact sums and peaks; per-epoch shares proportional where a boundary falls inside a bucket).
A run with raw days tiered into the ledger's series store (``Ledger.tiered``) is read whole once,
through the ledger, and bucketed in Python: the SQL paths would miss the tiered days.
"""

from __future__ import annotations

import bisect
import math
import os
import statistics
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpuledger.core.diagnosis.diagnose import RunFacts, Trace
from gpuledger.core.metering import series
from gpuledger.core.metering.summary import summarize
from gpuledger.core.model import Event, GpuIdentity, GpuInterval, HostInterval, Metric, RunRecord, run_is_open
from gpuledger.core.training import epochs as core_epochs
from gpuledger.runs import series_expired

if TYPE_CHECKING:
    from gpuledger.store import Ledger

MAP_KEYS = ("metrics/mAP50-95(B)", "metrics/mAP50-95(M)", "metrics/mAP50-95(P)", "metrics/mAP_0.5:0.95")
HISTORY_SCAN = 500  # earlier runs examined for the regression rule (newest first)


@dataclass
class RunData:
    run: RunRecord
    devices: list[GpuIdentity]
    plan: series.Plan
    gpu: dict[str, list[series.GpuBucket]]
    host: list[series.HostBucket]
    events: list[Event]
    metrics: list[Metric]
    counts: dict[str, Any]  # raw interval counts: {"gpu": {uuid: n}, "host": n}
    end: float  # where the measured time stops
    now: float
    summary: dict[str, Any] = field(default_factory=dict)
    # (run_id, uuid) -> day sums for pricing, of the streams the series pass summed (load(days=True))
    day_sums: dict[tuple[str, str], Any] = field(default_factory=dict)

    @property
    def downsampled(self) -> bool:
        return self.plan.width_s is not None

    def gpu_intervals(self) -> dict[str, list[GpuInterval]]:
        return {uuid: [b.merged for b in buckets] for uuid, buckets in self.gpu.items()}

    def host_intervals(self) -> list[HostInterval]:
        return [b.merged for b in self.host]


def load(
    ledger: Ledger, run: RunRecord, now: float | None = None, max_points: int = series.MAX_POINTS, days: bool = False
) -> RunData:
    """``days``: also the day sums the pricing needs, from the same pass over the intervals
    (``RunData.day_sums``; store/cost_queries.summed_streams hands them to the cost engine)."""
    from gpuledger.store import series_queries

    now = time.time() if now is None else now
    tiered = ledger.tiered(run.id)
    if tiered:  # raw days in the ledger's series store: SQL misses them, so read the run whole once
        gpu_ivs, host_ivs = ledger.gpu_intervals(run.id), ledger.host_intervals(run.id)
        counts = series_queries.counts_of(gpu_ivs, host_ivs)
    else:
        counts = series_queries.stream_counts(ledger, run.id)
    longest = max([counts["host"], *counts["gpu"].values()])
    origin = min(run.started_at, counts["t0"] if counts["t0"] is not None else run.started_at)
    end = _end(run, counts, now)
    plan = series.plan(origin, end, longest, max_points)
    day_sums: dict[tuple[str, str], Any] = {}
    if tiered:
        gpu, host = series.bucket_gpu(gpu_ivs, plan), series.bucket_host(host_ivs, plan)
    elif plan.width_s is None:
        gpu = series.bucket_gpu(ledger.gpu_intervals(run.id), plan)
        host = series.bucket_host(ledger.host_intervals(run.id), plan)
    else:
        # The host query runs beside the per-device GPU queries (sqlite3 releases the GIL).
        with ThreadPoolExecutor(max_workers=1) as pool:
            host_future = pool.submit(series_queries.bucketed_host, ledger, run.id, plan)
            gpu = series_queries.bucketed_gpu(
                ledger, run.id, plan, sorted(counts["gpu"]), days=day_sums if days else None
            )
            host = host_future.result()
    data = RunData(
        run, ledger.devices(run.id), plan, gpu, host, ledger.events(run.id), ledger.metrics(run.id), counts, end, now
    )
    data.day_sums = day_sums
    # A series-only run whose store dropped some days: the rows kept draw the curves of those days,
    # the day sums give the figures (runs/series_expired.py).
    expired = series_expired.summary(ledger, run, data.devices, now) if tiered else None
    data.summary = expired or _summary(data)
    return data


def _end(run: RunRecord, counts: dict[str, Any], now: float) -> float:
    if run_is_open(run.status, run.ended_at):
        return now
    if run.status == "lost" and counts["t1"] is not None:
        return counts["t1"]
    return run.ended_at if run.ended_at is not None else (counts["t1"] or now)


def _summary(data: RunData) -> dict[str, Any]:
    merged = [b.merged for buckets in data.gpu.values() for b in buckets]
    # A run still recording is summed up to its latest written interval, as show and cost do:
    # time the recorder has not written yet is not idle GPU time.
    measured = data.counts["t1"] if run_is_open(data.run.status, data.run.ended_at) else None
    summary = summarize(
        data.run, data.devices, merged, data.host_intervals(), now=measured if measured is not None else data.now
    )
    # Interval counts are the ledger's, not the buckets'.
    for g in summary["gpus"]:
        g["intervals"] = data.counts["gpu"].get(g["uuid"], 0)
    summary["intervals"] = max([data.counts["host"], *data.counts["gpu"].values()])
    return summary


# -- epochs ---------------------------------------------------------------------------------------


def epoch_rows(data: RunData) -> list[dict[str, Any]]:
    """Per epoch (and per other phase): resources and the epoch's training metrics, like
    ``gpuledger show``'s epoch table. From buckets: exact for small runs, proportional for big ones."""
    from gpuledger.reports.run.epochs import RESOURCE_KEYS, metrics_by_epoch

    by_epoch = metrics_by_epoch(data.metrics)
    has_marks = any(e.kind in core_epochs.BOUNDARY_KINDS for e in data.events)
    rows: list[dict[str, Any]] = []
    if has_marks:
        usage = account(data.events, data.gpu_intervals(), data.host_intervals(), data.run.started_at, data.end)
        for u in core_epochs.merge_phases(usage):
            row: dict[str, Any] = {"phase": u.phase, "epoch": u.epoch, "t0": u.t0, "t1": u.t1}
            row.update({k: getattr(u, k) for k in RESOURCE_KEYS})
            row["exact"] = u.exact and not data.downsampled
            row["metrics"] = dict(by_epoch.get(u.epoch, {})) if u.epoch is not None else {}
            rows.append(row)
    seen = {r["epoch"] for r in rows if r["phase"] == core_epochs.EPOCH}
    for epoch in sorted(set(by_epoch) - seen):
        rows.append(
            {
                "phase": core_epochs.EPOCH,
                "epoch": epoch,
                "t0": None,
                "t1": None,
                **dict.fromkeys(RESOURCE_KEYS),
                "exact": False,
                "metrics": dict(by_epoch[epoch]),
            }
        )
    return rows


def account(
    events: Sequence[Event],
    gpu: dict[str, list[GpuInterval]],
    host: Sequence[HostInterval],
    started_at: float,
    ended_at: float,
) -> list[core_epochs.SpanUsage]:
    """core.training.epochs.account's figures with a sorted sweep: that function checks every span for every
    interval, which takes seconds for a 72-hour run with a hundred epochs; here each interval
    looks only at the spans it overlaps (the tests check both agree)."""
    found = core_epochs.spans(events, started_at, ended_at)
    usage = [
        core_epochs.SpanUsage(s.phase, s.epoch, s.t0, s.t1, max(0.0, s.t1 - s.t0), payload=s.payload) for s in found
    ]
    starts = [s.t0 for s in found]

    def shares(t0: float, t1: float) -> list[tuple[int, float]]:
        i = max(0, bisect.bisect_right(starts, t0) - 1)
        if t1 <= t0:
            return [(i, 1.0)]
        out = []
        while i < len(found) and found[i].t0 < t1:
            a, b = max(t0, _snap(found[i].t0, t0, t1)), min(t1, _snap(found[i].t1, t0, t1))
            if b > a:
                out.append((i, (b - a) / (t1 - t0)))
            i += 1
        return out or [(0 if t1 <= found[0].t0 else len(found) - 1, 1.0)]

    for ivs in gpu.values():
        for iv in ivs:
            for i, share in shares(iv.t0, iv.t1):
                u = usage[i]
                u.exact = u.exact and math.isclose(share, 1.0)
                u.gpu_busy_s = _add(u.gpu_busy_s, iv.busy_s, share)
                u.gpu_energy_j = _add(u.gpu_energy_j, iv.energy_j, share)
                u.gpu_mem_peak_b = _peak(u.gpu_mem_peak_b, iv.mem_used_max_b)
                u.proc_gpu_mem_peak_b = _peak(u.proc_gpu_mem_peak_b, iv.proc_mem_max_b)
    for hv in host:
        for i, share in shares(hv.t0, hv.t1):
            u = usage[i]
            u.exact = u.exact and math.isclose(share, 1.0)
            u.cpu_s = _add(u.cpu_s, hv.cpu_s, share)
            u.rss_peak_b = _peak(u.rss_peak_b, hv.rss_max_b)
    for u in usage:
        images, train_s = u.payload.get("images"), u.payload.get("train_s")
        u.images = int(images) if isinstance(images, int | float) else None
        u.train_s = float(train_s) if isinstance(train_s, int | float) else None
        seconds = u.train_s or u.wall_s
        u.images_per_s = u.images / seconds if u.images is not None and seconds > 0 else None
    return usage


def _snap(value: float, t0: float, t1: float) -> float:
    edge = t0 if abs(value - t0) <= abs(value - t1) else t1
    return edge if abs(value - edge) <= core_epochs.SNAP_S else value


def _add(current: float | None, value: float | None, share: float) -> float | None:
    return current if value is None else (current or 0.0) + value * share


def _peak(current: int | None, value: int | None) -> int | None:
    return current if value is None else (value if current is None else max(current, value))


def best_map(metrics: Sequence[Metric]) -> float | None:
    for key in MAP_KEYS:
        values = [m.value for m in metrics if m.key == key and m.value == m.value]
        if values:
            return max(values)
    return None


def sec_per_epoch(events: Sequence[Event], started_at: float, end: float) -> tuple[int, float | None]:
    """(epochs, median epoch duration in seconds) from the epoch boundary events."""
    found = [s for s in core_epochs.spans(events, started_at, end) if s.phase == core_epochs.EPOCH]
    durations = [s.t1 - s.t0 for s in found if s.t1 > s.t0]
    return len(found), (statistics.median(durations) if durations else None)


# -- diagnosis input ------------------------------------------------------------------------------


def config_key(run: RunRecord) -> tuple[Any, ...] | None:
    """What "the same configuration" means for the regression rule: model, dataset, imgsz, batch,
    workers (from the integration's run.meta, else labels). None when nothing identifies it."""
    meta = run.meta or {}
    hp = meta.get("hyperparameters") if isinstance(meta.get("hyperparameters"), dict) else {}

    def pick(key: str) -> Any:
        value = meta.get(key, hp.get(key, run.labels.get(key)))
        if isinstance(value, dict):
            value = value.get("name") or value.get("source")
        return value

    key = tuple(pick(k) for k in ("model", "dataset", "imgsz", "batch", "workers"))
    return None if key[0] is None and key[1] is None else key


def facts_of(
    ledger: Ledger,
    run: RunRecord,
    metrics: Sequence[Metric] | None = None,
    events: Sequence[Event] | None = None,
    now: float | None = None,
    busy_gpu_h: float | None = None,
    cost: dict[str, Any] | bool | None = True,
) -> RunFacts:
    """A run's headline figures; busy GPU-hours from SQL totals unless given. ``cost``: the priced
    run when already known (None: not priced), True to ask the cost engine, False to skip it."""
    from gpuledger.reports.run import cost_hook as costhook

    end = run.ended_at or ledger.last_flush_t(run.id) or (time.time() if now is None else now)
    events = ledger.events(run.id) if events is None else events
    metrics = ledger.metrics(run.id) if metrics is None else metrics
    n, per_epoch = sec_per_epoch(events, run.started_at, end)
    if busy_gpu_h is None:
        from gpuledger.store.tiered_totals import gpu_busy  # tiered days included

        busy = [b for b in gpu_busy(ledger, run.id).values() if b is not None]
        busy_gpu_h = sum(busy) / 3600 if busy else None
    if cost is True:
        value = costhook.run_cost_value(ledger, run)
    else:
        value = costhook.cost_value(cost) if isinstance(cost, dict) else None
    return RunFacts(
        run.id,
        run.started_at,
        n,
        per_epoch,
        best_map(metrics),
        busy_gpu_h,
        value[0] if value else None,
        value[1] if value else None,
    )


def history(
    ledger: Ledger, run: RunRecord, gpu_name: str | None, limit: int = 5, with_cost: bool = True
) -> list[RunFacts]:
    """The latest ``limit`` earlier succeeded runs of the same configuration on the same GPU model."""
    key = config_key(run)
    if key is None:
        return []
    out: list[RunFacts] = []
    for other in ledger.list_runs(status="succeeded", limit=HISTORY_SCAN):
        if len(out) >= limit:
            break
        if other.id == run.id or other.started_at >= run.started_at or config_key(other) != key:
            continue
        names = {d.name for d in ledger.devices(other.id)}
        if gpu_name is not None and names and gpu_name not in names:
            continue
        out.append(facts_of(ledger, other, cost=with_cost))
    return out


def cpu_cores(run: RunRecord) -> int | None:
    """Cores the run could use: recorded by an integration, else this machine's when the run was
    recorded here (affinity-aware)."""
    for key in ("cpu_count", "cpu_cores"):
        value = (run.meta or {}).get(key)
        if isinstance(value, int) and value > 0:
            return value
    from gpuledger.runs.host import host_name

    if run.host == host_name():
        try:
            return len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            return os.cpu_count()
    return None


def trace_of(
    ledger: Ledger, data: RunData, with_history: bool = True, cost: dict[str, Any] | bool | None = False
) -> Trace:
    """The diagnosis input; ``cost`` as in facts_of (False: compare without money)."""
    gpu_name = data.devices[0].name if data.devices else None
    facts = None
    if with_history:
        facts = facts_of(
            ledger, data.run, data.metrics, data.events, data.now, data.summary.get("busy_gpu_hours"), cost=cost
        )
    return Trace(
        run=data.run,
        devices=data.devices,
        gpu=data.gpu_intervals(),
        host=data.host_intervals(),
        events=data.events,
        metrics=data.metrics,
        end=data.end,
        cpu_cores=cpu_cores(data.run),
        facts=facts,
        history=history(ledger, data.run, gpu_name, with_cost=cost is not False) if with_history else [],
    )
