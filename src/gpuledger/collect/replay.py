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
from gpuledger.collect.fake_nvml import Failing, FakeGpu, FakeNvml, TracePoint
from gpuledger.collect.fake_nvml_gpu import PID_TRANSLATIONS, PUTIL_QUIRKS
from gpuledger.collect.fake_nvml_profiles import IDLE_SAMPLING, PROFILES, REASON_BITS, SAMPLE_CLOCKS
from gpuledger.collect.nvml import NvmlCollector
from gpuledger.collect.nvml_util import host_boot_time
from gpuledger.core.model import ENERGY_COUNTER, UTIL_SAMPLES, GpuIdentity, GpuTick

FORMAT = "gpuledger-gpu-trace"
_POINT_KEYS = {"t", "gpu", "procs", "throttle", "energy_j"} | {
    "util_pct", "mem_used_b", "power_w", "temp_c", "sm_clock_mhz", "mem_clock_mhz",
}  # fmt: skip
_GPU_KEYS = {
    "uuid", "name", "memory_total_b", "memory_reserved_b", "power_limit_w", "pci_bus_id",
    "sample_period_s", "unsupported", "energy_offset_mj", "lost", "mig",
    # behaviours (docs/replay-format.md, "Hardware behaviour")
    "profile", "sampling", "buffer_len", "energy_update_s", "power_average_s", "sample_phase_s",
    "host_pid_offset", "pid_translation", "failing", "unsupported_fields", "process_quirks", "minor_number",
    "energy_stuck",
}  # fmt: skip
_MIG_KEYS = {"uuid", "profile", "memory_total_b", "gi", "ci", "process_memory"}
_FAILING_KEYS = {"call", "field", "from", "to"}


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
    header, header_line, points = _split(text, path.name)
    if header.get("format", FORMAT) != FORMAT:
        raise TraceError(f"{path.name}: header format is {header.get('format')!r}, expected {FORMAT!r}")
    times = (p.get("t") for _, p in points if isinstance(p, dict))
    t_first = min((float(t) for t in times if isinstance(t, (int, float)) and not isinstance(t, bool)), default=0.0)
    at = f"{path.name}:{header_line}" if header_line else f"{path.name}: header"
    _choice(header, "sample_clock", SAMPLE_CLOCKS, at)
    gpus = [_gpu(g, i, t_first, f"{at}: gpu {i}") for i, g in enumerate(header.get("gpus") or [])]
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


def _split(text: str, name: str) -> tuple[dict[str, Any], int | None, list[tuple[int, dict[str, Any]]]]:
    """The header, its line (None in a JSON document) and the numbered points."""
    try:
        doc = json.loads(text)  # one JSON document? (a JSON Lines file fails here, fast)
    except json.JSONDecodeError:
        doc = None
    if isinstance(doc, dict) and "points" in doc:
        header = doc.get("header") or {k: v for k, v in doc.items() if k != "points"}
        return header, None, [(i + 1, p) for i, p in enumerate(doc["points"])]
    rows: list[tuple[int, dict[str, Any]]] = []
    for n, line in enumerate(text.splitlines(), start=1):
        if line.strip() and not line.lstrip().startswith("#"):
            try:
                rows.append((n, json.loads(line)))
            except json.JSONDecodeError as exc:
                raise TraceError(f"{name}:{n}: not JSON ({exc.msg})") from exc
    if not rows or "gpus" not in rows[0][1]:
        raise TraceError(f"{name}: the first line must be the header, with a 'gpus' list")
    return rows[0][1], rows[0][0], rows[1:]


