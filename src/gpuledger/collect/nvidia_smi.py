"""Fallback GPU collector for machines where NVML cannot be loaded from Python but
``nvidia-smi`` runs (e.g. a container with the binary but not the library on its path).

Coarser than NVML, and said so per tick: busy time is the instantaneous ``utilization.gpu`` ×
tick length (``util_method="instant"``), energy is trapezoidal integration of ``power.draw``
(``energy_method="power"``) — nvidia-smi has no cumulative energy field we rely on — and
throttling is the tick length attributed to each reason in ``clocks_event_reasons.active``
(``clocks_throttle_reasons.active`` on older drivers). One ``nvidia-smi`` process per tick
(two when the run has processes: ``--query-compute-apps`` for their GPU memory), each with a
timeout. MIG slices are not resolved here: a MIG UUID in CUDA_VISIBLE_DEVICES stops the list.
"""

from __future__ import annotations

import csv
import subprocess
from collections.abc import Callable, Sequence
from typing import Any

from gpuledger.collect.base import CollectorUnavailable, GpuRead
from gpuledger.collect.nvml_throttle import REASON_BITS as THROTTLE_BITS
from gpuledger.collect.visible import resolve_visible
from gpuledger.core.metering.integrate import trapezoid_energy_j
from gpuledger.core.model import ENERGY_POWER, UTIL_INSTANT, Event, GpuIdentity, GpuTick

BASE_FIELDS = (
    "index", "uuid", "name", "pci.bus_id", "driver_version", "memory.total", "memory.used",
    "power.draw", "power.limit", "temperature.gpu", "clocks.sm", "clocks.mem", "utilization.gpu",
)  # fmt: skip
# Tried in order: the newest spelling first; a driver that does not know a field fails the
# whole query, so each set is a fallback for older drivers.
FIELD_SETS = (
    (*BASE_FIELDS, "mig.mode.current", "clocks_event_reasons.active"),
    (*BASE_FIELDS, "mig.mode.current", "clocks_throttle_reasons.active"),
    BASE_FIELDS,
)
APPS_FIELDS = ("gpu_uuid", "pid", "used_memory")
_MIB = 1024 * 1024
_NUMERIC = {
    "index", "memory.total", "memory.used", "power.draw", "power.limit", "temperature.gpu",
    "clocks.sm", "clocks.mem", "utilization.gpu", "pid", "used_memory",
}  # fmt: skip
_BIT_NAMES = tuple(dict.fromkeys(THROTTLE_BITS.values()))

Runner = Callable[[Sequence[str], float], str]  # (argv, timeout_s) -> stdout; raises on failure


def run_command(argv: Sequence[str], timeout_s: float) -> str:
    """Run nvidia-smi; a non-zero exit or a timeout raises with its message."""
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s, check=False)
    if done.returncode != 0:
        msg = (done.stdout.strip() or done.stderr.strip() or f"exit status {done.returncode}").splitlines()[0]
        raise RuntimeError(msg)
    return done.stdout


def parse_value(field: str, raw: str) -> str | float | None:
    """One CSV cell: ``[N/A]``, ``[Not Supported]``, ``[Unknown Error]`` ... become None."""
    raw = raw.strip()
    if not raw or raw.startswith("[") or raw in ("N/A", "Not Supported"):
        return None
    if field in _NUMERIC:
        try:
            return float(raw)
        except ValueError:
            return None
    return raw


def parse_csv(text: str, fields: Sequence[str]) -> list[dict[str, Any]]:
    """Rows of ``--format=csv,noheader,nounits`` output, as {field: value}; short rows are dropped."""
    rows = []
    for cells in csv.reader(text.splitlines(), skipinitialspace=True):
        if len(cells) == len(fields):
            rows.append({f: parse_value(f, c) for f, c in zip(fields, cells, strict=True)})
    return rows


def _mib(v: Any) -> int | None:
    return None if v is None else int(v * _MIB)


