"""The plumbing of the scripted NVML: library state, handles, identity and MIG topology.

:class:`NvmlCore` checks every call the way the driver does (initialised, not mid-reload, GPU
not lost, supported on this handle, not failing) before :class:`~gpuledger.collect.fake_nvml.FakeNvml`
answers it. See that module for the semantics.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from types import SimpleNamespace
from typing import Any

import pynvml

from gpuledger.collect.fake_nvml_gpu import PID_TRANSLATIONS, Device, FakeGpu
from gpuledger.collect.fake_nvml_profiles import DEFAULT_UPTIME_S, SAMPLE_CLOCKS

_U64 = 1 << 64
UNSUPPORTED_ON_MIG = frozenset(
    {
        "nvmlDeviceGetSamples",
        "nvmlDeviceGetUtilizationRates",
        "nvmlDeviceGetProcessUtilization",
        "nvmlDeviceGetTotalEnergyConsumption",
        "nvmlDeviceGetPowerUsage",
        "nvmlDeviceGetTemperature",
        "nvmlDeviceGetTemperatureV",
        "nvmlDeviceGetClockInfo",
        "nvmlDeviceGetViolationStatus",
        "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlDeviceGetCurrentClocksThrottleReasons",
        "nvmlDeviceGetEnforcedPowerLimit",
        "nvmlDeviceGetPciInfo",
        "nvmlDeviceGetIndex",
        "nvmlDeviceGetMinorNumber",
        "nvmlDeviceGetMigMode",
        "nvmlDeviceGetMaxMigDeviceCount",
    }
)
_UNSUPPORTED_IN_MIG_MODE = frozenset(  # the parent of slices cannot report utilisation either
    {"nvmlDeviceGetSamples", "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetProcessUtilization"}
)

_CTYPES: dict[str, Any] = {
    "util": pynvml.c_nvmlUtilization_t,
    "mem": pynvml.c_nvmlMemory_t,
    "mem2": pynvml.c_nvmlMemory_v2_t,
    "viol": pynvml.c_nvmlViolationTime_t,
    "pci": pynvml.nvmlPciInfo_t,
    "putil": pynvml.c_nvmlProcessUtilizationSample_t,
}


class Handle:
    __slots__ = ("dev", "init_epoch", "lost_epoch")

    def __init__(self, dev: Device, init_epoch: int, lost_epoch: int) -> None:
        self.dev, self.init_epoch, self.lost_epoch = dev, init_epoch, lost_epoch


def _light_make(kind: str, **kw: Any) -> Any:
    """An attribute bag with the attribute names of pynvml's struct (fast)."""
    return SimpleNamespace(**kw)


def _ctypes_make(kind: str, **kw: Any) -> Any:
    """The real pynvml struct, to prove the collector reads those right."""
    if kind == "proc":  # pynvml turns process structs into these
        return pynvml.nvmlFriendlyObject(kw)
    return _CTYPES[kind](**kw)


