"""The NVML GPU collector: the only code that reads NVIDIA hardware (through nvidia-ml-py).

``NvmlCollector(nvml=pynvml)`` on a real machine, ``NvmlCollector(nvml=FakeNvml(...))`` in tests
and replay: one code path. Methods per tick and device (the tick records which was used):

* busy time: integrated from the driver's utilisation sample buffer
  (``nvmlDeviceGetSamples(..., NVML_GPU_UTILIZATION_SAMPLES, cursor)``), the cursor being the
  last *NVML* timestamp seen, so consecutive ticks tile the buffer and their sum is exact.
  A tick's busy time covers the samples newer than the cursor, which trails the host clock by
  up to one sample period: one tick may hold slightly more or less than ``t1 - t0``; sums are
  exact. Where samples are not supported: ``nvmlDeviceGetUtilizationRates().gpu`` × tick length.
* energy: the cumulative energy counter (mJ) with wrap/reset handling; where unsupported, or
  for the one tick after a counter reset or read error, trapezoidal integration of power.
* throttling: cumulative violation counters per reason (``nvmlDeviceGetViolationStatus``, ns)
  when the GPU has them — exact sums. They cost six queries, so they are read only when the
  clock-event-reason bits were set at either end of the tick, and at least every tenth tick: a
  throttle shorter than a tick that starts and ends between two reads is counted at that later
  reading, never lost. GPUs without counters: the reason bits read at the end of the tick, the
  whole tick attributed to each active reason — an approximation.
* memory: v2 API (used excludes driver-reserved memory, reported apart), else v1 (used
  includes reserved memory).

Every query goes through one helper: NotSupported / NoPermission / FunctionNotFound make the
series absent (None) and it is not asked again; other errors become one ``sampler_error`` event
and an absent value for that tick. A lost GPU (GpuIsLost, Unknown, Uninitialized after a driver
reload ...) gives one ``gpu_lost`` event, then re-init and handle lookup by UUID with exponential
backoff on the injected monotonic clock, and ``gpu_recovered`` when it answers again; the span
while it was lost has no ticks (absent, not zero). ``read`` never raises.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import pynvml

from gpuledger.collect.base import CollectorUnavailable, GpuRead
from gpuledger.collect.nvml_devices import DeviceFinder
from gpuledger.core.integrate import busy_seconds_from_samples, counter_delta, trapezoid_energy_j
from gpuledger.core.model import (
    ENERGY_COUNTER,
    ENERGY_POWER,
    UTIL_INSTANT,
    UTIL_SAMPLES,
    Event,
    GpuIdentity,
    GpuTick,
)

# Violation-counter policies -> throttle reason key in GpuTick.throttle_s.
THROTTLE_POLICIES = (
    ("power", "NVML_PERF_POLICY_POWER"),
    ("thermal", "NVML_PERF_POLICY_THERMAL"),
    ("sync_boost", "NVML_PERF_POLICY_SYNC_BOOST"),
    ("board_limit", "NVML_PERF_POLICY_BOARD_LIMIT"),
    ("low_util", "NVML_PERF_POLICY_LOW_UTILIZATION"),
    ("reliability", "NVML_PERF_POLICY_RELIABILITY"),
)
# Clock-event reason bits (nvml.h, stable ABI) -> the same keys, for GPUs without counters.
THROTTLE_BITS = {
    0x1: "low_util",  # GpuIdle
    0x4: "power",  # SwPowerCap
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "thermal",  # SwThermalSlowdown
    0x40: "thermal",  # HwThermalSlowdown
    0x80: "hw_power_brake",
    0x200: "board_limit",
    0x400: "reliability",
}
_BIT_NAMES = tuple(dict.fromkeys(THROTTLE_BITS.values()))
_TRIGGER_BITS = sum(THROTTLE_BITS)  # any of these set: read the violation counters this tick
_SWEEP_TICKS = 9  # otherwise read them at least every tenth tick
_VALUE_FIELDS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")  # NVML_VALUE_TYPE_*
_SINCE_KEYS = frozenset({"samples", "putil"})  # buffer queries that take a timestamp cursor
NOTHING_NEW: Any = object()  # what _q returns when such a buffer has nothing newer
_DEFAULT_PERIOD_S = 1 / 6  # the fastest utilisation sampling NVML documents
_BACKOFF_FIRST_S, _BACKOFF_MAX_S = 1.0, 60.0
_LOST_ERRORS = (
    "NVMLError_GpuIsLost",
    "NVMLError_Unknown",
    "NVMLError_Uninitialized",
    "NVMLError_DriverNotLoaded",
    "NVMLError_LibRmVersionMismatch",
    "NVMLError_ResetRequired",
    "NVMLError_GpuNotFound",
)
_REINIT_ERRORS = ("NVMLError_Uninitialized", "NVMLError_DriverNotLoaded", "NVMLError_LibRmVersionMismatch")
_ABSENT_ERRORS = ("NVMLError_NotSupported", "NVMLError_NoPermission", "NVMLError_FunctionNotFound")


class _Device:
    """Per-device cursors and memo of what the device cannot answer."""

    def __init__(self, ident: GpuIdentity, handle: Any, absent: tuple[type[BaseException], ...]) -> None:
        self.ident, self.uuid, self.handle, self.absent = ident, ident.uuid, handle, absent
        self.unsupported: set[str] = set()
        self.t_last: float | None = None  # None: next read primes the cursors
        self.sample_ts = 0  # NVML µs timestamp of the last utilisation sample seen
        self.period_s = _DEFAULT_PERIOD_S
        self.proc_ts = 0  # same for per-process utilisation samples
        self.energy_mj: int | None = None
        self.power_w: float | None = None
        self.viol_ns: dict[int, int] = {}
        self.viol_names: tuple[str, ...] = ()  # reasons whose violation counters answer
        self.prev_bits = 0  # clock-event reason bits at the previous read
        self.quiet_ticks = 0  # ticks since the violation counters were last read
        self.lost = False
        self.lost_at = 0.0
        self.retry_at = 0.0
        self.backoff = _BACKOFF_FIRST_S


class NvmlCollector:
    """GpuCollector over NVML for the GPUs that ``visible`` (CUDA_VISIBLE_DEVICES) exposes."""

    def __init__(
        self,
        nvml: Any = None,
        visible: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        source: str = "nvml",
    ) -> None:
        self._nvml = nv = pynvml if nvml is None else nvml
        self._clock = clock  # monotonic: drives the retry backoff only
        self._lost = tuple(getattr(nv, n) for n in _LOST_ERRORS if hasattr(nv, n))
        self._reinit = tuple(getattr(nv, n) for n in _REINIT_ERRORS if hasattr(nv, n))
        self._absent = (*(getattr(nv, n) for n in _ABSENT_ERRORS), nv.NVMLLibraryMismatchError)
        self._absent_mig = (*self._absent, nv.NVMLError_InvalidArgument)
        self._not_found = nv.NVMLError_NotFound
        self._bind_functions(nv)
        self._finder = DeviceFinder(nv, self._absent, source)
        self._need_init = False
        self._closed = False
        self._reported: set[str] = set()
        self._events: list[Event] = []
        self._now = 0.0
        try:
            nv.nvmlInit()
        except Exception as exc:  # any failure to start means "no NVML here"
            if isinstance(exc, getattr(nv, "NVMLError_LibraryNotFound", ())):
                raise NvmlLibraryMissing(_init_reason(nv, exc)) from exc
            raise CollectorUnavailable(_init_reason(nv, exc)) from exc
        try:
            # A slice handle answers InvalidArgument for some whole-GPU queries: absent too.
            self._devs = [
                _Device(ident, h, self._absent if ident.mig_parent_uuid is None else self._absent_mig)
                for ident, h in self._finder.discover(visible)
            ]
        except Exception as exc:
            self.close()
            raise CollectorUnavailable(f"NVML could not list the GPUs: {exc}") from exc
        self._identities = [d.ident for d in self._devs]

    def _bind_functions(self, nv: Any) -> None:
        # Bound once: saves a module attribute lookup per query, and an old nvidia-ml-py that
        # lacks a function leaves it None, which the query helper treats as unsupported.
        f = lambda name: getattr(nv, name, None)  # noqa: E731
        self._f_samples = f("nvmlDeviceGetSamples")
        self._f_util = f("nvmlDeviceGetUtilizationRates")
        self._f_energy = f("nvmlDeviceGetTotalEnergyConsumption")
        self._f_power = f("nvmlDeviceGetPowerUsage")
        self._f_mem = f("nvmlDeviceGetMemoryInfo")
        self._f_temp = f("nvmlDeviceGetTemperature")
        self._f_clock = f("nvmlDeviceGetClockInfo")
        self._f_viol = f("nvmlDeviceGetViolationStatus")
        self._f_reasons = f("nvmlDeviceGetCurrentClocksEventReasons")
        self._f_reasons_old = f("nvmlDeviceGetCurrentClocksThrottleReasons")
        self._f_putil = f("nvmlDeviceGetProcessUtilization")
        self._proc_fns = (
            ("procs", f("nvmlDeviceGetComputeRunningProcesses"), f("nvmlDeviceGetComputeRunningProcesses_v2")),
            ("gprocs", f("nvmlDeviceGetGraphicsRunningProcesses"), f("nvmlDeviceGetGraphicsRunningProcesses_v2")),
        )
        self._mem_v2 = getattr(nv, "nvmlMemory_v2", None)
        self._util_samples = nv.NVML_GPU_UTILIZATION_SAMPLES
        self._temp_gpu = nv.NVML_TEMPERATURE_GPU
        self._clock_sm, self._clock_mem = nv.NVML_CLOCK_SM, nv.NVML_CLOCK_MEM
        self._policies = tuple(
            (getattr(nv, const), name, "viol_" + name) for name, const in THROTTLE_POLICIES if hasattr(nv, const)
        )

    # -- GpuCollector --------------------------------------------------------------------------
    def devices(self) -> list[GpuIdentity]:
        return list(self._identities)

    def read(self, pids: set[int], now: float) -> GpuRead:
        out = GpuRead()
        if self._closed:
            return out
        self._events, self._now = out.events, now
        for d in self._devs:
            try:
                if d.lost:
                    self._try_recover(d, now)
                    continue
                tick = self._read_device(d, pids, now)
                if tick is not None:
                    out.ticks.append(tick)
            except self._lost as exc:
                self._mark_lost(d, exc, now)
            except Exception as exc:  # a bug or an unexpected error must not stop the recorder
                self._report(d, "read", exc)
        return out

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            with contextlib.suppress(Exception):  # nothing to do about a failed shutdown
                self._nvml.nvmlShutdown()

    # -- the query helper ----------------------------------------------------------------------
    def _q(self, d: _Device, key: str, fn: Any, *args: Any) -> Any:
        """One NVML query: absent -> None (remembered); lost -> raised; other errors -> None + one event.

        For the buffer queries (``_SINCE_KEYS``) NotFound means "nothing newer than the cursor"
        and returns ``NOTHING_NEW``.
        """
        if key in d.unsupported:
            return None
        if fn is None:
            d.unsupported.add(key)
            return None
        try:
            return fn(*args)
        except d.absent:
            d.unsupported.add(key)
            return None
        except self._lost:
            raise
        except self._not_found as exc:
            if key in _SINCE_KEYS:
                return NOTHING_NEW
            self._report(d, key, exc)
            return None
        except Exception as exc:  # a passing NVML error, or a bug: absent this tick, said once
            self._report(d, key, exc)
            return None

    def _report(self, d: _Device, series: str, exc: BaseException) -> None:
        key = f"{d.uuid}/{series}/{type(exc).__name__}"
        if key not in self._reported:  # once per device, series and kind of error
            self._reported.add(key)
            self._events.append(
                Event(
                    t=self._now,
                    kind="sampler_error",
                    message=f"GPU {d.ident.index} ({d.uuid}): {series}: {type(exc).__name__}: {exc}",
                    payload={"uuid": d.uuid, "series": series, "error": type(exc).__name__},
                )
            )

    # -- one device, one tick ------------------------------------------------------------------
    def _read_device(self, d: _Device, pids: set[int], now: float) -> GpuTick | None:
        t0 = d.t_last
        if t0 is None:
            self._prime(d)
            d.t_last = now
            return None
        if now <= t0:
            return None  # nothing elapsed: leave the cursors for the next read
        tick = GpuTick(uuid=d.uuid, t0=t0, t1=now)
        h = d.handle
        self._busy(d, tick, now - t0)
        self._energy(d, tick)
        m = self._q(d, "mem_v2", self._f_mem, h, self._mem_v2) if self._mem_v2 else None
        if m is not None:
            tick.mem_used_b, tick.mem_reserved_b = int(m.used), int(m.reserved)
        else:
            m = self._q(d, "mem", self._f_mem, h)
            tick.mem_used_b = None if m is None else int(m.used)
        tick.temp_c = _num(self._q(d, "temp", self._f_temp, h, self._temp_gpu))
        tick.sm_clock_mhz = _num(self._q(d, "sm_clock", self._f_clock, h, self._clock_sm))
        tick.mem_clock_mhz = _num(self._q(d, "mem_clock", self._f_clock, h, self._clock_mem))
        tick.throttle_s = self._throttle(d, now - t0)
        if pids:
            tick.proc_mem_b = self._proc_mem(d, pids)
            tick.proc_sm_util_pct = self._proc_sm(d, pids)
        d.t_last = now
        return tick

    def _prime(self, d: _Device) -> None:
        """Set every cursor from the device's current counters; the first tick starts here."""
        h = d.handle
        d.sample_ts = d.proc_ts = 0
        res = self._q(d, "samples", self._f_samples, h, self._util_samples, 0)
        if res is not None and res is not NOTHING_NEW and res[1]:
            d.sample_ts = max(s.timeStamp for s in res[1])
        d.energy_mj = self._q(d, "energy", self._f_energy, h)
        p = self._q(d, "power", self._f_power, h)
        d.power_w = None if p is None else p / 1000
        d.viol_ns = {}
        for pol, _name, key in self._policies:
            v = self._q(d, key, self._f_viol, h, pol)
            if v is not None:
                d.viol_ns[pol] = int(v.violationTime)
        d.viol_names = tuple(name for pol, name, _ in self._policies if pol in d.viol_ns)
        bits = self._q(d, "reasons", self._f_reasons, h)
        if bits is None:
            bits = self._q(d, "reasons_old", self._f_reasons_old, h)
        d.prev_bits, d.quiet_ticks = bits or 0, 0
        res = self._q(d, "putil", self._f_putil, h, 0)
        if res is not None and res is not NOTHING_NEW and res:
            d.proc_ts = max(s.timeStamp for s in res)

    def _busy(self, d: _Device, tick: GpuTick, dt: float) -> None:
        if "samples" not in d.unsupported:
            res = self._q(d, "samples", self._f_samples, d.handle, self._util_samples, d.sample_ts)
            if res is NOTHING_NEW:  # no sample newer than the cursor: nothing ran since
                res = (1, ())
            if res is not None:
                self._busy_from_samples(d, tick, res[0], res[1])
                return
            if "samples" not in d.unsupported:
                return  # a passing error: leave the cursor, the next tick covers this span
        rates = self._q(d, "util", self._f_util, d.handle)
        if rates is not None:
            pct = float(rates.gpu)
            tick.busy_s, tick.util_max_pct, tick.util_method = pct / 100 * dt, pct, UTIL_INSTANT

    def _busy_from_samples(self, d: _Device, tick: GpuTick, vtype: int, samples: Any) -> None:
        tick.util_method = UTIL_SAMPLES
        if not samples:
            tick.busy_s = 0.0
            return
        attr = _VALUE_FIELDS[vtype] if 0 <= vtype < len(_VALUE_FIELDS) else "uiVal"
        pairs = [(s.timeStamp, getattr(s.sampleValue, attr)) for s in samples]
        if any(pairs[i][0] > pairs[i + 1][0] for i in range(len(pairs) - 1)):
            pairs.sort()
        if len(pairs) > 1:  # learn the device's sampling period for a cursor-less first sample
            d.period_s = max((pairs[-1][0] - pairs[0][0]) / (len(pairs) - 1) / 1e6, 1e-3)
        last = pairs[-1][0]
        prev = d.sample_ts or None
        tick.busy_s = busy_seconds_from_samples(pairs, d.sample_ts, last, d.period_s, prev)
        tick.util_max_pct = float(max(v for _, v in pairs))
        d.sample_ts = last

    def _energy(self, d: _Device, tick: GpuTick) -> None:
        h = d.handle
        p = self._q(d, "power", self._f_power, h)
        power = None if p is None else p / 1000
        tick.power_w = power
        if "energy" not in d.unsupported:
            mj = self._q(d, "energy", self._f_energy, h)
            delta = counter_delta(d.energy_mj, mj) if mj is not None else None
            if delta is not None:
                tick.energy_j, tick.energy_method = delta / 1000, ENERGY_COUNTER
            elif mj is not None and d.energy_mj is not None:
                self._report(d, "energy", _CounterReset())
            d.energy_mj = mj  # None after a read error: re-base rather than double count
        if tick.energy_j is None and power is not None and d.power_w is not None:
            tick.energy_j = trapezoid_energy_j(tick.t0, d.power_w, tick.t1, power)
            tick.energy_method = ENERGY_POWER
        d.power_w = power

    def _throttle(self, d: _Device, dt: float) -> dict[str, float] | None:
        bits = self._q(d, "reasons", self._f_reasons, d.handle)
        if bits is None:
            bits = self._q(d, "reasons_old", self._f_reasons_old, d.handle)
        if d.viol_names:
            # The counters are exact, but six queries a tick. While the reason bits are clear at
            # both ends of the tick nothing throttled for long: skip them, and sweep every
            # _SWEEP_TICKS so a brief throttle between two reads is still counted (later).
            quiet = bits is not None and not (bits | d.prev_bits) & _TRIGGER_BITS
            d.prev_bits = bits or 0
            if quiet and d.quiet_ticks < _SWEEP_TICKS:
                d.quiet_ticks += 1
                return dict.fromkeys(d.viol_names, 0.0)
            d.quiet_ticks = 0
            return self._violations(d)
        if bits is None:
            return None
        out = dict.fromkeys(_BIT_NAMES, 0.0)
        for bit, name in THROTTLE_BITS.items():
            if bits & bit:
                out[name] = dt  # "thermal" has two bits: still one tick, not two
        return out

    def _violations(self, d: _Device) -> dict[str, float]:
        """Seconds per reason since the last reading of the cumulative violation counters (ns)."""
        out = dict.fromkeys(d.viol_names, 0.0)
        for pol, name, key in self._policies:
            v = self._q(d, key, self._f_viol, d.handle, pol)
            if v is None:
                out.pop(name, None)  # unknown this tick; the next reading covers it
                continue
            ns = int(v.violationTime)
            delta = counter_delta(d.viol_ns.get(pol), ns)
            d.viol_ns[pol] = ns
            if delta is None:
                out.pop(name, None)
            else:
                out[name] += delta / 1e9
        return out

    def _proc_mem(self, d: _Device, pids: set[int]) -> int | None:
        total: int | None = None
        seen: dict[int, int] | None = None
        for key, fn, fn_v2 in self._proc_fns:
            procs = self._q(d, key, fn, d.handle)
            if procs is None and key in d.unsupported:
                procs = self._q(d, key + "_v2", fn_v2, d.handle)  # older drivers
            if procs is None:
                continue
            total = 0
            for p in procs:
                mem = p.usedGpuMemory
                if p.pid in pids and mem is not None:
                    if seen is None:
                        seen = {}
                    seen.setdefault(p.pid, int(mem))  # a process may be in both lists
        return sum(seen.values()) if seen else total

    def _proc_sm(self, d: _Device, pids: set[int]) -> float | None:
        samples = self._q(d, "putil", self._f_putil, d.handle, d.proc_ts)
        if samples is NOTHING_NEW:
            return 0.0  # no process ran a kernel since the cursor
        if samples is None:
            return None
        sums: dict[int, list[float]] = {}
        last = d.proc_ts
        for s in samples:
            ts = s.timeStamp
            last = ts if ts > last else last
            if s.pid in pids:
                acc = sums.setdefault(s.pid, [0.0, 0.0])
                acc[0] += s.smUtil
                acc[1] += 1
        d.proc_ts = last
        return min(100.0, sum(a / n for a, n in sums.values()))

    # -- lost and found ------------------------------------------------------------------------
    def _mark_lost(self, d: _Device, exc: BaseException, now: float) -> None:
        d.lost, d.lost_at, d.t_last = True, now, None
        d.backoff = _BACKOFF_FIRST_S
        d.retry_at = self._clock() + d.backoff
        if isinstance(exc, self._reinit):
            self._need_init = True
        self._events.append(
            Event(
                t=now,
                kind="gpu_lost",
                message=f"GPU {d.ident.index} ({d.uuid}) stopped answering: {type(exc).__name__}: {exc}; "
                "retrying with backoff",
                payload={"uuid": d.uuid, "index": d.ident.index, "error": type(exc).__name__},
            )
        )

    def _try_recover(self, d: _Device, now: float) -> None:
        mono = self._clock()
        if mono < d.retry_at:
            return
        try:
            if self._need_init:
                self._restart_nvml()
            d.handle = self._lookup(d)
            self._prime(d)
        except Exception as exc:
            if isinstance(exc, self._reinit):
                self._need_init = True
            d.backoff = min(d.backoff * 2, _BACKOFF_MAX_S)
            d.retry_at = mono + d.backoff
            return
        d.lost, d.t_last = False, now
        self._events.append(
            Event(
                t=now,
                kind="gpu_recovered",
                message=f"GPU {d.ident.index} ({d.uuid}) answers again after {now - d.lost_at:.1f} s; "
                "no figures for that gap",
                payload={"uuid": d.uuid, "index": d.ident.index, "gap_s": now - d.lost_at},
            )
        )

    def _restart_nvml(self) -> None:
        with contextlib.suppress(Exception):  # already torn down by the driver reload
            self._nvml.nvmlShutdown()
        self._nvml.nvmlInit()
        self._need_init = False
        mono = self._clock()
        for d in self._devs:  # every lost device may answer now: try each at its next read
            d.retry_at = min(d.retry_at, mono)

    def _lookup(self, d: _Device) -> Any:
        nv = self._nvml
        try:
            return nv.nvmlDeviceGetHandleByUUID(d.uuid)
        except (self._not_found, nv.NVMLError_InvalidArgument):
            if d.ident.mig_parent_uuid is None:
                raise
        parent = nv.nvmlDeviceGetHandleByUUID(d.ident.mig_parent_uuid)  # drivers that can't find MIG UUIDs
        for _uuid, mh in self._finder.mig_slices(parent):
            if _uuid == d.uuid:
                return mh
        raise nv.NVMLError_NotFound()


class NvmlLibraryMissing(CollectorUnavailable):
    """libnvidia-ml.so could not be loaded: no NVIDIA driver on this machine (or not on the path)."""


class _CounterReset(Exception):
    def __str__(self) -> str:
        return "the cumulative energy counter went backwards (driver reload or GPU reset); this tick integrates power"


def _init_reason(nv: Any, exc: BaseException) -> str:
    if isinstance(exc, getattr(nv, "NVMLError_LibraryNotFound", ())):
        return "NVML library not loadable (libnvidia-ml.so.1): no NVIDIA driver installed here"
    if isinstance(exc, getattr(nv, "NVMLError_DriverNotLoaded", ())):
        return "the NVIDIA driver is installed but not loaded (NVML: Driver Not Loaded)"
    if isinstance(exc, getattr(nv, "NVMLError_NoPermission", ())):
        return "no permission to use NVML (check access to /dev/nvidia*)"
    return f"NVML failed to start: {type(exc).__name__}: {exc}"


def _num(value: Any) -> float | None:
    return None if value is None else float(value)