def _gpu(g: dict[str, Any], i: int, t_first: float, where: str) -> FakeGpu:
    _check_keys(g, _GPU_KEYS, where)
    if "uuid" not in g:
        raise TraceError(f"{where}: missing 'uuid'")
    slices = []
    for j, m in enumerate(_list(g, "mig", where)):
        at = f"{where} mig {j}"
        _check_keys(m, _MIG_KEYS, at)
        if "uuid" not in m:
            raise TraceError(f"{at}: missing 'uuid'")
        slices.append(
            FakeGpu(
                uuid=m["uuid"],
                mig_profile=m.get("profile"),
                memory_total_b=int(m.get("memory_total_b", 0)),
                gpu_instance_id=_int(m, "gi", at, minimum=0),
                compute_instance_id=_int(m, "ci", at, minimum=0) or 0,
                process_memory=_bool(m, "process_memory", at),
            )
        )
    plain = ("name", "memory_total_b", "memory_reserved_b", "pci_bus_id", "power_limit_w")
    return FakeGpu(
        uuid=g["uuid"],
        unsupported=frozenset(_list(g, "unsupported", where)),
        energy_offset_mj=int(g.get("energy_offset_mj", 0)),
        lost=[_window(w, t_first, f"{where} lost") for w in _list(g, "lost", where)],
        energy_stuck=[_window(w, t_first, f"{where} energy_stuck") for w in _list(g, "energy_stuck", where)],
        mig=slices,
        profile=_choice(g, "profile", tuple(PROFILES), where),
        sample_period_s=_number(g, "sample_period_s", where, positive=True),
        idle_sampling=_choice(g, "sampling", IDLE_SAMPLING, where),
        buffer_len=_int(g, "buffer_len", where, minimum=1),
        energy_update_s=_number(g, "energy_update_s", where),
        power_average_s=_number(g, "power_average_s", where),
        sample_phase_s=_number(g, "sample_phase_s", where),
        host_pid_offset=_int(g, "host_pid_offset", where),
        pid_translation=_choice(g, "pid_translation", PID_TRANSLATIONS, where),
        failing=[_failing(f, t_first, f"{where} failing {k}") for k, f in enumerate(_list(g, "failing", where))],
        unsupported_fields=frozenset(_ints(g, "unsupported_fields", where)),
        putil_quirks=frozenset(_subset(g, "process_quirks", PUTIL_QUIRKS, where)),
        minor_number=_int(g, "minor_number", where, minimum=0),
        **{k: g[k] for k in plain if k in g},
    )


def _window(w: Any, t_first: float, where: str) -> tuple[float, float]:
    if not (isinstance(w, list) and len(w) == 2 and all(isinstance(x, (int, float)) for x in w) and w[0] <= w[1]):
        raise TraceError(f"{where}: each window is [from, to] in seconds, got {w!r}")
    return float(w[0]) - t_first, float(w[1]) - t_first


def _failing(f: Any, t_first: float, where: str) -> Failing:
    _check_keys(f, _FAILING_KEYS, where)
    if ("call" in f) == ("field" in f):
        raise TraceError(f"{where}: give one of 'call' (an NVML function name) or 'field' (a field id)")
    target: str | int
    if "call" in f:
        if not isinstance(f["call"], str) or not f["call"].startswith("nvml"):
            raise TraceError(f"{where}: 'call' must be an NVML function name, got {f['call']!r}")
        target = f["call"]
    else:
        target = _int(f, "field", where, minimum=0) or 0
    start, end = _number(f, "from", where, minimum=None), _number(f, "to", where, minimum=None)
    return Failing(target, None if start is None else start - t_first, None if end is None else end - t_first)


def _list(obj: dict[str, Any], key: str, where: str) -> list[Any]:
    value = obj.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise TraceError(f"{where}: '{key}' must be a list, got {value!r}")
    return value


def _number(obj: dict[str, Any], key: str, where: str, minimum: float | None = 0.0, positive: bool = False) -> Any:
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TraceError(f"{where}: '{key}' must be a number, got {value!r}")
    if (positive and value <= 0) or (minimum is not None and value < minimum):
        raise TraceError(f"{where}: '{key}' must be {'above' if positive else 'at least'} {minimum}, got {value!r}")
    return float(value)


def _bytes(obj: dict[str, Any], key: str, where: str) -> int | None:
    value = _number(obj, key, where)
    return None if value is None else int(value)


def _int(obj: dict[str, Any], key: str, where: str, minimum: int | None = None) -> Any:
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TraceError(f"{where}: '{key}' must be a whole number, got {value!r}")
    if minimum is not None and value < minimum:
        raise TraceError(f"{where}: '{key}' must be at least {minimum}, got {value!r}")
    return value


