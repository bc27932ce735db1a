"""Replay mode: ``gpuledger run --replay-gpus TRACE -- CMD``.

A recorded or hand-written per-GPU trace (format: docs/replay-format.md) drives a
:class:`~gpuledger.collect.fake_nvml.FakeNvml`, and the *same* :class:`NvmlCollector` that reads
real GPUs reads it, in real time alongside CMD. The trace's time axis is shifted so its first
point is the moment the replay opens (the recording start); values are stepped (each point holds
until the next), and the last point holds for as long as CMD outlives the trace. Devices are
marked ``source="replay"``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Sequence
from importlib import resources
from pathlib import Path
from typing import IO, Any

from gpuledger.collect.base import GpuCollector, GpuRead
from gpuledger.collect.fake_nvml import FakeGpu, FakeNvml, TracePoint
from gpuledger.collect.nvml import NvmlCollector
from gpuledger.core.model import ENERGY_COUNTER, UTIL_SAMPLES, GpuIdentity, GpuTick

FORMAT = "gpuledger-gpu-trace"
_POINT_KEYS = {"t", "gpu", "procs", "throttle", "energy_j"} | {
    "util_pct", "mem_used_b", "power_w", "temp_c", "sm_clock_mhz", "mem_clock_mhz",
}  # fmt: skip
_GPU_KEYS = {
    "uuid", "name", "memory_total_b", "memory_reserved_b", "power_limit_w", "pci_bus_id",
    "sample_period_s", "unsupported", "energy_offset_mj", "lost", "mig",
}  # fmt: skip
_MIG_KEYS = {"uuid", "profile", "memory_total_b"}


class TraceError(ValueError):
    """The trace file cannot be used; the message says where and why."""


def packaged_traces() -> list[str]:
    """Names of the traces shipped with gpuledger (usable in place of a path)."""
    folder = resources.files("gpuledger.collect").joinpath("traces")
    return sorted(p.name.removesuffix(".jsonl") for p in folder.iterdir() if p.name.endswith(".jsonl"))


def resolve_trace(trace: str | Path) -> Path:
    """A path to an existing file, or the name of a packaged trace (``"a100x2-example"``)."""
    path = Path(trace)
    if path.is_file():
        return path
    packaged = resources.files("gpuledger.collect").joinpath("traces", f"{trace}.jsonl")
    if packaged.is_file():
        return Path(str(packaged))
    raise TraceError(f"no such file, and no packaged trace of that name (packaged: {', '.join(packaged_traces())})")


def load_trace(trace: str | Path) -> tuple[dict[str, Any], list[FakeGpu]]:
    """Parse a trace into its header and the FakeGpus it scripts (time axis starting at 0)."""
    path = resolve_trace(trace)
    text = path.read_text(encoding="utf-8")
    header, points = _split(text, path.name)
    if header.get("format", FORMAT) != FORMAT:
        raise TraceError(f"{path.name}: header format is {header.get('format')!r}, expected {FORMAT!r}")
    t_first = min((float(p["t"]) for _, p in points if isinstance(p, dict) and "t" in p), default=0.0)
    gpus = [_gpu(g, i, t_first) for i, g in enumerate(header.get("gpus") or [])]
    if not gpus:
        raise TraceError(f"{path.name}: the header lists no GPU")
    by_ref: dict[Any, FakeGpu] = {}
    for i, g in enumerate(gpus):
        by_ref[i] = by_ref[g.uuid] = g
        by_ref.update({s.uuid: s for s in g.mig})
    for line, p in points:
        gpu = by_ref.get(p.get("gpu"))
        if gpu is None:
            raise TraceError(f"{path.name}:{line}: point for unknown gpu {p.get('gpu')!r}")
        gpu.points.append(_point(p, t_first, f"{path.name}:{line}"))
    return header, gpus


def _split(text: str, name: str) -> tuple[dict[str, Any], list[tuple[int, dict[str, Any]]]]:
    try:
        doc = json.loads(text)  # one JSON document? (a JSON Lines file fails here, fast)
    except json.JSONDecodeError:
        doc = None
    if isinstance(doc, dict) and "points" in doc:
        header = doc.get("header") or {k: v for k, v in doc.items() if k != "points"}
        return header, [(i + 1, p) for i, p in enumerate(doc["points"])]
    rows: list[tuple[int, dict[str, Any]]] = []
    for n, line in enumerate(text.splitlines(), start=1):
        if line.strip() and not line.lstrip().startswith("#"):
            try:
                rows.append((n, json.loads(line)))
            except json.JSONDecodeError as exc:
                raise TraceError(f"{name}:{n}: not JSON ({exc.msg})") from exc
    if not rows or "gpus" not in rows[0][1]:
        raise TraceError(f"{name}: the first line must be the header, with a 'gpus' list")
    return rows[0][1], rows[1:]


def _gpu(g: dict[str, Any], i: int, t_first: float) -> FakeGpu:
    _check_keys(g, _GPU_KEYS, f"header gpu {i}")
    if "uuid" not in g:
        raise TraceError(f"header gpu {i}: missing 'uuid'")
    slices = []
    for j, m in enumerate(g.get("mig") or []):
        _check_keys(m, _MIG_KEYS, f"header gpu {i} mig {j}")
        slices.append(
            FakeGpu(uuid=m["uuid"], mig_profile=m.get("profile"), memory_total_b=int(m.get("memory_total_b", 0)))
        )
    plain = ("name", "memory_total_b", "memory_reserved_b", "pci_bus_id", "power_limit_w", "sample_period_s")
    return FakeGpu(
        uuid=g["uuid"],
        unsupported=frozenset(g.get("unsupported") or ()),
        energy_offset_mj=int(g.get("energy_offset_mj", 0)),
        lost=[(float(a) - t_first, float(b) - t_first) for a, b in g.get("lost") or []],
        mig=slices,
        **{k: g[k] for k in plain if k in g},
    )


def _point(p: dict[str, Any], t_first: float, where: str) -> TracePoint:
    _check_keys(p, _POINT_KEYS, where)
    if "t" not in p:
        raise TraceError(f"{where}: point without 't'")
    procs = None
    if "procs" in p:
        procs = {}
        for key, v in (p["procs"] or {}).items():
            pid: int | str = key if key == "run" else int(key)
            procs[pid] = (v.get("mem_b"), v.get("sm_pct"))
    throttle = tuple(p["throttle"]) if "throttle" in p else None
    plain = {k: p[k] for k in ("util_pct", "mem_used_b", "power_w", "energy_j", "temp_c") if k in p}
    plain.update({k: p[k] for k in ("sm_clock_mhz", "mem_clock_mhz") if k in p})
    return TracePoint(t=float(p["t"]) - t_first, throttle=throttle, procs=procs, **plain)


def _check_keys(obj: Any, allowed: set[str], where: str) -> None:
    if not isinstance(obj, dict):
        raise TraceError(f"{where}: expected a JSON object")
    unknown = set(obj) - allowed
    if unknown:
        raise TraceError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")


def _cuda_int(v: Any) -> int:
    """ "12.4" -> 12040 (NVML's encoding)."""
    if isinstance(v, int):
        return v
    major, _, minor = str(v or "12.4").partition(".")
    return int(major) * 1000 + int(minor or 0) * 10


class ReplayCollector:
    """NvmlCollector over a FakeNvml; tells the fake the run's pids so ``"run"`` processes match."""

    def __init__(self, fake: FakeNvml, inner: NvmlCollector) -> None:
        self.fake, self._inner = fake, inner

    def devices(self) -> list[GpuIdentity]:
        return self._inner.devices()

    def read(self, pids: set[int], now: float) -> GpuRead:
        self.fake.run_pids = pids
        return self._inner.read(pids, now)

    def close(self) -> None:
        self._inner.close()


def open_replay(trace: str | Path, visible: str | None, clock: Callable[[], float] = time.time) -> ReplayCollector:
    """Start replaying now: the trace's first point is this moment."""
    header, gpus = load_trace(trace)
    fake = FakeNvml(
        gpus,
        clock=clock,
        start=clock(),
        driver_version=str(header.get("driver_version", "550.54.15")),
        cuda_version=_cuda_int(header.get("cuda_version")),
    )
    return ReplayCollector(fake, NvmlCollector(nvml=fake, visible=visible, clock=clock, source="replay"))


# -- recording ---------------------------------------------------------------------------------
def record_trace(
    collector: GpuCollector,
    out: str | Path | IO[str],
    *,
    seconds: float,
    interval_s: float = 1.0,
    pids: Iterable[int] = (),
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Read ``collector`` every ``interval_s`` for ``seconds`` and write a replayable trace.

    Returns the number of points written. The run's processes (``pids``) are written as
    ``"run"``. A series the GPU never reported is left out, so replaying it is absent too.
    """
    pid_set = set(pids)
    start = clock()
    ticks: list[GpuTick] = []
    collector.read(pid_set, start)  # primes the cursors
    while clock() - start < seconds:
        sleep(interval_s)
        ticks.extend(collector.read(pid_set, clock()).ticks)
    lines = trace_lines(collector.devices(), ticks, start)
    text = "".join(json.dumps(line, separators=(",", ":")) + "\n" for line in lines)
    if isinstance(out, (str, Path)):
        Path(out).write_text(text, encoding="utf-8")
    else:
        out.write(text)
    return len(lines) - 1


def trace_lines(devices: Sequence[GpuIdentity], ticks: Sequence[GpuTick], t_start: float) -> list[dict[str, Any]]:
    """The JSON objects of a trace (header first) for ticks read from ``devices``.

    A tick (t0, t1] becomes a point at t0: its integrals (busy, energy) hold until t1. Gauges
    (memory, temperature, clocks, processes) are readings at an instant, so a point carries the
    reading taken at its own time t0 — the previous tick's — and a closing point at the last t1
    carries the last reading: a replay read at the same moments sees the same gauges.
    """
    first = devices[0] if devices else None
    header: dict[str, Any] = {"format": FORMAT, "version": 1, "gpus": []}
    if first is not None:
        header["driver_version"] = first.driver_version
        header["cuda_version"] = first.cuda_version
    points: list[dict[str, Any]] = []
    for d in devices:
        mine = [t for t in ticks if t.uuid == d.uuid]
        header["gpus"].append(_header_gpu(d, mine))
        energy = 0.0
        for i, t in enumerate(mine):
            points.append(_trace_point(t, mine[i - 1] if i else t, t.t0 - t_start, energy))
            energy += t.energy_j or 0.0
        if mine:
            points.append(_trace_point(mine[-1], mine[-1], mine[-1].t1 - t_start, energy))
    points.sort(key=lambda p: p["t"])
    return [header, *points]


def _header_gpu(d: GpuIdentity, ticks: Sequence[GpuTick]) -> dict[str, Any]:
    g: dict[str, Any] = {"uuid": d.uuid, "name": d.name}
    for key in ("memory_total_b", "power_limit_w", "pci_bus_id"):
        if getattr(d, key) is not None:
            g[key] = getattr(d, key)
    unsupported = []
    if not any(t.util_method == UTIL_SAMPLES for t in ticks):
        unsupported.append("nvmlDeviceGetSamples")  # replay the instant method it was read with
    if not any(t.energy_method == ENERGY_COUNTER for t in ticks):
        unsupported.append("nvmlDeviceGetTotalEnergyConsumption")
    if unsupported:
        g["unsupported"] = unsupported
    return g


def _trace_point(t: GpuTick, gauges: GpuTick, at: float, energy_before_j: float) -> dict[str, Any]:
    """A point at ``at`` with ``t``'s integrals and ``gauges``' readings."""
    span = t.t1 - t.t0
    p: dict[str, Any] = {"t": round(at, 6), "gpu": t.uuid}
    if t.busy_s is not None and span > 0:
        p["util_pct"] = round(min(100.0, 100.0 * t.busy_s / span), 3)
    power = t.power_w
    if t.energy_method == ENERGY_COUNTER:
        p["energy_j"] = round(energy_before_j, 3)
    if t.energy_j is not None and span > 0:
        power = round(t.energy_j / span, 3)  # the point holds for the tick: its mean power, not a reading
    if power is not None:
        p["power_w"] = power
    for key, value in (
        ("mem_used_b", gauges.mem_used_b), ("temp_c", gauges.temp_c),
        ("sm_clock_mhz", gauges.sm_clock_mhz), ("mem_clock_mhz", gauges.mem_clock_mhz),
    ):  # fmt: skip
        if value is not None:
            p[key] = value
    if t.throttle_s is not None:  # a reason active for at least half the tick counts as on
        p["throttle"] = sorted(r for r, s in t.throttle_s.items() if s >= span / 2)
    if gauges.proc_mem_b is not None or gauges.proc_sm_util_pct is not None:
        p["procs"] = {"run": {"mem_b": gauges.proc_mem_b, "sm_pct": gauges.proc_sm_util_pct}}
    return p
