"""A scripted NVML: the pynvml functions gpuledger uses, driven by per-GPU traces and a clock.

Public, like httpx's ``MockTransport``: tests and ``--replay-gpus`` hand a ``FakeNvml`` to the
real :class:`~gpuledger.collect.nvml.NvmlCollector` in place of the ``pynvml`` module. It has
the same function names, constants and error classes (pynvml's own classes, so
``except pynvml.NVMLError_NotSupported`` behaves identically) and returns objects with the
same attribute names as pynvml's ctypes structs (``ctypes_structs=True`` returns the real
structs, slower).

Trace semantics (all times are *trace seconds*: ``clock() - start``):

* A point's values hold from its ``t`` until the next point (stepped, sample-and-hold); the last
  point holds for ever; before the first point the first point's values apply.
* A field missing (None) on a point keeps the previous point's value. A field missing on every
  point of a GPU makes its NVML function raise ``NVMLError_NotSupported`` — absent, never 0.
* The utilisation sample buffer has one sample every ``sample_period_s`` on a fixed grid, each
  the mean utilisation over its period rounded to an integer percent (what the driver reports),
  with microsecond timestamps; the last ``buffer_len`` samples are kept.
* Energy: when points carry ``energy_j`` (a cumulative counter) it is exact at each point and
  advances at the point's power between points (a drop between points is a counter reset).
  Without it the counter is the exact integral of the stepped power. Read in millijoules, plus
  ``energy_offset_mj``, modulo 2**64 (set the offset near 2**64 to test wrap-around).
* Throttle reasons named on a point (``"power"``, ``"thermal"``, ...) are active while it holds;
  violation counters are their exact cumulative time in ns; the clock-event bitmask is the bits.
* Processes: ``{pid: (mem_b, sm_pct)}``; the key ``"run"`` stands for the run's process (the
  smallest pid in ``run_pids``), so a hand-written trace can describe "our" process.
* GPU lost windows ``(a, b)``: every query on that GPU raises ``NVMLError_GpuIsLost``; after ``b``
  the GPU answers again, but only through a handle looked up anew (old handles stay lost).
* Driver reload windows ``(a, b)`` on the FakeNvml: calls raise ``NVMLError_Unknown`` during the
  window (``nvmlInit`` raises ``NVMLError_DriverNotLoaded``); after it, ``NVMLError_Uninitialized``
  until ``nvmlInit`` is called again, and handles from before stay invalid.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml

from gpuledger.collect.nvml import THROTTLE_BITS, THROTTLE_POLICIES

_U64 = 1 << 64
_PLAIN_FIELDS = ("util_pct", "mem_used_b", "power_w", "temp_c", "sm_clock_mhz", "mem_clock_mhz")
# What NVML answers NotSupported for on a MIG slice handle (it reports these for the parent).
UNSUPPORTED_ON_MIG = frozenset(
    {
        "nvmlDeviceGetSamples",
        "nvmlDeviceGetUtilizationRates",
        "nvmlDeviceGetTotalEnergyConsumption",
        "nvmlDeviceGetPowerUsage",
        "nvmlDeviceGetTemperature",
        "nvmlDeviceGetClockInfo",
        "nvmlDeviceGetViolationStatus",
        "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlDeviceGetCurrentClocksThrottleReasons",
        "nvmlDeviceGetProcessUtilization",
        "nvmlDeviceGetEnforcedPowerLimit",
        "nvmlDeviceGetPciInfo",
        "nvmlDeviceGetIndex",
        "nvmlDeviceGetMigMode",
        "nvmlDeviceGetMaxMigDeviceCount",
    }
)
# In MIG mode the parent cannot report GPU utilisation.
_UNSUPPORTED_IN_MIG_MODE = frozenset({"nvmlDeviceGetSamples", "nvmlDeviceGetUtilizationRates"})
_NAME_TO_BIT = {name: bit for bit, name in reversed(THROTTLE_BITS.items())}  # first bit of a name wins
_CLOCK_COLUMNS = {pynvml.NVML_CLOCK_SM: "sm_clock_mhz", pynvml.NVML_CLOCK_MEM: "mem_clock_mhz"}
_POLICY_TO_NAME = {getattr(pynvml, const): name for name, const in THROTTLE_POLICIES}


@dataclass
class TracePoint:
    """The state of one GPU from ``t`` (trace seconds) until the next point. None = unchanged."""

    t: float
    util_pct: float | None = None
    mem_used_b: int | None = None
    power_w: float | None = None
    energy_j: float | None = None  # cumulative counter value at t
    temp_c: float | None = None
    sm_clock_mhz: float | None = None
    mem_clock_mhz: float | None = None
    throttle: tuple[str, ...] | None = None  # active reasons ("power", "thermal", ...)
    procs: dict[int | str, tuple[int | None, float | None]] | None = None  # pid: (mem_b, sm_pct)


@dataclass(eq=False)
class FakeGpu:
    """One scripted GPU (or MIG slice, when listed in a parent's ``mig``)."""

    uuid: str
    name: str = "NVIDIA A100-SXM4-80GB"
    points: list[TracePoint] = field(default_factory=list)
    memory_total_b: int = 80 * 1024**3
    memory_reserved_b: int = 0
    power_limit_w: float | None = 400.0
    pci_bus_id: str = "00000000:07:00.0"
    # NVML function names raising NotSupported ("nvmlDeviceGetMemoryInfo_v2": only the v2 call fails)
    unsupported: frozenset[str] = frozenset()
    errors: dict[str, int] = field(default_factory=dict)  # function name: NVML error code raised
    lost: list[tuple[float, float]] = field(default_factory=list)  # trace-time windows
    mig: list[FakeGpu] = field(default_factory=list)  # MIG slices (MIG mode on when non-empty)
    mig_profile: str | None = None  # for a slice, e.g. "3g.40gb"
    mig_mode: int | None = None  # None: 1 with slices, else 0
    energy_offset_mj: int = 0
    sample_period_s: float = 1 / 6
    buffer_len: int = 120


class _Handle:
    __slots__ = ("dev", "init_epoch", "lost_epoch")

    def __init__(self, dev: _Dev, init_epoch: int, lost_epoch: int) -> None:
        self.dev, self.init_epoch, self.lost_epoch = dev, init_epoch, lost_epoch


class _Dev:
    """A FakeGpu compiled for fast lookups: filled-in columns and prefix integrals."""

    def __init__(self, gpu: FakeGpu, index: int, parent: _Dev | None) -> None:
        self.gpu, self.index, self.parent = gpu, index, parent
        pts = sorted(gpu.points, key=lambda p: p.t) or [TracePoint(0.0)]
        self.ts = [p.t for p in pts]
        self.col: dict[str, list[Any]] = {}
        for name in _PLAIN_FIELDS:
            self.col[name] = _fill([getattr(p, name) for p in pts])
        self.throttle = _fill([p.throttle for p in pts], (), backfill=False)
        self.procs = _fill([p.procs for p in pts], {}, backfill=False)
        self.bits = [sum(_NAME_TO_BIT.get(r, 0) for r in set(rs)) for rs in self.throttle]
        self.util_i = self._prefix(self.col["util_pct"])
        self.power_i = self._prefix(self.col["power_w"])
        self.viol_i = {
            pol: self._prefix([1.0 if name in rs else 0.0 for rs in self.throttle])
            for pol, name in _POLICY_TO_NAME.items()
        }
        self.energy = self._energy_points([p.energy_j for p in pts])
        self.mig_mode = gpu.mig_mode if gpu.mig_mode is not None else int(bool(gpu.mig))
        unsupported = set(gpu.unsupported)
        if parent is not None:
            unsupported |= UNSUPPORTED_ON_MIG
        elif self.mig_mode:
            unsupported |= _UNSUPPORTED_IN_MIG_MODE
        self.unsupported = unsupported
        self.lost = list(gpu.lost if parent is None else parent.gpu.lost)
        self.period_us = max(1, round(gpu.sample_period_s * 1e6))
        self.slices = [_Dev(s, j, self) for j, s in enumerate(gpu.mig)] if parent is None else []
        self._memo_t, self._memo_i = math.nan, 0

    def _prefix(self, values: list[Any]) -> list[float] | None:
        if values[0] is None:
            return None
        out = [0.0]
        for i in range(1, len(self.ts)):
            out.append(out[-1] + values[i - 1] * (self.ts[i] - self.ts[i - 1]))
        return out

    def _energy_points(self, given: list[float | None]) -> list[float] | None:
        if all(e is None for e in given):
            return None
        power = self.col["power_w"]
        first = next(e for e in given if e is not None)
        out: list[float] = []
        for i, e in enumerate(given):
            if e is None:  # leading gap: the first known value; later gaps: advance at the power
                e = out[-1] + (power[i - 1] or 0.0) * (self.ts[i] - self.ts[i - 1]) if out else first
            out.append(e)
        return out

    def idx(self, t: float) -> int:
        if t == self._memo_t:  # one read asks many questions at the same instant
            return self._memo_i
        i = bisect.bisect_right(self.ts, t) - 1
        i = i if i > 0 else 0
        self._memo_t, self._memo_i = t, i
        return i

    def integral(self, prefix: list[float], values: list[Any], t: float) -> float:
        i = self.idx(t)
        return prefix[i] + values[i] * (t - self.ts[i])

    def energy_j(self, t: float) -> float | None:
        t = max(t, self.ts[0])  # the counter does not run backwards before the trace
        power = self.col["power_w"]
        if self.energy is not None:
            i = self.idx(t)
            return self.energy[i] + (power[i] or 0.0) * (t - self.ts[i])
        if self.power_i is None:
            return None
        return self.integral(self.power_i, power, t)


def _fill(values: list[Any], default: Any = None, backfill: bool = True) -> list[Any]:
    """Forward-fill Nones; leading ones take the first known value (or the default)."""
    first = next((v for v in values if v is not None), default) if backfill else default
    out, last = [], first
    for v in values:
        last = v if v is not None else last
        out.append(last)
    return out


def _light_make(kind: str, **kw: Any) -> Any:
    """An attribute bag with the attribute names of pynvml's ctypes struct (fast)."""
    return SimpleNamespace(**kw)


def _light_sample(ts: int, value: int) -> Any:
    return SimpleNamespace(timeStamp=ts, sampleValue=SimpleNamespace(uiVal=value))


_CTYPES: dict[str, Any] = {
    "util": pynvml.c_nvmlUtilization_t,
    "mem": pynvml.c_nvmlMemory_t,
    "mem2": pynvml.c_nvmlMemory_v2_t,
    "viol": pynvml.c_nvmlViolationTime_t,
    "pci": pynvml.nvmlPciInfo_t,
    "putil": pynvml.c_nvmlProcessUtilizationSample_t,
}


def _ctypes_make(kind: str, **kw: Any) -> Any:
    """The real pynvml struct, to prove the collector reads those right."""
    if kind == "proc":  # pynvml turns process structs into these
        return pynvml.nvmlFriendlyObject(kw)
    return _CTYPES[kind](**kw)


def _ctypes_sample(ts: int, value: int) -> Any:
    return pynvml.c_nvmlSample_t(ts, pynvml.c_nvmlValue_t(uiVal=value))


class FakeNvml:
    """Stands in for the ``pynvml`` module. See the module docstring for the trace semantics."""

    def __init__(
        self,
        gpus: Sequence[FakeGpu],
        clock: Callable[[], float],
        start: float = 0.0,
        *,
        driver_version: str = "550.54.15",
        cuda_version: int = 12040,
        reloads: Sequence[tuple[float, float]] = (),
        library_missing: bool = False,
        ctypes_structs: bool = False,
    ) -> None:
        self.clock, self.start = clock, start
        self.start_us = round(start * 1e6)
        self.driver_version, self.cuda_version = driver_version, cuda_version
        self.reloads = list(reloads)
        self.library_missing = library_missing
        self.run_pids: Iterable[int] = ()
        self.calls: Counter[str] = Counter()
        self._make = _ctypes_make if ctypes_structs else _light_make
        self._sample = _ctypes_sample if ctypes_structs else _light_sample
        self._devs = [_Dev(g, i, None) for i, g in enumerate(gpus)]
        self._by_uuid = {d.gpu.uuid.lower(): d for d in self._devs}
        self._by_uuid.update({s.gpu.uuid.lower(): s for d in self._devs for s in d.slices})
        self._refs = 0
        self._init_epoch = 0

    # -- plumbing ------------------------------------------------------------------------
    def _t(self) -> float:
        return self.clock() - self.start

    def _reload_epoch(self, t: float) -> int:
        return sum(1 for a, _ in self.reloads if a <= t)

    def _check_lib(self, name: str) -> float:
        self.calls[name] += 1
        t = self._t()
        if self._refs <= 0:
            raise pynvml.NVMLError_Uninitialized()
        if self.reloads:
            self._check_reloads(t)
        return t

    def _check_reloads(self, t: float) -> None:
        if any(a <= t < b for a, b in self.reloads):
            raise pynvml.NVMLError_Unknown()
        if self._reload_epoch(t) != self._init_epoch:
            raise pynvml.NVMLError_Uninitialized()

    def _enter(self, handle: _Handle, name: str) -> tuple[_Dev, float]:
        self.calls[name] += 1
        t = self.clock() - self.start
        if self._refs <= 0 or handle.init_epoch != self._init_epoch:
            raise pynvml.NVMLError_Uninitialized()
        if self.reloads:
            self._check_reloads(t)
        dev = handle.dev
        if dev.lost:
            self._check_lost(dev, t)
            if handle.lost_epoch != self._lost_epoch(dev, t):
                raise pynvml.NVMLError_GpuIsLost()
        if name in dev.unsupported:
            raise pynvml.NVMLError_NotSupported()
        if dev.gpu.errors:
            code = dev.gpu.errors.get(name)
            if code is not None:
                raise pynvml.NVMLError(code)
        return dev, t

    @staticmethod
    def _check_lost(dev: _Dev, t: float) -> None:
        if any(a <= t < b for a, b in dev.lost):
            raise pynvml.NVMLError_GpuIsLost()

    @staticmethod
    def _lost_epoch(dev: _Dev, t: float) -> int:
        return sum(1 for a, _ in dev.lost if a <= t)

    def _handle(self, dev: _Dev, name: str) -> _Handle:
        t = self._check_lib(name)
        self._check_lost(dev, t)
        return _Handle(dev, self._init_epoch, self._lost_epoch(dev, t))

    def _needs(self, dev: _Dev, column: str) -> list[Any]:
        values = dev.col[column]
        if values[0] is None:
            raise pynvml.NVMLError_NotSupported()
        return values

    def _pid(self, key: int | str) -> int | None:
        if key == "run":
            return min(self.run_pids, default=None)
        return int(key)

    def _last_sample_us(self, dev: _Dev, t: float) -> int:
        return self.start_us + (int(t * 1e6) // dev.period_us) * dev.period_us

    # -- library and system ------------------------------------------------------------------
    def nvmlInit(self) -> None:
        self.calls["nvmlInit"] += 1
        if self.library_missing:
            raise pynvml.NVMLError_LibraryNotFound()
        t = self._t()
        if any(a <= t < b for a, b in self.reloads):
            raise pynvml.NVMLError_DriverNotLoaded()
        self._refs += 1
        self._init_epoch = self._reload_epoch(t)

    def nvmlShutdown(self) -> None:
        self.calls["nvmlShutdown"] += 1
        if self._refs <= 0:
            raise pynvml.NVMLError_Uninitialized()
        self._refs -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._check_lib("nvmlSystemGetDriverVersion")
        return self.driver_version

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._check_lib("nvmlSystemGetCudaDriverVersion")
        return self.cuda_version

    # -- handles and identity ----------------------------------------------------------------
    def nvmlDeviceGetCount(self) -> int:
        self._check_lib("nvmlDeviceGetCount")
        return len(self._devs)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        if not 0 <= index < len(self._devs):
            self._check_lib("nvmlDeviceGetHandleByIndex")
            raise pynvml.NVMLError_InvalidArgument()
        return self._handle(self._devs[index], "nvmlDeviceGetHandleByIndex")

    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> _Handle:
        key = (uuid.decode() if isinstance(uuid, bytes) else uuid).lower()
        dev = self._by_uuid.get(key)
        if dev is None:
            self._check_lib("nvmlDeviceGetHandleByUUID")
            raise pynvml.NVMLError_NotFound()
        return self._handle(dev, "nvmlDeviceGetHandleByUUID")

    def nvmlDeviceGetUUID(self, handle: _Handle) -> str:
        return self._enter(handle, "nvmlDeviceGetUUID")[0].gpu.uuid

    def nvmlDeviceGetName(self, handle: _Handle) -> str:
        dev = self._enter(handle, "nvmlDeviceGetName")[0]
        if dev.parent is not None and dev.gpu.mig_profile:
            return f"{dev.parent.gpu.name} MIG {dev.gpu.mig_profile}"
        return dev.gpu.name

    def nvmlDeviceGetIndex(self, handle: _Handle) -> int:
        return self._enter(handle, "nvmlDeviceGetIndex")[0].index

    def nvmlDeviceGetPciInfo(self, handle: _Handle) -> Any:
        dev = self._enter(handle, "nvmlDeviceGetPciInfo")[0]
        bus_id = dev.gpu.pci_bus_id  # pynvml's struct hands char arrays back as str
        if self._make is _ctypes_make:
            bus_id = bus_id.encode()  # ... and takes bytes in
        return self._make("pci", busId=bus_id, busIdLegacy=bus_id[-12:], domain=0, bus=0, device=0)

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: _Handle) -> int:
        dev = self._enter(handle, "nvmlDeviceGetEnforcedPowerLimit")[0]
        if dev.gpu.power_limit_w is None:
            raise pynvml.NVMLError_NotSupported()
        return round(dev.gpu.power_limit_w * 1000)

    def nvmlDeviceGetMigMode(self, handle: _Handle) -> list[int]:
        dev = self._enter(handle, "nvmlDeviceGetMigMode")[0]
        return [dev.mig_mode, dev.mig_mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: _Handle) -> int:
        dev = self._enter(handle, "nvmlDeviceGetMaxMigDeviceCount")[0]
        return 7 if dev.mig_mode else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: _Handle, index: int) -> _Handle:
        dev = self._enter(handle, "nvmlDeviceGetMigDeviceHandleByIndex")[0]
        if not dev.mig_mode:
            raise pynvml.NVMLError_NotSupported()
        if not 0 <= index < len(dev.slices):
            raise pynvml.NVMLError_NotFound()
        return _Handle(dev.slices[index], handle.init_epoch, handle.lost_epoch)

    def nvmlDeviceIsMigDeviceHandle(self, handle: _Handle) -> int:
        return int(self._enter(handle, "nvmlDeviceIsMigDeviceHandle")[0].parent is not None)

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, handle: _Handle) -> _Handle:
        dev = self._enter(handle, "nvmlDeviceGetDeviceHandleFromMigDeviceHandle")[0]
        if dev.parent is None:
            raise pynvml.NVMLError_InvalidArgument()
        return _Handle(dev.parent, handle.init_epoch, handle.lost_epoch)

    # -- usage -------------------------------------------------------------------------------
    def nvmlDeviceGetSamples(self, handle: _Handle, sampling_type: int, last_ts: int) -> tuple[int, list]:
        dev, t = self._enter(handle, "nvmlDeviceGetSamples")
        if sampling_type != pynvml.NVML_GPU_UTILIZATION_SAMPLES:
            raise pynvml.NVMLError_NotSupported()  # the fake only scripts GPU utilisation
        util = self._needs(dev, "util_pct")
        per = dev.period_us
        k_hi = int(t * 1e6) // per
        k_lo = max(k_hi - dev.gpu.buffer_len + 1, (last_ts - self.start_us) // per + 1)
        if k_lo > k_hi:
            raise pynvml.NVMLError_NotFound()  # what NVML says when nothing is newer
        out = []
        prev = dev.integral(dev.util_i, util, (k_lo - 1) * per / 1e6)
        for k in range(k_lo, k_hi + 1):
            cur = dev.integral(dev.util_i, util, k * per / 1e6)
            out.append(self._sample(self.start_us + k * per, round((cur - prev) * 1e6 / per)))
            prev = cur
        return pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, out

    def nvmlDeviceGetUtilizationRates(self, handle: _Handle) -> Any:
        dev, t = self._enter(handle, "nvmlDeviceGetUtilizationRates")
        util = self._needs(dev, "util_pct")
        per_s = dev.period_us / 1e6
        k = int(t * 1e6) // dev.period_us
        mean = dev.integral(dev.util_i, util, k * per_s) - dev.integral(dev.util_i, util, (k - 1) * per_s)
        return self._make("util", gpu=round(mean / per_s), memory=0)  # memory util: not scripted

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: _Handle) -> int:
        dev, t = self._enter(handle, "nvmlDeviceGetTotalEnergyConsumption")
        joules = dev.energy_j(t)
        if joules is None:
            raise pynvml.NVMLError_NotSupported()
        return (math.floor(joules * 1000) + dev.gpu.energy_offset_mj) % _U64

    def nvmlDeviceGetPowerUsage(self, handle: _Handle) -> int:
        dev, t = self._enter(handle, "nvmlDeviceGetPowerUsage")
        return round(self._needs(dev, "power_w")[dev.idx(t)] * 1000)

    def nvmlDeviceGetMemoryInfo(self, handle: _Handle, version: int | None = None) -> Any:
        dev, t = self._enter(handle, "nvmlDeviceGetMemoryInfo")
        if version and "nvmlDeviceGetMemoryInfo_v2" in dev.unsupported:
            raise pynvml.NVMLError_FunctionNotFound()  # what pynvml raises on drivers before v2
        used = self._needs(dev, "mem_used_b")[dev.idx(t)]
        total, reserved = dev.gpu.memory_total_b, dev.gpu.memory_reserved_b
        free = total - used - reserved
        if version:
            return self._make("mem2", version=version, total=total, reserved=reserved, free=free, used=used)
        return self._make("mem", total=total, free=free, used=used + reserved)  # v1 counts reserved

    def nvmlDeviceGetTemperature(self, handle: _Handle, sensor: int) -> int:
        dev, t = self._enter(handle, "nvmlDeviceGetTemperature")
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise pynvml.NVMLError_InvalidArgument()
        return round(self._needs(dev, "temp_c")[dev.idx(t)])

    def nvmlDeviceGetClockInfo(self, handle: _Handle, clock_type: int) -> int:
        dev, t = self._enter(handle, "nvmlDeviceGetClockInfo")
        column = _CLOCK_COLUMNS.get(clock_type)
        if column is None:
            raise pynvml.NVMLError_NotSupported()
        return round(self._needs(dev, column)[dev.idx(t)])

    def nvmlDeviceGetViolationStatus(self, handle: _Handle, policy: int) -> Any:
        dev, t = self._enter(handle, "nvmlDeviceGetViolationStatus")
        prefix = dev.viol_i.get(policy)
        if prefix is None:
            raise pynvml.NVMLError_NotSupported()
        name = _POLICY_TO_NAME[policy]
        i = dev.idx(t)
        active = 1.0 if name in dev.throttle[i] else 0.0
        seconds = prefix[i] + active * (max(t, dev.ts[0]) - dev.ts[i])
        return self._make("viol", referenceTime=self.start_us + int(t * 1e6), violationTime=int(seconds * 1e9))

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: _Handle) -> int:
        dev, t = self._enter(handle, "nvmlDeviceGetCurrentClocksEventReasons")
        return dev.bits[dev.idx(t)]

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: _Handle) -> int:
        dev, t = self._enter(handle, "nvmlDeviceGetCurrentClocksThrottleReasons")
        return dev.bits[dev.idx(t)]

    # -- processes ---------------------------------------------------------------------------
    def nvmlDeviceGetComputeRunningProcesses(self, handle: _Handle) -> list[Any]:
        dev, t = self._enter(handle, "nvmlDeviceGetComputeRunningProcesses")
        gi = dev.index if dev.parent is not None else 0xFFFFFFFF
        out = []
        for key, (mem_b, _sm) in dev.procs[dev.idx(t)].items():
            pid = self._pid(key)
            if pid is not None:
                out.append(self._make("proc", pid=pid, usedGpuMemory=mem_b, gpuInstanceId=gi, computeInstanceId=gi))
        return out

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: _Handle) -> list[Any]:
        self._enter(handle, "nvmlDeviceGetGraphicsRunningProcesses")
        return []  # the fake scripts compute processes only

    def nvmlDeviceGetProcessUtilization(self, handle: _Handle, last_ts: int) -> list[Any]:
        dev, t = self._enter(handle, "nvmlDeviceGetProcessUtilization")
        ts = self._last_sample_us(dev, t)
        out = []
        if ts > last_ts:
            for key, (_mem, sm) in dev.procs[dev.idx(t)].items():
                pid = self._pid(key)
                if pid is not None and sm is not None:
                    out.append(
                        self._make("putil", pid=pid, timeStamp=ts, smUtil=round(sm), memUtil=0, encUtil=0, decUtil=0)
                    )
        if not out:
            raise pynvml.NVMLError_NotFound()  # NVML: no process samples newer than last_ts
        return out


# Constants, error classes and struct versions, copied from pynvml so code written against
# the module works unchanged against the fake.
for _n in dir(pynvml):
    if _n.startswith(("NVML_", "NVMLError", "nvmlClocks", "nvmlMemory", "NVMLLibrary")):
        setattr(FakeNvml, _n, getattr(pynvml, _n))
