"""Seconds a GPU spent throttled, per reason, from NVML.

Exact where the GPU has cumulative violation counters (nanoseconds per perf policy): read as field
values (``NVML_FI_DEV_PERF_POLICY_*``, one call for all six) with the deprecated
``nvmlDeviceGetViolationStatus`` as the fallback. Being cumulative, they need reading only where
the recorder ends an interval (``closes``): each interval then gets exactly the time its own span
accumulated, whatever happened between its ticks, for one query per interval rather than one per
tick; the ticks in between report None (not read), and a reading that fails leaves its time to the
next one. GPUs without counters: the clock-event reason bits read at the end of every tick, the
whole tick attributed to each active reason (an approximation).
"""

from __future__ import annotations

from typing import Any

from gpuledger.collect.nvml_query import DeviceQueries, Querier
from gpuledger.core.metering.integrate import counter_delta

# reason key -> (NVML_PERF_POLICY_* constant name, NVML_FI_DEV_PERF_POLICY_* field constant name)
POLICIES = (
    ("power", "NVML_PERF_POLICY_POWER", "NVML_FI_DEV_PERF_POLICY_POWER"),
    ("thermal", "NVML_PERF_POLICY_THERMAL", "NVML_FI_DEV_PERF_POLICY_THERMAL"),
    ("sync_boost", "NVML_PERF_POLICY_SYNC_BOOST", "NVML_FI_DEV_PERF_POLICY_SYNC_BOOST"),
    ("board_limit", "NVML_PERF_POLICY_BOARD_LIMIT", "NVML_FI_DEV_PERF_POLICY_BOARD_LIMIT"),
    ("low_util", "NVML_PERF_POLICY_LOW_UTILIZATION", "NVML_FI_DEV_PERF_POLICY_LOW_UTILIZATION"),
    ("reliability", "NVML_PERF_POLICY_RELIABILITY", "NVML_FI_DEV_PERF_POLICY_RELIABILITY"),
)
# Clock-event reason bits (nvml.h nvmlClocksEventReason*, stable ABI) -> the same keys.
REASON_BITS = {
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
_BIT_NAMES = tuple(dict.fromkeys(REASON_BITS.values()))


class ThrottleState:
    """Per-device counters between reads."""

    __slots__ = ("fi_scale", "names", "viol_ns", "zeros")

    def __init__(self) -> None:
        self.viol_ns: dict[str, int] = {}
        self.names: tuple[str, ...] = ()  # reasons whose counters answer
        self.zeros: dict[str, float] = {}  # every name at 0 s (copied for each reading)
        self.fi_scale = 1  # field values -> ns (calibrated against the classic call at the start)


class ThrottleReader:
    def __init__(self, nv: Any, q: Querier) -> None:
        self._q = q
        self._policies = tuple(
            (name, getattr(nv, pol), getattr(nv, fi, None)) for name, pol, fi in POLICIES if hasattr(nv, pol)
        )
        self._field_names = {fi: name for name, _, fi in self._policies if fi is not None}
        self._field_ids = tuple(self._field_names)
        self._classic = tuple((name, pol, "viol_" + name) for name, pol, _ in self._policies)
        self._f_fields = getattr(nv, "nvmlDeviceGetFieldValues", None)
        self._f_viol = getattr(nv, "nvmlDeviceGetViolationStatus", None)
        self._f_reasons = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
        self._f_reasons_old = getattr(nv, "nvmlDeviceGetCurrentClocksThrottleReasons", None)

    def prime(self, d: DeviceQueries, handle: Any, st: ThrottleState) -> None:
        st.fi_scale = self._calibrate(d, handle)
        st.viol_ns = self._counters(d, handle, st.fi_scale)
        st.names = tuple(name for name, _, _ in self._policies if name in st.viol_ns)
        st.zeros = dict.fromkeys(st.names, 0.0)

    def read(
        self, d: DeviceQueries, handle: Any, st: ThrottleState, dt: float, closes: bool = True
    ) -> dict[str, float] | None:
        """Seconds throttled per reason: with counters, since their previous reading, read only when
        ``closes`` (None otherwise: the time is in the next reading); else the reason bits x ``dt``."""
        if st.names:
            return self._violations(d, handle, st) if closes else None
        bits = self._bits(d, handle)
        if bits is None:
            return None
        out = dict.fromkeys(_BIT_NAMES, 0.0)
        for bit, name in REASON_BITS.items():
            if bits & bit:
                out[name] = dt  # "thermal" has two bits: still one tick, not two
        return out

    def _bits(self, d: DeviceQueries, handle: Any) -> int | None:
        bits = self._q.call(d, "reasons", self._f_reasons, handle)
        if bits is None:
            bits = self._q.call(d, "reasons_old", self._f_reasons_old, handle)
        return None if bits is None else int(bits)

    def _calibrate(self, d: DeviceQueries, handle: Any) -> int:
        """The unit of the perf-policy fields, from one reading of both kinds at the start.

        The deprecated call documents nanoseconds; the field values' unit is not documented.
        Deltas are only right if both agree, so the first policy both answer decides: a ratio
        near 1000 means the fields count microseconds. Without both, nanoseconds are assumed.
        """
        for (_, pol, fi), (_, _, key) in zip(self._policies, self._classic, strict=True):
            if fi is None:
                continue
            got = self._q.fields(d, self._f_fields, handle, (fi,)).get(fi)
            if not got:
                continue  # no field, or nothing counted yet: nothing to compare
            classic = self._q.call(d, key, self._f_viol, handle, pol)
            if classic is not None and int(classic.violationTime) > 0:
                ratio = int(classic.violationTime) / int(got)
                return 1000 if 300 < ratio < 3000 else 1
        return 1

    def _counters(self, d: DeviceQueries, handle: Any, scale: int = 1) -> dict[str, int]:
        """Cumulative violation ns per reason: field values first, the deprecated call for the rest."""
        names = self._field_names
        got = self._q.fields(d, self._f_fields, handle, self._field_ids) if names else {}
        out = {names[fi]: int(v) * scale for fi, v in got.items() if fi in names}
        if len(out) < len(self._classic):
            for name, pol, key in self._classic:
                if name not in out:
                    v = self._q.call(d, key, self._f_viol, handle, pol)
                    if v is not None:
                        out[name] = int(v.violationTime)
        return out

    def _violations(self, d: DeviceQueries, handle: Any, st: ThrottleState) -> dict[str, float] | None:
        """Seconds per reason since the previous reading; None when no counter answered (the next
        reading covers this span: a counter not read moves no cursor)."""
        out = st.zeros.copy()
        now = self._counters(d, handle, st.fi_scale)
        for name in st.names:
            ns = now.get(name)
            if ns is None:
                out.pop(name)  # unknown this tick; the next reading covers it
                continue
            delta = counter_delta(st.viol_ns.get(name), ns)
            st.viol_ns[name] = ns
            if delta is None:
                out.pop(name)
            else:
                out[name] = delta / 1e9
        return out or None