class NvidiaSmiCollector:
    """GpuCollector over the ``nvidia-smi`` command line."""

    def __init__(
        self,
        visible: str | None = None,
        run: Runner = run_command,
        timeout_s: float = 2.0,
        binary: str = "nvidia-smi",
    ) -> None:
        self._run, self._timeout, self._bin = run, timeout_s, binary
        self._fields: tuple[str, ...] = ()
        rows: list[dict[str, Any]] = []
        errors = []
        for fields in FIELD_SETS:
            try:
                rows = self._query(fields)
            except Exception as exc:
                errors.append(str(exc))
                continue
            self._fields = fields
            break
        if not self._fields:
            raise CollectorUnavailable(f"nvidia-smi failed: {errors[-1] if errors else 'no output'}")
        rows.sort(key=lambda r: r["index"] if r["index"] is not None else 0)
        uuids = [r["uuid"] for r in rows]
        self._idents = []
        for index, v in enumerate(resolve_visible(visible, uuids)):
            r = rows[v.nvml_index]
            ident = GpuIdentity(
                index=index, uuid=v.uuid, name=r["name"] or "", pci_bus_id=r["pci.bus_id"],
                memory_total_b=_mib(r["memory.total"]), power_limit_w=r["power.limit"],
                driver_version=r["driver_version"], mig_mode=_mig(r.get("mig.mode.current")),
                nvml_index=v.nvml_index, source="nvidia-smi",
            )  # fmt: skip
            self._idents.append(ident)
        self._reasons = next((f for f in self._fields if f.endswith("reasons.active")), None)
        self._last: dict[str, tuple[float, float | None]] = {}  # uuid: (t, power_w)
        self._reported: set[str] = set()

    def _query(self, fields: Sequence[str]) -> list[dict[str, Any]]:
        argv = [self._bin, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"]
        return parse_csv(self._run(argv, self._timeout), fields)

    def devices(self) -> list[GpuIdentity]:
        return list(self._idents)

    def read(self, pids: set[int], now: float, closes_interval: bool = True, final: bool = False) -> GpuRead:
        out = GpuRead()
        try:
            rows = {r["uuid"]: r for r in self._query(self._fields)}
        except Exception as exc:  # a failed or hung nvidia-smi costs this tick only
            self._report(out, now, exc)
            return out
        mem = None
        if pids:
            try:
                mem = self._proc_mem(pids)
            except Exception as exc:  # per-process memory absent this tick; the rest stands
                self._report(out, now, exc)
        for ident in self._idents:
            r = rows.get(ident.uuid)
            if r is None:
                continue
            tick = self._tick(ident.uuid, r, now)
            if tick is not None:
                tick.proc_mem_b = None if mem is None else mem.get(ident.uuid, 0)
                out.ticks.append(tick)
        return out

    def _tick(self, uuid: str, r: dict[str, Any], now: float) -> GpuTick | None:
        power = r["power.draw"]
        last = self._last.get(uuid)
        self._last[uuid] = (now, power)
        if last is None or now <= last[0]:
            return None  # the first reading primes the power integration
        t0, p0 = last
        dt = now - t0
        util = r["utilization.gpu"]
        tick = GpuTick(
            uuid=uuid, t0=t0, t1=now, power_w=power, mem_used_b=_mib(r["memory.used"]),
            temp_c=r["temperature.gpu"], sm_clock_mhz=r["clocks.sm"], mem_clock_mhz=r["clocks.mem"],
        )  # fmt: skip
        if util is not None:
            tick.busy_s, tick.util_max_pct, tick.util_method = util / 100 * dt, util, UTIL_INSTANT
        if power is not None and p0 is not None:
            tick.energy_j, tick.energy_method = trapezoid_energy_j(t0, p0, now, power), ENERGY_POWER
        tick.throttle_s = _throttle(r.get(self._reasons) if self._reasons else None, dt)
        return tick

    def _proc_mem(self, pids: set[int]) -> dict[str, int]:
        argv = [self._bin, f"--query-compute-apps={','.join(APPS_FIELDS)}", "--format=csv,noheader,nounits"]
        mem: dict[str, int] = {}
        for row in parse_csv(self._run(argv, self._timeout), APPS_FIELDS):
            if row["pid"] is not None and int(row["pid"]) in pids and row["used_memory"] is not None:
                mem[row["gpu_uuid"]] = mem.get(row["gpu_uuid"], 0) + int(row["used_memory"] * _MIB)
        return mem

    def _report(self, out: GpuRead, now: float, exc: BaseException) -> None:
        msg = f"nvidia-smi: {type(exc).__name__}: {exc}"
        if msg not in self._reported:
            self._reported.add(msg)
            out.events.append(Event(t=now, kind="sampler_error", message=msg, payload={"error": type(exc).__name__}))

    def close(self) -> None:
        pass


def _mig(v: Any) -> str | None:
    return None if v is None else str(v).lower()


def _throttle(mask: Any, dt: float) -> dict[str, float] | None:
    if mask is None:
        return None
    try:
        bits = int(str(mask), 16)  # "0x0000000000000004"
    except ValueError:
        return None
    out = dict.fromkeys(_BIT_NAMES, 0.0)
    for bit, name in THROTTLE_BITS.items():
        if bits & bit:
            out[name] = dt
    return out
