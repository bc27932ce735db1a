"""The time-series charts of a run report, as plain data (the HTML draws them; JSON carries them).

A chart: ``{"id", "title", "group", "x": [epoch seconds], "series": [{"label", "unit", "values",
"lo", "hi", "gpu", "dash"}]}``. ``values`` is the line (mean for integrals, peak for gauges);
``lo`` / ``hi`` the min/max envelope of the intervals in each bucket (drawn as a band), present
when the run is downsampled, so a 1-second spike or drop is never averaged away. Absent
measurements are null (a gap), never 0. Values are rounded to what a chart can show.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from gpuledger.core.metering.series import GpuBucket, HostBucket, Plan, x_of
from gpuledger.core.model import GpuIdentity
from gpuledger.reports.run.data import RunData
from gpuledger.reports.run.epochs import NOT_TRAINING_METRICS

GIB = 2**30
MB = 1e6
PERF_THROTTLE = ("power", "thermal", "hw_slowdown", "hw_power_brake", "board_limit", "reliability")


def _r(value: float | int | None, digits: int) -> float | None:
    if value is None:
        return None
    value = round(float(value), digits)
    return value if value - value == 0 else None  # NaN and inf are not JSON numbers: a gap


def _finite(value: float) -> float | None:
    return value if value - value == 0 else None


def _series(
    label: str,
    unit: str,
    values: list,
    lo: list | None = None,
    hi: list | None = None,
    gpu: int | None = None,
    dash: bool = False,
) -> dict[str, Any]:
    out: dict[str, Any] = {"label": label, "unit": unit, "values": values}
    if lo is not None and any(v is not None for v in lo):
        out["lo"], out["hi"] = lo, hi
    if gpu is not None:
        out["gpu"] = gpu
    if dash:
        out["dash"] = True
    return out


class _GpuGrid:
    """The shared x axis of the GPU charts and one value list per device and field."""

    def __init__(self, data: RunData) -> None:
        self.plan: Plan = data.plan
        self.data = data
        xs_of = {u: [round(x_of(b, self.plan), 3) for b in bs] for u, bs in data.gpu.items()}
        self.x = sorted({x for xs in xs_of.values() for x in xs})
        where = {x: i for i, x in enumerate(self.x)}
        self.pos = {u: [where[x] for x in xs] for u, xs in xs_of.items()}  # bucket -> position on x
        self.devices = _device_order(data.devices, list(data.gpu))

    def column(self, uuid: str, get: Callable[[GpuBucket], Any], digits: int) -> list[Any]:
        out: list[Any] = [None] * len(self.x)
        # _r inlined: 100 columns of 2,000 buckets in a big run's report
        for i, b in zip(self.pos.get(uuid, []), self.data.gpu.get(uuid, []), strict=True):
            value = get(b)
            if value is not None:
                value = round(float(value), digits)
                out[i] = value if value - value == 0 else None
        return out

    def label(self, uuid: str) -> tuple[str, int | None]:
        dev = next((d for d in self.data.devices if d.uuid == uuid), None)
        return (f"GPU {dev.index}", dev.index) if dev else (f"GPU {uuid[:12]}", None)


def _device_order(devices: Sequence[GpuIdentity], uuids: list[str]) -> list[str]:
    index = {d.uuid: d.index for d in devices}
    return sorted(uuids, key=lambda u: (index.get(u, 1 << 30), u))


def gpu_charts(data: RunData) -> list[dict[str, Any]]:
    if not data.gpu:
        return []
    grid = _GpuGrid(data)
    band = data.downsampled
    charts = []

    def chart(cid: str, title: str, make: Callable[[str, str, int | None], list[dict[str, Any]]]) -> None:
        series = [s for uuid in grid.devices for s in make(uuid, *grid.label(uuid))]
        if any(any(v is not None for v in s["values"]) for s in series):
            charts.append({"id": cid, "title": title, "group": "gpu", "x": grid.x, "series": series})

    def pct(value: float | None) -> float | None:
        return None if value is None else value * 100

    chart(
        "gpu_util",
        "GPU utilisation (busy share; band: least and most busy interval)",
        lambda u, lbl, i: [
            _series(
                lbl,
                "%",
                grid.column(u, lambda b: pct(b.util_mean), 1),
                grid.column(u, lambda b: pct(b.util_min), 1) if band else None,
                grid.column(u, lambda b: pct(b.util_max), 1) if band else None,
                i,
            )
        ],
    )
    chart(
        "vram",
        "GPU memory: device (solid) and this run's processes (dashed)",
        lambda u, lbl, i: [
            _series(
                lbl,
                "GiB",
                grid.column(u, lambda b: _gib(b.merged.mem_used_max_b), 3),
                grid.column(u, lambda b: _gib(b.mem_min_b), 3) if band else None,
                grid.column(u, lambda b: _gib(b.merged.mem_used_max_b), 3) if band else None,
                i,
            ),
            _series(f"{lbl} run", "GiB", grid.column(u, lambda b: _gib(b.merged.proc_mem_max_b), 3), gpu=i, dash=True),
        ],
    )
    chart(
        "power",
        "GPU power (peak per interval)",
        lambda u, lbl, i: [_series(lbl, "W", grid.column(u, lambda b: b.merged.power_max_w, 1), gpu=i)],
    )
    chart(
        "temp",
        "GPU temperature (peak)",
        lambda u, lbl, i: [_series(lbl, "°C", grid.column(u, lambda b: b.merged.temp_max_c, 1), gpu=i)],
    )
    chart(
        "clocks",
        "SM clock (mean; band down to the lowest interval)",
        lambda u, lbl, i: [
            _series(
                lbl,
                "MHz",
                grid.column(u, lambda b: b.merged.sm_clock_avg_mhz, 0),
                grid.column(u, lambda b: b.sm_clock_min_mhz, 0) if band else None,
                grid.column(u, lambda b: b.merged.sm_clock_avg_mhz, 0) if band else None,
                i,
            )
        ],
    )
    chart(
        "throttle",
        "Throttled by power or thermal limits (share of time)",
        lambda u, lbl, i: [_series(lbl, "%", grid.column(u, _throttle_pct, 1), gpu=i)],
    )
    return charts


def _gib(value: int | None) -> float | None:
    return None if value is None else value / GIB


def _throttle_pct(b: GpuBucket) -> float | None:
    t = b.merged.throttle_s
    if t is None or b.covered_s <= 0:
        return None
    return min(100.0, 100 * sum(s for r, s in t.items() if r in PERF_THROTTLE) / b.covered_s)


def host_charts(data: RunData, cpu_cores: int | None) -> list[dict[str, Any]]:
    if not data.host:
        return []
    plan, band = data.plan, data.downsampled
    x = [round(x_of(b, plan), 3) for b in data.host]

    def col(get: Callable[[HostBucket], Any], digits: int) -> list[Any]:
        values = [get(b) for b in data.host]
        return [None if v is None else _finite(round(float(v), digits)) for v in values]

    def rate(get: Callable[[HostBucket], Any], scale: float = 1.0) -> Callable[[HostBucket], Any]:
        def f(b: HostBucket) -> float | None:
            v = get(b)
            return None if v is None or b.covered_s <= 0 else v / b.covered_s / scale

        return f

    cpu = [
        _series(
            "training processes",
            "cores",
            col(rate(lambda b: b.merged.cpu_s), 2),
            col(lambda b: b.cpu_rate_min, 2) if band else None,
            col(lambda b: b.cpu_rate_max, 2) if band else None,
        ),
        _series("host iowait", "cores", col(rate(lambda b: b.merged.iowait_s), 2), dash=True),
    ]
    if cpu_cores:
        cpu.append(
            _series(
                "whole host",
                "cores",
                col(lambda b: _scale(b.merged.sys_cpu_util_avg_pct, cpu_cores / 100), 2),
                dash=True,
            )
        )
    else:
        cpu.append(_series("whole host", "%", col(lambda b: b.merged.sys_cpu_util_avg_pct, 1), dash=True))
    charts = [
        {
            "id": "cpu",
            "title": "CPU" + (f" ({cpu_cores} cores)" if cpu_cores else ""),
            "group": "host",
            "x": x,
            "series": cpu,
        },
        {
            "id": "ram",
            "title": "Memory: training processes (RSS) and whole host",
            "group": "host",
            "x": x,
            "series": [
                _series(
                    "training processes",
                    "GiB",
                    col(lambda b: _gib(b.merged.rss_max_b), 3),
                    col(lambda b: _gib(b.rss_min_b), 3) if band else None,
                    col(lambda b: _gib(b.merged.rss_max_b), 3) if band else None,
                ),
                _series("whole host", "GiB", col(lambda b: _gib(b.merged.sys_mem_used_max_b), 3), dash=True),
            ],
        },
        {
            "id": "disk",
            "title": "Storage I/O",
            "group": "host",
            "x": x,
            "series": [
                _series("processes read", "MB/s", col(rate(lambda b: b.merged.read_b, MB), 3)),
                _series("processes write", "MB/s", col(rate(lambda b: b.merged.write_b, MB), 3)),
                _series("host disk read", "MB/s", col(rate(lambda b: b.merged.disk_read_b, MB), 3), dash=True),
                _series("host disk write", "MB/s", col(rate(lambda b: b.merged.disk_write_b, MB), 3), dash=True),
            ],
        },
        {
            "id": "net",
            "title": "Network (host)",
            "group": "host",
            "x": x,
            "series": [
                _series("received", "MB/s", col(rate(lambda b: b.merged.net_rx_b, MB), 3)),
                _series("sent", "MB/s", col(rate(lambda b: b.merged.net_tx_b, MB), 3)),
            ],
        },
    ]
    return [c for c in charts if any(any(v is not None for v in s["values"]) for s in c["series"])]


def _scale(value: float | None, factor: float) -> float | None:
    return None if value is None else value * factor


METRIC_GROUPS = (
    ("losses", "Training losses", lambda k: "loss" in k.lower()),
    ("quality", "Validation metrics (mAP, precision, recall)", lambda k: k.startswith("metrics/")),
    ("lr", "Learning rate", lambda k: k.startswith("lr/") or k == "lr"),
    ("other_metrics", "Other metrics", lambda k: True),
)
MAX_METRIC_POINTS = 2000


def metric_charts(data: RunData) -> list[dict[str, Any]]:
    """Training metrics on the run's time axis: an epoch's metrics at its epoch_end."""
    epoch_t = {}
    for e in data.events:
        if e.kind == "epoch_end" and isinstance(e.payload.get("epoch"), int):
            epoch_t[e.payload["epoch"]] = e.t
    by_key: dict[str, dict[float, float]] = {}
    for m in data.metrics:
        if m.key in NOT_TRAINING_METRICS:
            continue
        t = epoch_t.get(m.epoch, m.t) if m.epoch is not None else m.t
        by_key.setdefault(m.key, {})[round(t, 3)] = m.value
    groups: dict[str, list[str]] = {}
    for key in sorted(by_key):
        gid = next(g for g, _, test in METRIC_GROUPS if test(key))
        groups.setdefault(gid, []).append(key)
    charts = []
    for gid, title, _ in METRIC_GROUPS:
        keys = groups.get(gid)
        if not keys:
            continue
        points = {k: _thin(by_key[k]) for k in keys}
        x = sorted({t for p in points.values() for t in p})
        charts.append(
            {
                "id": gid,
                "title": title,
                "group": "metrics",
                "x": x,
                "series": [_series(k, "", [_significant(points[k].get(t)) for t in x]) for k in keys],
            }
        )
    return charts


def _significant(value: float | None, digits: int = 6) -> float | None:
    """A metric for the chart: six significant digits, so a learning rate of 1e-7 is not rounded to 0."""
    if value is None:
        return None
    value = float(f"{value:.{digits}g}")
    return value if value - value == 0 else None  # NaN and inf are not JSON numbers: a gap


def _thin(points: dict[float, float]) -> dict[float, float]:
    """Step metrics of a long run: keep each bucket's lowest and highest point (M4-like)."""
    from gpuledger.core.metering.series import minmax_points

    if len(points) <= MAX_METRIC_POINTS:
        return points
    return dict(minmax_points(sorted(points.items()), MAX_METRIC_POINTS // 2))


def all_charts(data: RunData, cpu_cores: int | None) -> list[dict[str, Any]]:
    return gpu_charts(data) + host_charts(data, cpu_cores) + metric_charts(data)