def _ints(obj: dict[str, Any], key: str, where: str) -> list[int]:
    values = _list(obj, key, where)
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
        raise TraceError(f"{where}: '{key}' must list field ids (whole numbers), got {values!r}")
    return values


def _bool(obj: dict[str, Any], key: str, where: str) -> bool | None:
    value = obj.get(key)
    if value is not None and not isinstance(value, bool):
        raise TraceError(f"{where}: '{key}' must be true or false, got {value!r}")
    return value


def _choice(obj: dict[str, Any], key: str, choices: tuple[str, ...], where: str) -> Any:
    value = obj.get(key)
    if value is not None and value not in choices:
        raise TraceError(f"{where}: '{key}' must be one of {', '.join(choices)}, got {value!r}")
    return value


def _subset(obj: dict[str, Any], key: str, choices: frozenset[str], where: str) -> list[str]:
    values = _list(obj, key, where)
    unknown = sorted(str(v) for v in values if v not in choices)
    if unknown:
        raise TraceError(
            f"{where}: '{key}' has unknown value(s) {', '.join(unknown)} (known: {', '.join(sorted(choices))})"
        )
    return values


def _point(p: dict[str, Any], t_first: float, where: str) -> TracePoint:
    _check_keys(p, _POINT_KEYS, where)
    if "t" not in p:
        raise TraceError(f"{where}: point without 't'")
    t = _number(p, "t", where, minimum=None)
    procs = None
    if "procs" in p:
        procs = {}
        table = p["procs"] or {}
        if not isinstance(table, dict):
            raise TraceError(f"{where}: 'procs' must be an object of pid: {{mem_b, sm_pct}}")
        for key, v in table.items():
            if key != "run" and not key.isdigit():
                raise TraceError(f'{where}: process key {key!r} is neither a pid nor "run"')
            _check_keys(v, {"mem_b", "sm_pct"}, f"{where} process {key}")
            pid: int | str = key if key == "run" else int(key)
            at = f"{where} process {key}"
            procs[pid] = (_bytes(v, "mem_b", at), _number(v, "sm_pct", at))
    throttle = tuple(_subset(p, "throttle", frozenset(REASON_BITS), where)) if "throttle" in p else None
    plain = {k: _number(p, k, where) for k in ("util_pct", "power_w", "energy_j") if k in p}
    if "temp_c" in p:
        plain["temp_c"] = _number(p, "temp_c", where, minimum=None)
    plain.update({k: _number(p, k, where) for k in ("sm_clock_mhz", "mem_clock_mhz") if k in p})
    if "util_pct" in p and plain["util_pct"] is not None and plain["util_pct"] > 100:
        raise TraceError(f"{where}: 'util_pct' is a percentage, got {p['util_pct']!r}")
    mem = _bytes(p, "mem_used_b", where)
    return TracePoint(t=t - t_first, throttle=throttle, procs=procs, mem_used_b=mem, **plain)


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

    def read(self, pids: set[int], now: float, closes_interval: bool = True, final: bool = False) -> GpuRead:
        self.fake.run_pids = pids
        return self._inner.read(pids, now, closes_interval, final)

    def close(self) -> None:
        self._inner.close()


def open_replay(
    trace: str | Path,
    visible: str | None,
    clock: Callable[[], float] = time.time,
    boot: Callable[[], float | None] = host_boot_time,
) -> ReplayCollector:
    """Start replaying now: the trace's first point is this moment. ``boot``: the host's boot
    clock, which a trace's ``sample_clock: boot`` stamps samples with, as the collector reads it."""
    header, gpus = load_trace(trace)
    fake = FakeNvml(
        gpus,
        clock=clock,
        start=clock(),
        driver_version=str(header.get("driver_version", "550.54.15")),
        cuda_version=_cuda_int(header.get("cuda_version")),
        sample_clock=header.get("sample_clock") or "wall",
        boot_clock=boot,
    )
    return ReplayCollector(fake, NvmlCollector(nvml=fake, visible=visible, clock=clock, source="replay", boot=boot))


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
