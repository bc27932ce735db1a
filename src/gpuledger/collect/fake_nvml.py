"""A scripted NVML that behaves like NVIDIA hardware: the pynvml API, driven by per-GPU traces and a clock.

Public, like httpx's ``MockTransport``: tests and ``--replay-gpus`` hand a ``FakeNvml`` to the
collector in place of the ``pynvml`` module. Same function names and signatures, same constants,
pynvml's own error classes (``except pynvml.NVMLError_NotSupported`` behaves identically), and
return objects with the attribute names of pynvml's structs (``ctypes_structs=True`` returns
the real ctypes structs, slower). The fake never imports the collector: its tables
(``fake_nvml_profiles``) are written from NVML's documentation and observed behaviour.

Trace semantics (times are *trace seconds*: ``clock() - start``):

* A point's values hold from its ``t`` until the next point (stepped); the last point holds for
  ever; before the first point the first point's values apply. A field missing (None) on a
  point keeps the previous value; missing on every point, its NVML function raises
  ``NVMLError_NotSupported`` — absent, never 0.
* How the GPU samples and reports comes from its product profile (chosen from the name; see
  ``fake_nvml_profiles.Profile``): sample period, buffer length, idle sampling, energy counter
  steps, averaged or instantaneous ``nvmlDeviceGetPowerUsage``, architecture.
* Utilisation samples: instant k is at trace time ``phase + k * period``; its sample is the
  percent of the period *before* it a kernel ran, rounded to an integer, stamped in µs on the
  wall clock (default: the trace clock), or with ``sample_clock="boot"`` on the host's boot clock
  (µs since boot: ``boot_clock``, else ``DEFAULT_UPTIME_S`` at trace second 0). NVML's reference
  documents ``nvmlSample_t.timeStamp`` and the per-process samples' as "CPU timestamp in
  microseconds" with no epoch (unlike ``nvmlFieldValue_t.timestamp``: "since 1970"); published
  readings show the Unix epoch on most drivers and CLOCK_BOOTTIME on some (a public GPU agent
  found its samples dated February 1970 on a host up 58 days). Field values and violation
  reference times stay on the wall clock. While the GPU is idle (no work in a sample's period)
  the profile's ``idle_sampling`` applies: ``grid`` samples anyway (value 0), ``slow`` takes
  one sample per ``idle_period_s`` counted from the last sample with work, ``stop`` takes none.
  When work starts again, the first sample is at the first instant whose period holds work and
  covers only that one period. The buffer keeps the last ``buffer_len`` samples in insertion
  order; samples taken since the previous read of the buffer are stamped with the wall clock's
  offset as read now, so a step of the wall clock makes timestamps jump (back, if it went back).
* Energy: the exact integral of the stepped power (or, when points carry ``energy_j``, the
  scripted counter, exact at each point, advancing at the power between points; a drop is a
  counter reset) at the counter's last update instant, floored to mJ, plus ``energy_offset_mj``,
  modulo 2**64. After a driver reload it counts from 0 again ("since the driver was last
  reloaded", NVML API reference). In an ``energy_stuck`` window the counter holds its value while
  the GPU draws power, and counts on from there after it (counters seen frozen in the field).
* Throttle reasons named on a point are active while it holds: clock-event bits, and violation
  counters (exact cumulative ns) for their perf policies.
* Processes: ``{pid: (mem_b, sm_pct)}``; the key ``"run"`` is the run's process (the smallest of
  ``run_pids``, given in the caller's PID namespace). The driver reports host PIDs: with
  ``host_pid_offset`` the caller is in a PID namespace and the run's process is reported as
  ``pid + offset``; numeric keys are reported as written. ``pid_translation="lists"``: the
  running-process lists give the caller's pid while utilisation samples keep host pids.
  ``usedGpuMemory`` is None on MIG slices (unless ``process_memory=True``).
* Field values (``nvmlDeviceGetFieldValues``): 83 energy (``ullVal``), 185/186 average/instant
  power (``uiVal``, mW), 74–79 violation counters (``ullVal``, ns), ``extra_fields``; each field
  carries its own ``nvmlReturn`` (NOT_SUPPORTED where the GPU lacks it, UNKNOWN while failing).
* ``failing``: a function or a field id answering ``NVMLError_Unknown`` (optionally in a window)
  while the rest of the GPU answers; ``errors``: a function always raising a given code.
* GPU lost windows ``(a, b)``: every query on that GPU raises ``NVMLError_GpuIsLost``; after ``b``
  the GPU answers again, but only through a handle looked up anew (old handles stay lost).
* Driver reload windows ``(a, b)``: calls raise ``NVMLError_Unknown`` during the window
  (``nvmlInit`` raises ``NVMLError_DriverNotLoaded``); after it ``NVMLError_Uninitialized`` until
  ``nvmlInit`` is called again; old handles stay invalid; sample buffers and energy counters
  start afresh.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pynvml

from gpuledger.collect.fake_nvml_core import UNSUPPORTED_ON_MIG, Handle, NvmlCore
from gpuledger.collect.fake_nvml_gpu import Device, Failing, FakeGpu, TracePoint
from gpuledger.collect.fake_nvml_profiles import (
    FI_PERF_POLICY,
    FI_POWER_AVERAGE,
    FI_POWER_INSTANT,
    FI_TOTAL_ENERGY_CONSUMPTION,
    POLICY_REASONS,
)

__all__ = ["UNSUPPORTED_ON_MIG", "Failing", "FakeGpu", "FakeNvml", "TracePoint"]

_NOT_A_MIG_ID = 0xFFFFFFFF  # nvmlProcessInfo_t.gpuInstanceId / computeInstanceId outside MIG
_DEVICE_FIELDS = frozenset({FI_TOTAL_ENERGY_CONSUMPTION, FI_POWER_AVERAGE, FI_POWER_INSTANT, *FI_PERF_POLICY})
# A field reads the same counter as a function: a GPU lacking the function lacks the field.
_FIELD_FUNCTION = {
    FI_TOTAL_ENERGY_CONSUMPTION: "nvmlDeviceGetTotalEnergyConsumption",
    FI_POWER_AVERAGE: "nvmlDeviceGetPowerUsage",
    FI_POWER_INSTANT: "nvmlDeviceGetPowerUsage",
    **dict.fromkeys(FI_PERF_POLICY, "nvmlDeviceGetViolationStatus"),
}
_CLOCK_COLUMNS = {pynvml.NVML_CLOCK_SM: "sm_clock_mhz", pynvml.NVML_CLOCK_MEM: "mem_clock_mhz"}


class _Value:
    """pynvml's c_nvmlValue_t members, as plain attributes (the light, fast form)."""

    __slots__ = ("dVal", "siVal", "sllVal", "uiVal", "ulVal", "ullVal", "usVal")


