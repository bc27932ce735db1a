"""The NVML GPU collector: the only code that reads NVIDIA hardware (through nvidia-ml-py).

``NvmlCollector(nvml=pynvml)`` on a real machine, ``NvmlCollector(nvml=FakeNvml(...))`` in tests
and replay: one code path. What each figure measures, per tick and device (the tick records
which method it used; docs/METERING.md says it for users):

* busy time: from the driver's utilisation sample buffer (``nvmlDeviceGetSamples``), each sample
  covering at most one sample period before its timestamp; unsampled time is idle when the driver
  stopped sampling, unknown when samples were lost (nvml_util.py, core/metering/busy.py). Unknown time and
  GPUs without samples: the instant reading ``nvmlDeviceGetUtilizationRates`` × time.
* energy: the cumulative energy counter (mJ; field value ``NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION``,
  else ``nvmlDeviceGetTotalEnergyConsumption``) with wrap/reset handling, read where an interval
  ends only (its query costs milliseconds of CPU on real GPUs, 3.4 ms on an H200, against 0.03 ms
  for power; power is read at every tick); where unsupported, or for the span after a counter
  reset or read error, trapezoidal integration of the power readings in the span — the
  instantaneous power field (``NVML_FI_DEV_POWER_INSTANT``) where it exists, because
  ``nvmlDeviceGetPowerUsage`` is a 1 s average on Ampere (except GA100) and later.
* throttling: cumulative violation counters or reason bits (nvml_throttle.py).
* memory: v2 API (used excludes driver-reserved memory, reported apart), else v1.
* temperature: ``nvmlDeviceGetTemperatureV``, else the deprecated ``nvmlDeviceGetTemperature``.
* the run's processes: memory and SM share of the processes that are the run's (core/metering/gpu_procs.py
  decides, collect/pid_owner.py gathers the facts: host PIDs, containers, Slurm steps).

Every query goes through nvml_query.Querier: absent series are None and not asked again, a field
that keeps failing is dropped alone, a GPU whose every query failed — or that answers GpuIsLost —
is lost: one ``gpu_lost`` event, re-init and handle lookup by UUID with exponential backoff on the
injected monotonic clock, and ``gpu_recovered`` when it answers again; the span while it was lost
has no ticks (absent, not zero). ``read`` never raises.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pynvml

from gpuledger.collect import nvml_lib
from gpuledger.collect.base import CollectorUnavailable, GpuProcess, GpuRead
from gpuledger.collect.nvml_devices import DeviceFinder, Found
from gpuledger.collect.nvml_query import NOTHING_NEW, DeviceQueries, Querier
from gpuledger.collect.nvml_throttle import ThrottleReader, ThrottleState
from gpuledger.collect.nvml_util import UtilReader, host_boot_time
from gpuledger.collect.pid_owner import PidOwner
from gpuledger.core.metering.gpu_procs import ProcMatch, attribute, sm_share
from gpuledger.core.metering.integrate import (
    counter_delta,
    implausible_counter,
    surely_plausible_mj,
    trapezoid_energy_j,
)
from gpuledger.core.model import ENERGY_COUNTER, ENERGY_POWER, UTIL_INSTANT, UTIL_SAMPLES, Event, GpuIdentity, GpuTick

_BACKOFF_FIRST_S, _BACKOFF_MAX_S = 1.0, 60.0
_RARE_LIST_TICKS = 10  # the MPS and graphics process lists, while empty, are asked this seldom
_NOTE = "note"  # event kind for facts about the metering (not errors)


class _Device:
    """Per-device handle, cursors and the memo of what the device cannot answer."""

    __slots__ = (
        "backoff", "busy_lists", "energy_mj", "energy_t", "gi", "handle", "ident", "lost", "lost_at", "minor",
        "mono_last", "noteworthy", "power_j", "power_t", "power_w", "proc_reads", "proc_ts", "q", "retry_at",
        "sure_mj", "t_last", "throttle", "util", "uuid", "verdict", "via_parent",
    )  # fmt: skip

    def __init__(self, found: Found, q: DeviceQueries, util: UtilReader) -> None:
        self.ident, self.uuid, self.handle = found.ident, found.ident.uuid, found.handle
        self.minor, self.via_parent = found.minor, found.via_parent
        # Only a MIG slice, or a parent named for its slice, has facts to note (_notes).
        self.noteworthy = found.via_parent or found.ident.mig_parent_uuid is not None
        self.q, self.util = q, util
        self.throttle = ThrottleState()
        self.t_last: float | None = None  # None: the next read primes the cursors
        self.mono_last = 0.0
        self.proc_ts = 0  # NVML µs timestamp of the last per-process utilisation sample seen
        self.proc_reads = 0
        self.busy_lists: set[str] = set()  # MPS / graphics process lists that have held a process
        self.verdict: _Verdict | None = None  # the last attribution of its processes
        self.energy_mj: int | None = None
        self.energy_t = 0.0  # when the counter was last read
        self.power_w: float | None = None
        self.power_t = 0.0  # when power was last read
        self.power_j: float | None = 0.0  # power integrated from energy_t to power_t (None: a reading missed)
        # Energy counter deltas up to this need no plausibility check (_energy_since's fast path).
        self.sure_mj = surely_plausible_mj(found.ident.power_limit_w)
        self.lost = False
        self.lost_at = 0.0
        self.retry_at = 0.0
        self.backoff = _BACKOFF_FIRST_S
        self.gi: int | None = None  # a MIG slice's GPU instance id, set by the collector


@dataclass(slots=True)
class _Verdict:
    """Which of a GPU's listed processes were the run's, and until when the facts behind it hold."""

    pids: frozenset[int]  # the run's processes it was made for
    procs: dict[int, int | None]  # the GPU's processes (pid -> memory) it was made from
    verified: dict[int, str]
    holders: int | None
    until: float  # on the PidOwner's clock
    match: ProcMatch


class _Parent:
    """A MIG-mode GPU read for its energy only (the node agent's capacity meter prices the GPU)."""

    __slots__ = ("energy_mj", "handle", "power_j", "power_t", "power_w", "q", "sure_mj", "t_last", "uuid")

    def __init__(self, uuid: str, handle: Any, q: DeviceQueries) -> None:
        self.uuid, self.handle, self.q = uuid, handle, q
        self.energy_mj: int | None = None
        self.power_w: float | None = None
        self.power_t = 0.0
        self.power_j: float | None = 0.0  # read at every read: nothing between two energy readings
        self.sure_mj = surely_plausible_mj(None)  # its power limit is not read: any GPU's bounds it
        self.t_last: float | None = None


class NvmlCollector:
    """GpuCollector over NVML for the GPUs that ``visible`` (CUDA_VISIBLE_DEVICES) exposes.

    ``clock`` is monotonic (retry backoff, elapsed time); ``wall`` is the host's real wall clock,
    the clock most drivers stamp samples with (compared with ``clock`` to see it step); ``boot``
    the host's seconds since boot, the clock other drivers stamp them with (nvml_util.py); the
    ``now`` given to ``read`` only dates the ticks. ``owner`` gathers the /proc facts about the run's
    processes (a ``PidOwner`` on the real /proc by default). ``all_processes``: also report every
    process on every GPU in ``GpuRead.processes`` (the node agent attributes them itself).
    """

    def __init__(
        self,
        nvml: Any = None,
        visible: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        source: str = "nvml",
        owner: PidOwner | None = None,
        wall: Callable[[], float] | None = None,
        all_processes: bool = False,
        boot: Callable[[], float | None] | None = host_boot_time,
    ) -> None:
        self._nvml = nv = pynvml if nvml is None else nvml
        self._clock = clock
        self._wall, self._boot = wall, boot
        self._all_processes = all_processes  # report every process on every GPU (the node agent)
        self._events: list[Event] = []
        self._now = 0.0
        self._q = Querier(nv, self._events_append, lambda: self._now)
        self._bind_functions(nv)
        self._throttle = ThrottleReader(nv, self._q)
        self._finder = DeviceFinder(nv, self._q.absent, source)
        self._owner = owner
        self._need_init = False
        self._closed = False
        try:
            nv.nvmlInit()
        except Exception as exc:  # any failure to start means "no NVML here"
            if isinstance(exc, getattr(nv, "NVMLError_LibraryNotFound", ())):
                raise NvmlLibraryMissing(_init_reason(nv, exc)) from exc
            raise CollectorUnavailable(_init_reason(nv, exc)) from exc
        try:
            self._devs = [self._device(f) for f in self._finder.discover(visible)]
        except Exception as exc:
            self.close()
            raise CollectorUnavailable(f"NVML could not list the GPUs: {exc}") from exc
        self._identities = [d.ident for d in self._devs]
        self._parents: dict[str, _Parent] = {}  # MIG-mode GPUs, read in all_processes mode

    def _bind_functions(self, nv: Any) -> None:
        # Bound once: saves a module attribute lookup per query, and an old nvidia-ml-py that
        # lacks a function leaves it None, which the query helper treats as unsupported.
        f = lambda name: getattr(nv, name, None)  # noqa: E731
        self._f_samples = f("nvmlDeviceGetSamples")
        self._f_util = f("nvmlDeviceGetUtilizationRates")
        self._f_fields = f("nvmlDeviceGetFieldValues")
        self._f_energy = f("nvmlDeviceGetTotalEnergyConsumption")
        self._f_power = f("nvmlDeviceGetPowerUsage")
        self._f_mem = f("nvmlDeviceGetMemoryInfo")
        self._f_temp_v = f("nvmlDeviceGetTemperatureV")
        self._f_temp = f("nvmlDeviceGetTemperature")
        self._f_clock = f("nvmlDeviceGetClockInfo")
        self._f_putil = f("nvmlDeviceGetProcessUtilization")
        self._proc_fns = tuple(
            (key, f(name), f(name + "_v2"))
            for key, name in (
                ("procs", "nvmlDeviceGetComputeRunningProcesses"),
                ("mps_procs", "nvmlDeviceGetMPSComputeRunningProcesses"),
                ("gprocs", "nvmlDeviceGetGraphicsRunningProcesses"),
            )
        )
        self._mem_v2 = getattr(nv, "nvmlMemory_v2", None)
        self._util_samples = nv.NVML_GPU_UTILIZATION_SAMPLES
        self._temp_gpu = nv.NVML_TEMPERATURE_GPU
        self._clock_sm, self._clock_mem = nv.NVML_CLOCK_SM, nv.NVML_CLOCK_MEM
        self._fi_energy = getattr(nv, "NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION", None)
        self._fi_power = getattr(nv, "NVML_FI_DEV_POWER_INSTANT", None)
        self._power_ids = tuple(i for i in (self._fi_energy, self._fi_power) if i is not None)
        self._power_id = () if self._fi_power is None else (self._fi_power,)

    def _device(self, found: Found) -> _Device:
        mig = found.ident.mig_parent_uuid is not None
        # A slice handle answers InvalidArgument for some whole-GPU queries: absent too.
        q = DeviceQueries(found.ident.uuid, str(found.ident.index), self._q.absent_mig if mig else self._q.absent)
        holder: list[_Device] = []
        util = UtilReader(
            samples=self._samples_query(q, found.handle),
            instant=lambda: self._instant(holder[0]),
            note=lambda key, text: self._q.once(q, key, _NOTE, text),
            boot=self._boot,
        )
        d = _Device(found, q, util)
        if mig:  # fixed while the slice exists: asked once (dcgm-exporter's GPU_I_ID on /metrics)
            with contextlib.suppress(self._nvml.NVMLError, AttributeError):
                d.gi = int(self._nvml.nvmlDeviceGetGpuInstanceId(found.handle))
        holder.append(d)
        return d

    def _samples_query(self, q: DeviceQueries, handle: Any) -> Callable[[int], Any]:
        """``samples(cursor)`` for a UtilReader: a partial (C) rather than a lambda, as it runs for
        every GPU at every tick; made again when the handle changes (_try_recover)."""
        return functools.partial(self._q.call, q, "samples", self._f_samples, handle, self._util_samples, since=True)

    # -- GpuCollector --------------------------------------------------------------------------
    def devices(self) -> list[GpuIdentity]:
        return list(self._identities)

    def read(self, pids: set[int], now: float, closes_interval: bool = True, final: bool = False) -> GpuRead:
        out = GpuRead()
        if self._closed:
            return out
        self._events, self._now = out.events, now
        for d in self._devs:
            try:
                if d.lost:
                    self._try_recover(d, now)
                    continue
                q = d.q
                q.start_read()
                said = len(out.events)
                tick = self._read_device(d, pids, now, out, closes_interval, final)
                if q.failed and not q.answered:  # all_failed, inline: nothing answered, the GPU is gone
                    del out.events[said:]
                    self._q.forget_read(q)
                    self._mark_lost(d, _NothingAnswered(), now)
                elif tick is not None:
                    out.ticks.append(tick)
            except self._q.lost as exc:
                self._mark_lost(d, exc, now)
            except Exception as exc:  # a bug or an unexpected error must not stop the recorder
                self._q.report(d.q, "read", exc)
        if self._all_processes:
            self._read_parents(now, out)
        return out

    def _read_parents(self, now: float, out: GpuRead) -> None:
        """The energy of each MIG-mode GPU whose slices answer, since the previous read: the counter's
        delta, else power integrated (as for a whole GPU); the first read of one only primes it."""
        live = {d.ident.mig_parent_uuid for d in self._devs if d.ident.mig_parent_uuid is not None and not d.lost}
        for gone in self._parents.keys() - live:  # its slices were lost: primed afresh when they answer
            del self._parents[gone]
        for uuid in sorted(live):  # type: ignore[type-var]
            p = self._parents.get(uuid)
            try:
                if p is None:
                    handle = self._nvml.nvmlDeviceGetHandleByUUID(uuid)
                    p = self._parents[uuid] = _Parent(uuid, handle, DeviceQueries(uuid, "MIG parent", self._q.absent))
                p.q.start_read()
                mj, power = self._power_readings(p)  # type: ignore[arg-type]
            except Exception:  # lost with its slices (their reads say so), or not there: unmeasured
                self._parents.pop(uuid, None)
                out.parent_energy[uuid] = None
                continue
            t_last, p.t_last = p.t_last, now
            if t_last is None or now <= t_last:  # the first read primes the counter
                p.energy_mj, p.power_w, p.power_t = mj, power, now
                out.parent_energy[uuid] = None
                continue
            out.parent_energy[uuid] = self._energy_since(p, t_last, now, mj, power)[0]

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            with contextlib.suppress(Exception):  # nothing to do about a failed shutdown
                self._nvml.nvmlShutdown()

    def _events_append(self, event: Event) -> None:
        self._events.append(event)

    # -- one device, one tick ------------------------------------------------------------------
    def _read_device(
        self, d: _Device, pids: set[int], now: float, out: GpuRead, closes: bool, final: bool = False
    ) -> GpuTick | None:
        mono = self._clock()
        wall = now if self._wall is None else self._wall()
        t0 = d.t_last
        if t0 is None:
            self._prime(d, wall, mono)
            d.t_last, d.mono_last = now, mono
            return None
        if now <= t0:
            return None  # nothing elapsed: leave the cursors for the next read
        elapsed = mono - d.mono_last
        if elapsed <= 0.0:  # the monotonic clock did not move (a test's): the ticks' own span
            elapsed = now - t0
        tick = GpuTick(d.uuid, t0, now)  # positional: made for every GPU at every read
        if d.gi is not None:
            tick.gpu_instance_id = d.gi
        h = d.handle
        self._busy(d, tick, wall, mono, elapsed)
        if final:
            self._settle(d, tick, wall, elapsed)
        if closes or d.energy_mj is None:
            mj, tick.power_w = self._power_readings(d)
            tick.energy_total_mj = mj
            tick.energy_j, tick.energy_method = self._energy_since(
                d, d.energy_t, now, mj, tick.power_w, d.ident.power_limit_w
            )
            d.energy_t = now
        else:  # the counter is read where an interval ends only: its query costs milliseconds (module doc)
            tick.power_w = self._power_readings(d, energy=False)[1]
            self._integrate_power(d, now, tick.power_w)
        self._gauges(d, tick)
        if closes or not d.throttle.names:  # counters are read where an interval ends only (nvml_throttle.py)
            tick.throttle_s = self._throttle.read(d.q, h, d.throttle, elapsed, closes)
        if pids:
            self._processes(d, tick, pids)
        elif self._all_processes:
            out.processes += self._every_process(d)
        if d.noteworthy:
            self._notes(d)
        d.t_last, d.mono_last = now, mono
        return tick

    def _prime(self, d: _Device, wall: float, mono: float) -> None:
        """Set every cursor from the device's current counters; the first tick starts here."""
        h = d.handle
        d.util.prime(wall, mono)
        d.energy_mj, d.power_w = self._power_readings(d)
        d.energy_t = d.power_t = self._now
        d.power_j = 0.0
        self._throttle.prime(d.q, h, d.throttle)
        d.proc_ts = 0
        res = self._q.call(d.q, "putil", self._f_putil, h, 0, since=True)
        if res is not None and res is not NOTHING_NEW and res:
            d.proc_ts = max(int(s.timeStamp) for s in res)

    def _notes(self, d: _Device) -> None:
        ident = d.ident
        if d.via_parent:
            self._q.once(d.q, "via_parent", _NOTE, f"CUDA_VISIBLE_DEVICES names GPU {ident.mig_parent_uuid}, which "
                         f"is in MIG mode: CUDA runs on its first MIG device ({ident.mig_profile}); that slice is "
                         "metered", parent=ident.mig_parent_uuid)  # fmt: skip
        if ident.mig_parent_uuid is not None and {"samples", "util"} <= d.q.unsupported:
            self._q.once(d.q, "mig_no_busy", _NOTE, "NVML reports no utilisation for a MIG slice: its busy time "
                         "is absent (not zero), so on the busy basis it is billed its held hours (flag "
                         "busy_unmeasured), as its fraction of the parent GPU",
                         mig_profile=ident.mig_profile)  # fmt: skip

    def _busy(self, d: _Device, tick: GpuTick, wall: float, mono: float, elapsed: float) -> None:
        if "samples" not in d.q.unsupported:
            r = d.util.read(wall, mono, elapsed)
            if r is None and "samples" not in d.q.unsupported:  # a passing error: this span is unknown
                r = d.util.missed(wall, elapsed)
                if r is None:
                    return  # NVML's clock not known: the cursor stays, the next tick covers this span
            if r is not None:
                tick.busy_s, tick.util_method, tick.util_max_pct, tick.util_idle_s, tick.util_unknown_s = r
                return
        pct = self._instant(d)
        if pct is not None:
            tick.busy_s, tick.util_max_pct, tick.util_method = pct / 100 * elapsed, pct, UTIL_INSTANT

    @staticmethod
    def _settle(d: _Device, tick: GpuTick, wall: float, elapsed: float) -> None:
        """The run's last read: the time after the newest sample joins this tick (nvml_util.settle)."""
        if tick.util_method is None or "samples" in d.q.unsupported:
            return  # busy time from the instant reading (to now) or not measured at all
        r = d.util.settle(wall, elapsed)
        if r is None:
            return
        tick.busy_s = (tick.busy_s or 0.0) + r.busy_s
        tick.util_unknown_s = (tick.util_unknown_s or 0.0) + r.unknown_s
        if tick.util_method == UTIL_SAMPLES:  # "instant,samples" when the instant reading measured the rest
            tick.util_method = r.method
        if r.max_pct is not None and (tick.util_max_pct is None or r.max_pct > tick.util_max_pct):
            tick.util_max_pct = r.max_pct

    def _instant(self, d: _Device) -> float | None:
        rates = self._q.call(d.q, "util", self._f_util, d.handle)
        return None if rates is None else min(max(float(rates.gpu), 0.0), 100.0)

    def _power_readings(self, d: _Device, energy: bool = True) -> tuple[int | None, float | None]:
        """(energy counter mJ, power W) now: field values in one call, the classic calls for what they
        lack; ``energy`` False: power alone (the counter is None, not asked)."""
        ids = self._power_ids if energy else self._power_id
        vals = self._q.fields(d.q, self._f_fields, d.handle, ids) if ids else {}
        mj = None
        if energy:
            mj = vals.get(self._fi_energy) if self._fi_energy is not None else None
            if mj is None and "energy" not in d.q.unsupported:
                mj = self._q.call(d.q, "energy", self._f_energy, d.handle)
        mw = vals.get(self._fi_power) if self._fi_power is not None else None
        if mw is None:  # no instantaneous field: GetPowerUsage (a 1 s average on Ampere, except GA100, and later)
            mw = self._q.call(d.q, "power", self._f_power, d.handle)
        return (None if mj is None else int(mj)), (None if mw is None else mw / 1000)

    @staticmethod
    def _integrate_power(d: _Device | _Parent, t: float, power: float | None) -> None:
        """Add power's trapezoid since the previous power reading to ``d.power_j`` (None once one is missing)."""
        if d.power_j is not None:
            prev = d.power_w
            if prev is None or power is None:
                d.power_j = None
            else:
                d.power_j += trapezoid_energy_j(d.power_t, prev, t, power)
        d.power_w, d.power_t = power, t

    def _energy_since(
        self,
        d: _Device | _Parent,
        t0: float,
        t1: float,
        mj: int | None,
        power: float | None,
        limit_w: float | None = None,
    ) -> tuple[float | None, str | None]:
        """(J, method) over (t0, t1] from the device's previous readings: the counter's delta (unless
        it cannot be right for a GPU of power limit ``limit_w``), else power integrated over the power
        readings since t0; the readings become the next call's previous ones."""
        energy = method = None
        if mj is not None:
            prev = d.energy_mj
            delta = mj - prev if prev is not None and mj >= prev else counter_delta(prev, mj)  # the usual case inline
            if delta is not None:
                plausible = 0 < delta <= d.sure_mj  # nearly always: no further check
                why = None if plausible else implausible_counter(delta / 1000, t1 - t0, d.power_w, power, limit_w)
                if why is None:
                    energy, method = delta / 1000, ENERGY_COUNTER
                else:  # a broken reading: this span integrates power; the next one starts from it
                    self._q.report(d.q, "energy", _COUNTER_ERRORS[why](delta / 1000, t1 - t0, power))
            elif d.energy_mj is not None:
                self._q.report(d.q, "energy", _CounterReset())
        d.energy_mj = mj  # None after a read error: re-base rather than double count
        self._integrate_power(d, t1, power)
        if energy is None and d.power_j is not None:
            energy, method = d.power_j, ENERGY_POWER
        d.power_j = 0.0
        return energy, method

    def _gauges(self, d: _Device, tick: GpuTick) -> None:
        """Memory (v2 API, else v1), temperature (``nvmlDeviceGetTemperatureV``, else the deprecated
        call) and clocks now. One function, the None tests inline: it runs for every GPU at every tick."""
        h, q, call = d.handle, d.q, self._q.call
        m = call(q, "mem_v2", self._f_mem, h, self._mem_v2) if self._mem_v2 else None
        if m is not None:
            tick.mem_used_b, tick.mem_reserved_b = int(m.used), int(m.reserved)
        else:
            m = call(q, "mem", self._f_mem, h)
            tick.mem_used_b = None if m is None else int(m.used)
        t = call(q, "temp_v", self._f_temp_v, h, self._temp_gpu)
        if t is None:
            t = call(q, "temp", self._f_temp, h, self._temp_gpu)
        tick.temp_c = None if t is None else float(t)
        sm = call(q, "sm_clock", self._f_clock, h, self._clock_sm)
        tick.sm_clock_mhz = None if sm is None else float(sm)
        mem = call(q, "mem_clock", self._f_clock, h, self._clock_mem)
        tick.mem_clock_mhz = None if mem is None else float(mem)

    def _processes(self, d: _Device, tick: GpuTick, pids: set[int]) -> None:
        procs = self._gpu_processes(d)
        if procs is None:
            return
        owner = self._owner or self._pid_owner()
        foreign = owner.foreign_ns
        match = self._match(d, owner, procs, pids)
        if foreign and procs:
            self._q.once(d.q, "pidns", _NOTE, "this run is in a PID namespace (a container): NVML lists GPU "
                         "processes by host pid, so the run's processes are found by verified pid or by the "
                         "processes holding the GPU's device node")  # fmt: skip
        if match.reason:
            self._q.once(d.q, "proc_unknown", _NOTE, match.reason + "; per-process figures are absent")
        tick.proc_mem_b, tick.proc_method = match.mem_b, match.method
        samples = self._q.call(d.q, "putil", self._f_putil, d.handle, d.proc_ts, since=True)
        if samples is NOTHING_NEW:
            tick.proc_sm_util_pct = 0.0 if match.method is not None else None  # no process ran a kernel
        elif samples is not None:
            tick.proc_sm_util_pct, d.proc_ts = sm_share(
                samples, match, d.proc_ts, listed=procs.keys(), foreign_ns=foreign
            )

    def _match(self, d: _Device, owner: PidOwner, procs: dict[int, int | None], pids: set[int]) -> ProcMatch:
        """The run's share of the GPU's processes. The verdict is reused while the same pids are
        listed for the same run and none of the /proc facts it consulted is due to be read again,
        so it is what a fresh one would be: the facts are read no less often."""
        v = d.verdict
        if v is not None and v.pids == pids and owner.holds(v.until):
            if v.procs == procs:  # the same processes holding the same memory
                return v.match
            if v.procs.keys() == procs.keys():
                v.procs, v.match = procs, attribute(procs, v.verified, foreign_ns=owner.foreign_ns, holders=v.holders)
                return v.match
        owner.open_verdict()
        verified = owner.verified(procs, pids) if procs else {}
        holders = owner.holders(pids, d.minor) if owner.foreign_ns and procs and not verified else None
        match = attribute(procs, verified, foreign_ns=owner.foreign_ns, holders=holders)
        d.verdict = _Verdict(frozenset(pids), procs, verified, holders, owner.verdict_until(), match)
        return match

    def _every_process(self, d: _Device) -> list[GpuProcess]:
        """Every process on the GPU with its memory and mean SM share since the previous read."""
        procs = self._gpu_processes(d)
        if procs is None:
            return []
        samples = self._q.call(d.q, "putil", self._f_putil, d.handle, d.proc_ts, since=True)
        sm: dict[int, list[float]] = {}
        if samples is not None and samples is not NOTHING_NEW:
            newest = d.proc_ts
            for s in samples:
                ts, value = int(s.timeStamp), float(s.smUtil)
                if ts <= d.proc_ts or not 0 <= value <= 100:
                    continue  # stale or impossible (core/metering/gpu_procs.py)
                newest = max(newest, ts)
                acc = sm.setdefault(int(s.pid), [0.0, 0.0])
                acc[0] += value
                acc[1] += 1
            d.proc_ts = newest
        idle = 0.0 if samples is NOTHING_NEW else None  # nothing newer: no process ran a kernel
        return [
            GpuProcess(d.uuid, pid, mem, (sm[pid][0] / sm[pid][1]) if pid in sm else idle) for pid, mem in procs.items()
        ]

    def _gpu_processes(self, d: _Device) -> dict[int, int | None] | None:
        """pid -> usedGpuMemory of every process on the GPU (compute, MPS and graphics); None: unknown.

        The MPS and graphics lists are empty on almost every training node: while they stay empty
        they are asked every ``_RARE_LIST_TICKS``-th read only, then every read once one is not.
        """
        seen: dict[int, int | None] = {}
        known = False
        d.proc_reads += 1
        every = not d.proc_reads % _RARE_LIST_TICKS
        for key, fn, fn_v2 in self._proc_fns if every or d.busy_lists else self._proc_fns[:1]:
            if not every and key != "procs" and key not in d.busy_lists:
                continue
            procs = self._q.call(d.q, key, fn, d.handle)
            if procs is None and key in d.q.unsupported:
                procs = self._q.call(d.q, key + "_v2", fn_v2, d.handle)  # older drivers
            if procs is None:
                continue
            known = True
            if procs and key != "procs":
                d.busy_lists.add(key)
            for p in procs:
                pid = int(p.pid)
                if pid not in seen:  # a process may be in two lists
                    mem = p.usedGpuMemory
                    seen[pid] = None if mem is None else int(mem)
        return seen if known else None

    def _pid_owner(self) -> PidOwner:
        if self._owner is None:
            self._owner = PidOwner(clock=self._clock)
        return self._owner

    # -- lost and found ------------------------------------------------------------------------
    def _mark_lost(self, d: _Device, exc: BaseException, now: float) -> None:
        d.lost, d.lost_at, d.t_last = True, now, None
        d.backoff = _BACKOFF_FIRST_S
        d.retry_at = self._clock() + d.backoff
        if isinstance(exc, self._q.reinit):
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
            d.util.samples = self._samples_query(d.q, d.handle)
            d.q.start_read()
            self._prime(d, now if self._wall is None else self._wall(), mono)
            if d.q.all_failed:
                raise _NothingAnswered()
        except Exception as exc:
            if isinstance(exc, self._q.reinit):
                self._need_init = True
            d.backoff = min(d.backoff * 2, _BACKOFF_MAX_S)
            d.retry_at = mono + d.backoff
            return
        d.lost, d.t_last, d.mono_last = False, now, mono
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
        except (nv.NVMLError_NotFound, nv.NVMLError_InvalidArgument):
            if d.ident.mig_parent_uuid is None:
                raise
        parent = nv.nvmlDeviceGetHandleByUUID(d.ident.mig_parent_uuid)  # drivers that can't find MIG UUIDs
        for _uuid, mh in self._finder.mig_slices(parent):
            if _uuid == d.uuid:
                return mh
        raise nv.NVMLError_NotFound()


class NvmlLibraryMissing(CollectorUnavailable):
    """libnvidia-ml.so could not be loaded: no NVIDIA driver on this machine (or not on the path)."""


class _NothingAnswered(Exception):
    def __str__(self) -> str:
        return "every query of this read failed"


class _CounterReset(Exception):
    def __str__(self) -> str:
        return "the cumulative energy counter went backwards (driver reload or GPU reset); this tick integrates power"


class _CounterImplausible(Exception):
    def __init__(self, joules: float, seconds: float, power_w: float | None) -> None:
        super().__init__(joules, seconds, power_w)
        self.joules, self.seconds, self.power_w = joules, seconds, power_w


class _CounterStuck(_CounterImplausible):
    def __str__(self) -> str:
        return (f"the energy counter did not move in {self.seconds:.1f} s while the GPU drew "
                f"{self.power_w or 0:.0f} W; such spans integrate power")  # fmt: skip


class _CounterSpike(_CounterImplausible):
    def __str__(self) -> str:
        return (f"the energy counter rose {self.joules:,.0f} J in {self.seconds:.1f} s, more than the GPU can draw; "
                "such spans integrate power")  # fmt: skip


_COUNTER_ERRORS: dict[str, type[_CounterImplausible]] = {"stuck": _CounterStuck, "spike": _CounterSpike}


def _init_reason(nv: Any, exc: BaseException) -> str:
    if isinstance(exc, getattr(nv, "NVMLError_LibraryNotFound", ())):
        return nvml_lib.MISSING
    if isinstance(exc, getattr(nv, "NVMLError_DriverNotLoaded", ())):
        return "the NVIDIA driver is installed but not loaded (NVML: Driver Not Loaded)"
    if isinstance(exc, getattr(nv, "NVMLError_NoPermission", ())):
        return "no permission to use NVML (check access to /dev/nvidia*)"
    return f"NVML failed to start: {type(exc).__name__}: {exc}"