class NvmlCore:
    """Library state, handles and identity of the scripted NVML (FakeNvml adds the queries)."""

    def __init__(
        self,
        gpus: Sequence[FakeGpu],
        clock: Callable[[], float],
        start: float = 0.0,
        *,
        wall_clock: Callable[[], float] | None = None,
        driver_version: str = "550.54.15",
        cuda_version: int = 12040,
        reloads: Sequence[tuple[float, float]] = (),
        library_missing: bool = False,
        ctypes_structs: bool = False,
        host_pid_offset: int = 0,
        pid_translation: str = "none",
        sample_clock: str = "wall",
        boot_clock: Callable[[], float | None] | None = None,
    ) -> None:
        if pid_translation not in PID_TRANSLATIONS:
            raise ValueError(f"pid_translation must be one of {', '.join(PID_TRANSLATIONS)}")
        if sample_clock not in SAMPLE_CLOCKS:
            raise ValueError(f"sample_clock must be one of {', '.join(SAMPLE_CLOCKS)}")
        self.clock, self.wall_clock, self.start = clock, wall_clock, start
        self.sample_clock = sample_clock
        # "boot": sample timestamps on the host's boot clock, read through ``boot_clock`` (as the
        # collector reads it), else DEFAULT_UPTIME_S at trace second 0. Fixed here: that clock
        # never steps with the wall clock.
        boot_now = boot_clock() if boot_clock is not None else None
        self._boot_minus_clock_s = None if boot_now is None else boot_now - clock()
        self.driver_version, self.cuda_version = driver_version, cuda_version
        self.reloads = sorted(reloads)
        self.library_missing = library_missing
        self.host_pid_offset, self.pid_translation = host_pid_offset, pid_translation
        self.run_pids: Iterable[int] = ()
        self.calls: Counter[str] = Counter()
        self._ctypes = ctypes_structs
        self._make = _ctypes_make if ctypes_structs else _light_make
        self._devs = [Device(g, i, None) for i, g in enumerate(gpus)]
        self._by_uuid = {d.gpu.uuid.lower(): d for d in self._devs}
        self._by_uuid.update({s.gpu.uuid.lower(): s for d in self._devs for s in d.slices})
        self._refs = 0
        self._init_epoch = 0

    @property
    def start(self) -> float:
        return self._start

    @start.setter
    def start(self, value: float) -> None:  # tests may set it after building the fake
        self._start, self.start_us = value, round(value * 1e6)

    # -- plumbing ------------------------------------------------------------------------------
    def _t(self) -> float:
        return self.clock() - self._start

    def _sample_base_us(self, t: float) -> int:
        """The timestamp of trace second 0 on the clock that stamps utilisation samples, in µs:
        the wall clock as read now (it may have stepped), or the host's boot clock."""
        if self.sample_clock == "wall":
            return self.start_us + self._offset_us(t)
        if self._boot_minus_clock_s is None:
            return round(DEFAULT_UPTIME_S * 1e6)
        return round((self._start + self._boot_minus_clock_s) * 1e6)

    def _offset_us(self, t: float) -> int:
        """Wall clock minus trace clock, in µs, as read now (0 without a separate wall clock)."""
        if self.wall_clock is None:
            return 0
        return round((self.wall_clock() - (t + self._start)) * 1e6)

    def _reload_epoch(self, t: float) -> int:
        return sum(1 for a, _ in self.reloads if a <= t)

    def _restart(self, t: float) -> float | None:
        """End of the last driver reload before t (None: the driver has been up all along)."""
        ends = [b for _, b in self.reloads if b <= t]
        return max(ends) if ends else None

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

    def _enter(self, handle: Handle, name: str) -> tuple[Device, float]:
        self.calls[name] += 1
        t = self.clock() - self._start
        if self._refs <= 0 or handle.init_epoch != self._init_epoch:
            raise pynvml.NVMLError_Uninitialized()
        if self.reloads:
            self._check_reloads(t)
        dev = handle.dev
        if dev.lost:
            self._check_lost(dev, t)
            if handle.lost_epoch != self._lost_epoch(dev, t):
                raise pynvml.NVMLError_GpuIsLost()
        if name in dev.gpu.unsupported:
            if name[-3:] in ("_v2", "_v3"):
                raise pynvml.NVMLError_FunctionNotFound()  # the driver lacks this versioned symbol
            raise pynvml.NVMLError_NotSupported()
        if (dev.parent is not None and name in UNSUPPORTED_ON_MIG) or (
            dev.mig_mode and name in _UNSUPPORTED_IN_MIG_MODE
        ):
            raise pynvml.NVMLError_NotSupported()
        if dev.gpu.errors:
            code = dev.gpu.errors.get(name)
            if code is not None:
                raise pynvml.NVMLError(code)
        if dev.failing and any(f.target == name and f.active(t) for f in dev.failing):
            raise pynvml.NVMLError_Unknown()  # one call failing while the GPU answers the rest
        return dev, t

    @staticmethod
    def _check_lost(dev: Device, t: float) -> None:
        if any(a <= t < b for a, b in dev.lost):
            raise pynvml.NVMLError_GpuIsLost()

    @staticmethod
    def _lost_epoch(dev: Device, t: float) -> int:
        return sum(1 for a, _ in dev.lost if a <= t)

    def _handle(self, dev: Device, name: str) -> Handle:
        t = self._check_lib(name)
        self._check_lost(dev, t)
        return Handle(dev, self._init_epoch, self._lost_epoch(dev, t))

    @staticmethod
    def _needs(dev: Device, column: str) -> list[Any]:
        values = dev.col[column]
        if values[0] is None:
            raise pynvml.NVMLError_NotSupported()
        return values

    def _owner_setting(self, dev: Device, attr: str) -> Any:
        for gpu in (dev.gpu, dev.parent.gpu if dev.parent is not None else None):
            if gpu is not None and getattr(gpu, attr) is not None:
                return getattr(gpu, attr)
        return getattr(self, attr)

    def _pid(self, dev: Device, key: int | str, translated: bool) -> int | None:
        """The pid the driver reports for a scripted process key (see the module docstring)."""
        if key != "run":
            return int(key)
        pid = min(self.run_pids, default=None)
        if pid is None or translated:
            return pid
        # "the nvidia-driver itself does not support pid-namespaces" (nvidia-docker #1483)
        return pid + self._owner_setting(dev, "host_pid_offset")

    def _energy_mj(self, dev: Device, t: float) -> int:
        restart = self._restart(t) if self.reloads else None
        u = dev.energy_update_instant(t)
        joules = dev.energy_j(u)
        if joules is None:
            raise pynvml.NVMLError_NotSupported()
        for a, b in dev.gpu.energy_stuck:  # what the counter missed while stuck
            if a < u:
                joules -= dev.energy_j(min(u, b)) - dev.energy_j(a)  # type: ignore[operator]
        if restart is None:
            return (math.floor(joules * 1000) + dev.gpu.energy_offset_mj) % _U64
        since = dev.energy_j(restart)
        assert since is not None
        return max(0, math.floor((joules - since) * 1000)) % _U64

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

    @staticmethod
    def nvmlErrorString(result: int) -> bytes:
        """NVML's text for an error code; pynvml hands back the C string as bytes."""
        return pynvml.NVMLError._errcode_to_string.get(result, "Unknown Error").encode()

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

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Handle:
        if not 0 <= index < len(self._devs):
            self._check_lib("nvmlDeviceGetHandleByIndex")
            raise pynvml.NVMLError_InvalidArgument()
        return self._handle(self._devs[index], "nvmlDeviceGetHandleByIndex")

    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> Handle:
        key = (uuid.decode() if isinstance(uuid, bytes) else uuid).lower()
        dev = self._by_uuid.get(key)
        if dev is None:
            self._check_lib("nvmlDeviceGetHandleByUUID")
            raise pynvml.NVMLError_NotFound()
        return self._handle(dev, "nvmlDeviceGetHandleByUUID")

    def nvmlDeviceGetUUID(self, handle: Handle) -> str:
        return self._enter(handle, "nvmlDeviceGetUUID")[0].gpu.uuid

    def nvmlDeviceGetName(self, handle: Handle) -> str:
        dev = self._enter(handle, "nvmlDeviceGetName")[0]
        if dev.parent is not None and dev.gpu.mig_profile:
            return f"{dev.parent.gpu.name} MIG {dev.gpu.mig_profile}"
        return dev.gpu.name

    def nvmlDeviceGetIndex(self, handle: Handle) -> int:
        return self._enter(handle, "nvmlDeviceGetIndex")[0].index

    def nvmlDeviceGetMinorNumber(self, handle: Handle) -> int:
        dev = self._enter(handle, "nvmlDeviceGetMinorNumber")[0]
        return dev.gpu.minor_number if dev.gpu.minor_number is not None else dev.index

    def nvmlDeviceGetArchitecture(self, handle: Handle) -> int:
        return self._enter(handle, "nvmlDeviceGetArchitecture")[0].architecture

    def nvmlDeviceGetPciInfo(self, handle: Handle) -> Any:
        dev = self._enter(handle, "nvmlDeviceGetPciInfo")[0]
        bus_id = dev.gpu.pci_bus_id  # pynvml's struct hands char arrays back as str
        if self._ctypes:
            bus_id = bus_id.encode()  # ... and takes bytes in
        return self._make("pci", busId=bus_id, busIdLegacy=bus_id[-12:], domain=0, bus=0, device=0)

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Handle) -> int:
        dev = self._enter(handle, "nvmlDeviceGetEnforcedPowerLimit")[0]
        if dev.gpu.power_limit_w is None:
            raise pynvml.NVMLError_NotSupported()
        return round(dev.gpu.power_limit_w * 1000)

    # -- MIG -------------------------------------------------------------------------------------
    def nvmlDeviceGetMigMode(self, handle: Handle) -> list[int]:
        dev = self._enter(handle, "nvmlDeviceGetMigMode")[0]
        return [dev.mig_mode, dev.mig_mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Handle) -> int:
        dev = self._enter(handle, "nvmlDeviceGetMaxMigDeviceCount")[0]
        return 7 if dev.mig_mode else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Handle, index: int) -> Handle:
        dev = self._enter(handle, "nvmlDeviceGetMigDeviceHandleByIndex")[0]
        if not dev.mig_mode:
            raise pynvml.NVMLError_NotSupported()
        if not 0 <= index < len(dev.slices):
            raise pynvml.NVMLError_NotFound()
        return Handle(dev.slices[index], handle.init_epoch, handle.lost_epoch)

    def nvmlDeviceIsMigDeviceHandle(self, handle: Handle) -> int:
        return int(self._enter(handle, "nvmlDeviceIsMigDeviceHandle")[0].parent is not None)

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, handle: Handle) -> Handle:
        dev = self._enter(handle, "nvmlDeviceGetDeviceHandleFromMigDeviceHandle")[0]
        if dev.parent is None:
            raise pynvml.NVMLError_InvalidArgument()
        return Handle(dev.parent, handle.init_epoch, handle.lost_epoch)

    # NVML API reference: "Get GPU instance ID for the given MIG device handle"; a full GPU has none.
    def nvmlDeviceGetGpuInstanceId(self, handle: Handle) -> int:
        dev = self._enter(handle, "nvmlDeviceGetGpuInstanceId")[0]
        if dev.parent is None:
            raise pynvml.NVMLError_NotSupported()  # not a MIG device handle
        return dev.gi

    def nvmlDeviceGetComputeInstanceId(self, handle: Handle) -> int:
        dev = self._enter(handle, "nvmlDeviceGetComputeInstanceId")[0]
        if dev.parent is None:
            raise pynvml.NVMLError_NotSupported()
        return dev.gpu.compute_instance_id