class _SampleValue:
    __slots__ = ("uiVal",)

    def __init__(self, value: int) -> None:
        self.uiVal = value


class _Sample:
    """pynvml's c_nvmlSample_t members, as plain attributes (the light, fast form)."""

    __slots__ = ("sampleValue", "timeStamp")

    def __init__(self, ts: int, value: int) -> None:
        self.timeStamp, self.sampleValue = ts, _SampleValue(value)


class _FieldValue:
    """pynvml's c_nvmlFieldValue_t members, as plain attributes (the light, fast form)."""

    __slots__ = ("fieldId", "latencyUsec", "nvmlReturn", "scopeId", "timestamp", "value", "valueType")

    def __init__(self, fid: int, scope: int, stamp: int, latency: int, vtype: int, ret: int, value: _Value) -> None:
        self.fieldId, self.scopeId, self.timestamp, self.latencyUsec = fid, scope, stamp, latency
        self.valueType, self.nvmlReturn, self.value = vtype, ret, value


_VALUE_MEMBER = {pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal", pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal"}
_VALUE_MEMBER[pynvml.NVML_VALUE_TYPE_DOUBLE] = "dVal"
_ZOMBIE_UTIL = 37100  # nvtop #110: a zombie process's sample read %SM=37100


class FakeNvml(NvmlCore):
    """Stands in for the ``pynvml`` module. See the module docstring for the semantics."""

    # -- utilisation -----------------------------------------------------------------------------
    def nvmlDeviceGetSamples(self, handle: Handle, sampling_type: int, last_ts: int) -> tuple[int, list]:
        dev, t = self._enter(handle, "nvmlDeviceGetSamples")
        if sampling_type != pynvml.NVML_GPU_UTILIZATION_SAMPLES:
            raise pynvml.NVMLError_NotSupported()  # the fake only scripts GPU utilisation
        self._needs(dev, "util_pct")
        restart = self._restart(t) if self.reloads else None
        dev.fill_buffer(t, self._sample_base_us(t), restart, self._reload_epoch(t))
        found = dev.samples_after(last_ts)
        if not found:
            raise pynvml.NVMLError_NotFound()  # nothing newer than last_ts (or the buffer ran dry)
        if self._ctypes:
            out = [pynvml.c_nvmlSample_t(ts, pynvml.c_nvmlValue_t(uiVal=v)) for ts, v in found]
        else:
            out = [_Sample(ts, v) for ts, v in found]
        return pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, out

    def nvmlDeviceGetUtilizationRates(self, handle: Handle) -> Any:
        dev, t = self._enter(handle, "nvmlDeviceGetUtilizationRates")
        self._needs(dev, "util_pct")
        return self._make("util", gpu=dev.rate(t), memory=0)  # memory utilisation is not scripted

    # -- power and energy ------------------------------------------------------------------------
    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Handle) -> int:
        dev, t = self._enter(handle, "nvmlDeviceGetTotalEnergyConsumption")
        return self._energy_mj(dev, t)

    def nvmlDeviceGetPowerUsage(self, handle: Handle) -> int:
        dev, t = self._enter(handle, "nvmlDeviceGetPowerUsage")
        self._needs(dev, "power_w")
        return dev.power_mw(t, dev.power_window_s)

    def nvmlDeviceGetFieldValues(self, handle: Handle, field_ids: Sequence[int | tuple[int, int]]) -> Any:
        dev, t = self._enter(handle, "nvmlDeviceGetFieldValues")
        stamp = self.start_us + round(t * 1e6) + self._offset_us(t)
        out = pynvml.c_nvmlFieldValue_t * len(field_ids) if self._ctypes else None
        values = out() if out is not None else []
        for i, requested in enumerate(field_ids):
            fid, scope = requested if isinstance(requested, tuple) else (requested, 0)
            ret, vtype, value = self._field(dev, t, fid)
            if out is not None:
                fv = values[i]
                fv.fieldId, fv.scopeId, fv.timestamp, fv.latencyUsec = fid, scope, stamp, 0
                fv.valueType, fv.nvmlReturn = vtype, ret
                if ret == pynvml.NVML_SUCCESS:
                    setattr(fv.value, _VALUE_MEMBER[vtype], value)
            else:
                member = _Value()
                if ret == pynvml.NVML_SUCCESS:
                    setattr(member, _VALUE_MEMBER[vtype], value)
                values.append(_FieldValue(fid, scope, stamp, 0, vtype, ret, member))
        return values

    def _field(self, dev: Device, t: float, fid: int) -> tuple[int, int, Any]:
        """(nvmlReturn, valueType, value) of one field id."""
        ull, ui = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
        unsupported = (pynvml.NVML_ERROR_NOT_SUPPORTED, ull, None)
        if (
            fid in dev.gpu.unsupported_fields
            or (dev.parent is not None and fid in _DEVICE_FIELDS)
            or _FIELD_FUNCTION.get(fid) in dev.gpu.unsupported
        ):
            return unsupported
        if dev.failing and any(f.target == fid and f.active(t) for f in dev.failing):
            return pynvml.NVML_ERROR_UNKNOWN, ull, None
        if fid == FI_TOTAL_ENERGY_CONSUMPTION:
            try:
                return pynvml.NVML_SUCCESS, ull, self._energy_mj(dev, t)
            except pynvml.NVMLError_NotSupported:
                return unsupported
        if fid in (FI_POWER_INSTANT, FI_POWER_AVERAGE):
            if dev.col["power_w"][0] is None:
                return unsupported
            window = 0.0 if fid == FI_POWER_INSTANT else 1.0  # NVML_FI_DEV_POWER_AVERAGE: "averaged over 1 sec"
            return pynvml.NVML_SUCCESS, ui, dev.power_mw(t, window)
        if fid in FI_PERF_POLICY:
            return pynvml.NVML_SUCCESS, ull, dev.violation_ns(FI_PERF_POLICY[fid], t)
        if fid in dev.gpu.extra_fields:
            value = dev.gpu.extra_fields[fid]
            vtype = pynvml.NVML_VALUE_TYPE_DOUBLE if isinstance(value, float) else ull
            return pynvml.NVML_SUCCESS, vtype, value
        return unsupported

    # -- sensors ---------------------------------------------------------------------------------
    def nvmlDeviceGetMemoryInfo(self, handle: Handle, version: int | None = None) -> Any:
        dev, t = self._enter(handle, "nvmlDeviceGetMemoryInfo")
        if version and "nvmlDeviceGetMemoryInfo_v2" in dev.gpu.unsupported:
            raise pynvml.NVMLError_FunctionNotFound()  # what pynvml raises on drivers before v2
        used = self._needs(dev, "mem_used_b")[dev.idx(t)]
        total, reserved = dev.gpu.memory_total_b, dev.gpu.memory_reserved_b
        free = total - used - reserved
        if version:
            return self._make("mem2", version=version, total=total, reserved=reserved, free=free, used=used)
        return self._make("mem", total=total, free=free, used=used + reserved)  # v1 counts reserved

    def nvmlDeviceGetTemperature(self, handle: Handle, sensor: int) -> int:
        return self._temperature(*self._enter(handle, "nvmlDeviceGetTemperature"), sensor)

    # pynvml: nvmlDeviceGetTemperature is "DEPRECATED: Use nvmlDeviceGetTemperatureV instead"; both answer.
    def nvmlDeviceGetTemperatureV(self, handle: Handle, sensor: int, version: int = pynvml.nvmlTemperature_v1) -> int:
        if version != pynvml.nvmlTemperature_v1:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)  # as pynvml does
        return self._temperature(*self._enter(handle, "nvmlDeviceGetTemperatureV"), sensor)

    def _temperature(self, dev: Device, t: float, sensor: int) -> int:
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise pynvml.NVMLError_InvalidArgument()
        return round(self._needs(dev, "temp_c")[dev.idx(t)])

    def nvmlDeviceGetClockInfo(self, handle: Handle, clock_type: int) -> int:
        dev, t = self._enter(handle, "nvmlDeviceGetClockInfo")
        column = _CLOCK_COLUMNS.get(clock_type)
        if column is None:
            raise pynvml.NVMLError_NotSupported()
        return round(self._needs(dev, column)[dev.idx(t)])

    # Deprecated in pynvml for the NVML_FI_DEV_PERF_POLICY_* field values; both answer, from one counter.
    def nvmlDeviceGetViolationStatus(self, handle: Handle, policy: int) -> Any:
        dev, t = self._enter(handle, "nvmlDeviceGetViolationStatus")
        if policy not in POLICY_REASONS:
            raise pynvml.NVMLError_NotSupported()
        ref = self.start_us + round(t * 1e6) + self._offset_us(t)
        return self._make("viol", referenceTime=ref, violationTime=dev.violation_ns(policy, t))

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Handle) -> int:
        dev, t = self._enter(handle, "nvmlDeviceGetCurrentClocksEventReasons")
        return dev.bits[dev.idx(t)]

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Handle) -> int:
        dev, t = self._enter(handle, "nvmlDeviceGetCurrentClocksThrottleReasons")
        return dev.bits[dev.idx(t)]

    # -- processes -------------------------------------------------------------------------------
    def _running(self, handle: Handle, name: str, kind: str) -> list[Any]:
        dev, t = self._enter(handle, name)
        if kind != dev.gpu.process_list:
            return []  # the scripted processes are in one list (FakeGpu.process_list)
        # driver 560.35.03 translated these lists into the caller's namespace (HAMi-core #112)
        translated = self._owner_setting(dev, "pid_translation") == "lists"
        gi = dev.gi if dev.parent is not None else _NOT_A_MIG_ID
        ci = dev.gpu.compute_instance_id if dev.parent is not None else _NOT_A_MIG_ID
        out = []
        for key, (mem_b, _sm) in dev.procs[dev.idx(t)].items():
            pid = self._pid(dev, key, translated)
            if pid is not None:  # pynvml maps NVML_VALUE_NOT_AVAILABLE to None
                mem = mem_b if dev.process_memory else None
                out.append(self._make("proc", pid=pid, usedGpuMemory=mem, gpuInstanceId=gi, computeInstanceId=ci))
        return out

    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle: Handle) -> list[Any]:
        return self._running(handle, "nvmlDeviceGetComputeRunningProcesses_v3", "compute")

    def nvmlDeviceGetComputeRunningProcesses_v2(self, handle: Handle) -> list[Any]:
        return self._running(handle, "nvmlDeviceGetComputeRunningProcesses_v2", "compute")

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Handle) -> list[Any]:
        return self._unversioned(handle, "nvmlDeviceGetComputeRunningProcesses", "compute")

    def nvmlDeviceGetGraphicsRunningProcesses_v3(self, handle: Handle) -> list[Any]:
        return self._running(handle, "nvmlDeviceGetGraphicsRunningProcesses_v3", "graphics")

    def nvmlDeviceGetGraphicsRunningProcesses_v2(self, handle: Handle) -> list[Any]:
        return self._running(handle, "nvmlDeviceGetGraphicsRunningProcesses_v2", "graphics")

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: Handle) -> list[Any]:
        return self._unversioned(handle, "nvmlDeviceGetGraphicsRunningProcesses", "graphics")

    def nvmlDeviceGetMPSComputeRunningProcesses_v3(self, handle: Handle) -> list[Any]:
        return self._running(handle, "nvmlDeviceGetMPSComputeRunningProcesses_v3", "mps")

    def nvmlDeviceGetMPSComputeRunningProcesses(self, handle: Handle) -> list[Any]:
        return self._unversioned(handle, "nvmlDeviceGetMPSComputeRunningProcesses", "mps")

    def _unversioned(self, handle: Handle, name: str, kind: str) -> list[Any]:
        """pynvml's unversioned call is its _v3 one; a driver without _v3 makes it raise
        NVMLLibraryMismatchError (pynvml's throwOnVersionMismatch)."""
        if name + "_v3" in handle.dev.gpu.unsupported:
            self.calls[name] += 1
            raise pynvml.NVMLLibraryMismatchError(f"{name}: the driver lacks {name}_v3")
        return self._running(handle, name, kind)

    def nvmlDeviceGetProcessUtilization(self, handle: Handle, last_ts: int) -> list[Any]:
        dev, t = self._enter(handle, "nvmlDeviceGetProcessUtilization")
        quirks = dev.gpu.putil_quirks
        ts = self._sample_base_us(t) + dev.phase_us + dev.last_instant(t) * dev.period_us
        out = []
        if ts > last_ts or "stale" in quirks:  # stale: old samples come back (go-nvml #51, lo2s #230)
            for key, (mem_b, sm) in dev.procs[dev.idx(t)].items():
                pid = self._pid(dev, key, False)  # host pids even where lists are translated (HAMi-core #112)
                if pid is None:
                    continue
                if sm is None and mem_b is not None and "over_100" in quirks:
                    z = _ZOMBIE_UTIL  # a process without samples reads garbage far above 100 (nvtop #110)
                    out.append(self._make("putil", pid=pid, timeStamp=ts, smUtil=z, memUtil=z, encUtil=z, decUtil=z))
                elif sm is not None:
                    out.append(
                        self._make("putil", pid=pid, timeStamp=ts, smUtil=round(sm), memUtil=0, encUtil=0, decUtil=0)
                    )
        if out and "over_100" in quirks:  # ... padded with empty entries (nvtop #110: "PID=0 ... TS=0")
            out.append(self._make("putil", pid=0, timeStamp=0, smUtil=0, memUtil=0, encUtil=0, decUtil=0))
        if not out:
            raise pynvml.NVMLError_NotFound()  # NVML: no process samples newer than last_ts
        return out


# Constants, error classes and struct versions, copied from pynvml so code written against the
# module works unchanged against the fake.
for _n in dir(pynvml):
    if _n.startswith(("NVML_", "NVMLError", "nvmlClocks", "nvmlMemory", "NVMLLibrary", "nvmlTemperature_")):
        setattr(FakeNvml, _n, getattr(pynvml, _n))
