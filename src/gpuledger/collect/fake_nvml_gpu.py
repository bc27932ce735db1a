"""One scripted GPU: what a test or trace describes (``FakeGpu``), and its compiled form.

``FakeGpu`` and ``TracePoint`` are public (re-exported by :mod:`gpuledger.collect.fake_nvml`).
``Device`` turns a FakeGpu into prefix integrals and a utilisation sample schedule so each NVML
query costs a bisect or two, whatever the length of the trace.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuledger.collect.fake_nvml_profiles import (
    IDLE_SAMPLING,
    POLICY_REASONS,
    PROCESS_LISTS,
    REASON_BITS,
    Profile,
    architecture,
    phase_fraction,
    resolve_profile,
)

PLAIN_FIELDS = ("util_pct", "mem_used_b", "power_w", "temp_c", "sm_clock_mhz", "mem_clock_mhz")
PID_TRANSLATIONS = ("none", "lists")
PUTIL_QUIRKS = frozenset({"stale", "over_100"})
_K_NEG, _K_POS = -(1 << 62), 1 << 62  # sample indices standing for "for ever" before / after


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


@dataclass(frozen=True)
class Failing:
    """``target`` (an NVML function name, or a field id) answers NVMLError_Unknown in [start, end).

    Real cards do this: one query answering "Unknown Error" while the rest of the GPU answers
    (nvidia-smi fields reading "[Unknown Error]" alone: tutulino/Megaminer #376, Quake4/MindMiner
    #627). Times are trace seconds; None means for ever on that side.
    """

    target: str | int
    start: float | None = None
    end: float | None = None

    def active(self, t: float) -> bool:
        return (self.start is None or self.start <= t) and (self.end is None or t < self.end)


@dataclass(eq=False)
class FakeGpu:
    """One scripted GPU (or MIG slice, when listed in a parent's ``mig``).

    Behaviour comes from ``profile`` (a name in ``fake_nvml_profiles.PROFILES`` or a Profile;
    None: chosen from ``name``). ``sample_period_s``, ``buffer_len``, ``idle_sampling``,
    ``energy_update_s`` and ``power_average_s`` override single profile fields.
    """

    uuid: str
    name: str = "NVIDIA A100-SXM4-80GB"
    points: list[TracePoint] = field(default_factory=list)
    memory_total_b: int = 80 * 1024**3
    memory_reserved_b: int = 0
    power_limit_w: float | None = 400.0
    pci_bus_id: str = "00000000:07:00.0"
    # NVML function names raising NotSupported; a versioned name ("..._v2", "..._v3") is a symbol the
    # driver lacks (FunctionNotFound), e.g. "nvmlDeviceGetMemoryInfo_v2" for drivers before the v2 call.
    unsupported: frozenset[str] = frozenset()
    unsupported_fields: frozenset[int] = frozenset()  # field ids answering NOT_SUPPORTED
    errors: dict[str, int] = field(default_factory=dict)  # function name: NVML error code raised always
    failing: Sequence[Failing] = ()  # functions or field ids failing with Unknown, optionally in windows
    lost: list[tuple[float, float]] = field(default_factory=list)  # trace-time windows
    mig: list[FakeGpu] = field(default_factory=list)  # MIG slices (MIG mode on when non-empty)
    mig_profile: str | None = None  # for a slice, e.g. "3g.40gb"
    mig_mode: int | None = None  # None: 1 with slices, else 0
    gpu_instance_id: int | None = None  # for a slice; None: its position + 1
    compute_instance_id: int = 0  # for a slice
    energy_offset_mj: int = 0
    # Trace-time windows in which the energy counter stops counting (it holds its value while the
    # GPU draws power; after the window it counts on from there): counters seen frozen in the
    # field (DCGM job stats of 0 J at 247 W, NVIDIA/DCGM#171; a counter constant for a whole
    # program, ROCm/rocm_smi_lib#180).
    energy_stuck: list[tuple[float, float]] = field(default_factory=list)
    profile: str | Profile | None = None
    sample_period_s: float | None = None
    buffer_len: int | None = None
    idle_sampling: str | None = None  # "grid", "slow" or "stop"
    energy_update_s: float | None = None
    power_average_s: float | None = None
    sample_phase_s: float | None = None  # None: from the uuid (0 for the ideal profile)
    energy_phase_s: float | None = None
    minor_number: int | None = None  # None: the GPU's index
    extra_fields: dict[int, int | float] = field(default_factory=dict)  # other field ids: constant values
    # False: usedGpuMemory None (NVML_VALUE_NOT_AVAILABLE, which pynvml maps to None). NVML documents it
    # under WDDM; collectors report it on MIG slices too (undocumented), so slices default to it (None).
    process_memory: bool | None = None
    putil_quirks: frozenset[str] = frozenset()  # "stale", "over_100" (nvmlDeviceGetProcessUtilization)
    host_pid_offset: int | None = None  # None: the FakeNvml's
    pid_translation: str | None = None  # None: the FakeNvml's
    # Which list the scripted processes are in. NVML API reference: nvmlDeviceGetComputeRunningProcesses
    # lists processes with a compute context, nvmlDeviceGetMPSComputeRunningProcesses those with an
    # MPS compute context (clients of an MPS server), nvmlDeviceGetGraphicsRunningProcesses those with
    # a graphics context. "compute", "mps" or "graphics"; the other lists are empty.
    process_list: str = "compute"


def _fill(values: list[Any], default: Any = None, backfill: bool = True) -> list[Any]:
    """Forward-fill Nones; leading ones take the first known value (or the default)."""
    first = next((v for v in values if v is not None), default) if backfill else default
    out, last = [], first
    for v in values:
        last = v if v is not None else last
        out.append(last)
    return out


class Device:
    """A FakeGpu compiled for fast lookups, plus the driver's sample buffer (the only state)."""

    def __init__(self, gpu: FakeGpu, index: int, parent: Device | None) -> None:
        self.gpu, self.index, self.parent = gpu, index, parent
        owner = parent.gpu if parent is not None else gpu
        self.profile = resolve_profile(gpu.profile if gpu.profile is not None else owner.profile, owner.name)
        self.architecture = architecture(self.profile, owner.name)
        pts = sorted(gpu.points, key=lambda p: p.t) or [TracePoint(0.0)]
        self.ts = [p.t for p in pts]
        self.col: dict[str, list[Any]] = {name: _fill([getattr(p, name) for p in pts]) for name in PLAIN_FIELDS}
        self.throttle = _fill([p.throttle for p in pts], (), backfill=False)
        self.procs = _fill([p.procs for p in pts], {}, backfill=False)
        unknown = {r for rs in self.throttle for r in rs} - set(REASON_BITS)
        if unknown:
            raise ValueError(f"{gpu.uuid}: unknown throttle reason(s) {', '.join(sorted(unknown))}")
        self.bits = [sum(REASON_BITS[r] for r in set(rs)) for rs in self.throttle]
        self.util_i = self._prefix(self.col["util_pct"])
        self.power_i = self._prefix(self.col["power_w"])
        self.viol_i = {
            pol: self._prefix([1.0 if reasons & set(rs) else 0.0 for rs in self.throttle])
            for pol, reasons in POLICY_REASONS.items()
        }
        self.energy = self._energy_points([p.energy_j for p in pts])
        self.mig_mode = gpu.mig_mode if gpu.mig_mode is not None else int(bool(gpu.mig))
        self.lost = list(gpu.lost if parent is None else parent.gpu.lost)
        self.gi = gpu.gpu_instance_id if gpu.gpu_instance_id is not None else index + 1
        self.process_memory = gpu.process_memory if gpu.process_memory is not None else parent is None
        self.failing = tuple(gpu.failing)
        self._setup_clocks()
        self.slices = [Device(s, j, self) for j, s in enumerate(gpu.mig)] if parent is None else []
        self._memo_t, self._memo_i = math.nan, 0

    def _setup_clocks(self) -> None:
        gpu, prof = self.gpu, self.profile
        period = gpu.sample_period_s if gpu.sample_period_s is not None else prof.sample_period_s
        self.period_us = max(1, round(period * 1e6))
        self.cap = gpu.buffer_len if gpu.buffer_len is not None else prof.buffer_len
        self.idle = gpu.idle_sampling if gpu.idle_sampling is not None else prof.idle_sampling
        if self.idle not in IDLE_SAMPLING:
            raise ValueError(f"{gpu.uuid}: idle_sampling must be one of {', '.join(IDLE_SAMPLING)}")
        if gpu.process_list not in PROCESS_LISTS:
            raise ValueError(f"{gpu.uuid}: process_list must be one of {', '.join(PROCESS_LISTS)}")
        self.idle_step = max(1, round(prof.idle_period_s * 1e6 / self.period_us))
        update = gpu.energy_update_s if gpu.energy_update_s is not None else prof.energy_update_s
        self.energy_update_us = max(0, round(update * 1e6))
        window = gpu.power_average_s if gpu.power_average_s is not None else prof.power_average_s
        self.power_window_s = window
        phased = prof.phased
        phase = gpu.sample_phase_s
        if phase is None:
            phase = phase_fraction(gpu.uuid, "samples") * self.period_us / 1e6 if phased else 0.0
        self.phase_us = round(phase * 1e6) % self.period_us
        ephase = gpu.energy_phase_s
        if ephase is None:
            ephase = phase_fraction(gpu.uuid, "energy") * self.energy_update_us / 1e6 if phased else 0.0
        self.energy_phase_us = round(ephase * 1e6) % self.energy_update_us if self.energy_update_us else 0
        self.busy_ranges = self._busy_ranges()
        self.busy_starts = [k1 for k1, _ in self.busy_ranges]
        # the sample buffer: parallel lists in buffer (insertion) order
        self.buf_ts: list[int] = []
        self.buf_val: list[int] = []
        self.buf_sorted = True
        self.k_done: int | None = None  # last sampling instant the buffer has been brought up to
        self.buf_epoch = 0

    # -- integrals ------------------------------------------------------------------------------
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
        """Exact integral of a stepped column from the first point to t (negative before it)."""
        i = self.idx(t)
        return prefix[i] + values[i] * (t - self.ts[i])

    # -- energy and power -------------------------------------------------------------------------
    def energy_j(self, t: float) -> float | None:
        """The scripted cumulative energy at t (exact), or None when power was never scripted."""
        t = max(t, self.ts[0])  # the counter does not run backwards before the trace
        power = self.col["power_w"]
        if self.energy is not None:
            i = self.idx(t)
            return self.energy[i] + (power[i] or 0.0) * (t - self.ts[i])
        if self.power_i is None:
            return None
        return self.integral(self.power_i, power, t)

    def energy_update_instant(self, t: float) -> float:
        """The counter's last update at or before t (it moves in steps, not continuously)."""
        if not self.energy_update_us:
            return t
        step, phase = self.energy_update_us, self.energy_phase_us
        u = (phase + ((math.floor(t * 1e6) - phase) // step) * step) / 1e6
        return min(u, t)

    def power_mw(self, t: float, window_s: float) -> int:
        """Board power in mW: at t (window 0), else the mean over the trailing window."""
        power = self.col["power_w"]
        if window_s <= 0:
            return round(power[self.idx(t)] * 1000)
        assert self.power_i is not None
        mean = (self.integral(self.power_i, power, t) - self.integral(self.power_i, power, t - window_s)) / window_s
        return round(mean * 1000)

    def violation_ns(self, policy: int, t: float) -> int:
        prefix = self.viol_i[policy]
        assert prefix is not None
        i = self.idx(t)
        active = 1.0 if POLICY_REASONS[policy] & set(self.throttle[i]) else 0.0
        return int((prefix[i] + active * (max(t, self.ts[0]) - self.ts[i])) * 1e9)

    # -- utilisation samples --------------------------------------------------------------------
    def _busy_ranges(self) -> list[tuple[int, int]]:
        """Sampling instants whose period holds work, as merged (first, last) index ranges.

        Instant k is at trace time (phase + k * period); its sample covers the period before it,
        so it holds work when that period overlaps a span where util_pct > 0.
        """
        util, per, phase = self.col["util_pct"], self.period_us, self.phase_us
        if util[0] is None:
            return []
        ranges: list[tuple[int, int]] = []
        n = len(self.ts)
        for i in range(n):
            if not util[i] > 0:
                continue
            a = self.ts[i] * 1e6 if i > 0 else -math.inf  # the first point holds since for ever
            b = self.ts[i + 1] * 1e6 if i + 1 < n else math.inf
            k1 = _K_NEG if a == -math.inf else math.floor((a - phase) / per) + 1
            k2 = _K_POS if b == math.inf else math.ceil((b + per - phase) / per) - 1
            if ranges and k1 <= ranges[-1][1] + 1:
                ranges[-1] = (ranges[-1][0], max(ranges[-1][1], k2))
            else:
                ranges.append((k1, k2))
        return ranges

    def last_instant(self, t: float) -> int:
        """Index of the last sampling instant at or before trace time t."""
        return (math.floor(t * 1e6) - self.phase_us) // self.period_us

    def _emitted_desc(self, lo_excl: int, hi: int, limit: int) -> list[int]:
        """The instants in (lo_excl, hi] at which the driver takes a sample, newest first, at most limit."""
        if self.idle == "grid":
            return list(range(hi, max(lo_excl, hi - limit), -1))
        out: list[int] = []
        ranges, step = self.busy_ranges, self.idle_step
        j = bisect.bisect_right(self.busy_starts, hi) - 1
        k = hi
        while k > lo_excl and len(out) < limit:
            if j >= 0 and ranges[j][1] >= k:  # inside a stretch of work: every instant
                stop = max(ranges[j][0] - 1, lo_excl, k - (limit - len(out)))
                out.extend(range(k, stop, -1))
                k = stop
                if k == ranges[j][0] - 1:
                    j -= 1
                continue
            before = ranges[j][1] if j >= 0 else None  # last instant with work before this idle stretch
            floor = max(lo_excl, before if before is not None else _K_NEG)
            if self.idle == "slow":  # every idle_step-th instant, counted from the last one with work
                base = before if before is not None else 0
                first = base + ((k - base) // step) * step
                while first > floor and len(out) < limit:
                    out.append(first)
                    first -= step
            k = floor
        return out

    def _values(self, ks: list[int]) -> list[int]:
        """Each sample's value: percent of its period (before it) a kernel ran, rounded."""
        util, prefix, per, phase = self.col["util_pct"], self.util_i, self.period_us, self.phase_us
        assert prefix is not None
        out = []
        grid = self.idle == "grid"
        prev_k, prev_end = None, 0.0  # consecutive samples share a boundary: one integral each
        for k in ks:
            if not grid and not self._is_busy(k):
                out.append(0)  # an idle instant: nothing ran since the previous sample
                continue
            end = (phase + k * per) / 1e6
            start = prev_end if prev_k == k - 1 else self.integral(prefix, util, end - per / 1e6)
            prev_k, prev_end = k, self.integral(prefix, util, end)
            out.append(round((prev_end - start) * 1e6 / per))
        return out

    def _is_busy(self, k: int) -> bool:
        j = bisect.bisect_right(self.busy_starts, k) - 1
        return j >= 0 and self.busy_ranges[j][1] >= k

    def fill_buffer(self, t: float, stamp_us: int, restart: float | None, epoch: int) -> None:
        """Bring the sample buffer up to trace time t.

        ``stamp_us`` maps a sampling instant's trace µs to its wall-clock timestamp; samples taken
        since the previous fill are stamped with the offset read now. ``restart`` is the end of
        the last driver reload: the driver's buffer starts empty then.
        """
        if epoch != self.buf_epoch:
            self.buf_ts.clear()
            self.buf_val.clear()
            self.buf_sorted, self.buf_epoch = True, epoch
            self.k_done = None
        hi = self.last_instant(t)
        lo = self.k_done
        if lo is None:
            lo = _K_NEG if restart is None else self.last_instant(restart)
        if hi <= lo:
            return
        ks = self._emitted_desc(lo, hi, self.cap)
        ks.reverse()
        self.k_done = hi
        if not ks:
            return
        per, phase = self.period_us, self.phase_us
        new_ts = [stamp_us + phase + k * per for k in ks]
        if self.buf_ts and new_ts[0] < self.buf_ts[-1]:
            self.buf_sorted = False
        self.buf_ts.extend(new_ts)
        self.buf_val.extend(self._values(ks))
        excess = len(self.buf_ts) - self.cap
        if excess > 0:  # the buffer is a ring: the oldest samples are overwritten
            del self.buf_ts[:excess], self.buf_val[:excess]
            if not self.buf_sorted:
                self.buf_sorted = all(a <= b for a, b in zip(self.buf_ts, self.buf_ts[1:], strict=False))

    def samples_after(self, last_ts: int) -> list[tuple[int, int]]:
        """Buffered (timestamp, value) pairs with timestamp > last_ts, in buffer order."""
        if self.buf_sorted:
            i = bisect.bisect_right(self.buf_ts, last_ts)
            return list(zip(self.buf_ts[i:], self.buf_val[i:], strict=True))
        return [(ts, v) for ts, v in zip(self.buf_ts, self.buf_val, strict=True) if ts > last_ts]

    def rate(self, t: float) -> int:
        """Percent of the last complete sample period a kernel ran (nvmlDeviceGetUtilizationRates)."""
        util, prefix, per = self.col["util_pct"], self.util_i, self.period_us
        assert prefix is not None
        end = (self.phase_us + self.last_instant(t) * per) / 1e6
        busy = self.integral(prefix, util, end) - self.integral(prefix, util, end - per / 1e6)
        return round(busy * 1e6 / per)
