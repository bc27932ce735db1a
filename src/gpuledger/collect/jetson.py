"""GPU collector for NVIDIA Jetson modules, which have no usable NVML: sysfs and the INA3221 monitor.

What each figure is (docs/JETSON.md says the same for users; jetson_sysfs says where the files are):

* busy time: the GPU ``load`` (per-mille busy share, sampled by the GPU's PMU) read at the end of
  each tick, x the tick length (``util_method="instant"``, as the NVML collector's fallback).
* energy: trapezoidal integration of the power on the INA3221 rail that feeds the GPU
  (``energy_method="power"``). That rail is often shared: on AGX Orin ``VDD_GPU_SOC`` also feeds
  the SoC (memory controller, video engines), on Orin NX/Nano ``VDD_CPU_GPU_CV`` also the CPU and
  the CV engines. Without such a rail energy is absent: the board input rail is never counted as
  GPU energy.
* clock: devfreq ``cur_freq``; temperature: the GPU thermal zone.
* absent: GPU memory (Jetson memory is unified with the host's: host metrics hold it), per-process
  figures, throttle reasons.

The board has one integrated GPU. Its identity: the device-tree ``model`` as the name and a uuid
derived from the module's serial number (else /etc/machine-id), ``source="jetson"``.

Jetson Thor (``nvidia,tegra264``, JetPack 7) is not read here: its GPU runs on NVIDIA's own driver,
which NVML reports (``nvidia-smi`` works there), so the NVML collector is the one for it. This
collector refuses a Thor board even when a GPU ``load`` file is found, and the reason it gives says
NVML is what is needed.
"""

from __future__ import annotations

import os
import uuid as uuidlib
from dataclasses import dataclass
from pathlib import Path

from gpuledger.collect import jetson_sysfs as fs
from gpuledger.collect.base import CollectorUnavailable, GpuRead
from gpuledger.collect.visible import Candidate, resolve_visible
from gpuledger.core.metering.integrate import trapezoid_energy_j
from gpuledger.core.model import ENERGY_POWER, UTIL_INSTANT, Event, GpuIdentity, GpuTick

# Fixed so the same board always gets the same uuid, on every install of gpuledger.
_UUID_NAMESPACE = uuidlib.UUID("0f3c5a52-4d1e-5b7e-9a7e-6a65747c6f6e")
_LOAD_FULL = 1000  # the load file is per-mille


@dataclass
class _Reading:
    """One sample of every file, each None when it could not be read."""

    t: float
    load_permille: int | None = None
    freq_hz: int | None = None
    temp_mc: int | None = None
    power_w: float | None = None


class JetsonCollector:
    """GpuCollector over a Jetson module's sysfs (see the module docstring for what it measures)."""

    def __init__(self, visible: str | None = None, sysfs_root: str | os.PathLike[str] = "/") -> None:
        soc = fs.tegra_soc(sysfs_root)
        if fs.gpu_via_nvml(soc):
            raise CollectorUnavailable(no_jetson_gpu_reason(sysfs_root) or "Jetson Thor: its GPU is read through NVML")
        gpu = fs.find_gpu(sysfs_root) if soc else None
        if gpu is None:
            raise CollectorUnavailable(no_jetson_gpu_reason(sysfs_root) or "not an NVIDIA Jetson")
        self._gpu = gpu
        self._temp = fs.find_gpu_temperature(sysfs_root)
        rails = fs.find_rails(sysfs_root)
        self._rail = fs.pick_gpu_rail(rails)
        self._board_rail = fs.pick_board_rail(rails)
        self._pending: list[str] = [] if self._rail is not None else [_no_rail_message(rails, self._board_rail)]
        ident = _identity(sysfs_root, gpu)
        self._idents = [ident] if _visible(visible, ident.uuid) else []
        self._last: _Reading | None = None
        self._reported: set[tuple[str, str]] = set()

    @property
    def power_rails(self) -> dict[str, str | None]:
        """The INA3221 rail labels in use: ``gpu`` (energy comes from it) and ``board`` (module input)."""
        return {
            "gpu": None if self._rail is None else self._rail.label,
            "board": None if self._board_rail is None else self._board_rail.label,
        }

    def devices(self) -> list[GpuIdentity]:
        return list(self._idents)

    def read(self, pids: set[int], now: float, closes_interval: bool = True, final: bool = False) -> GpuRead:
        out = GpuRead()
        if not self._idents:
            return out
        for message in self._pending:
            out.events.append(Event(t=now, kind="sampler_error", message=message, payload={"error": "NoGpuRail"}))
        self._pending = []
        cur = self._sample(now, out)
        last, self._last = self._last, cur
        if last is not None and now > last.t:  # the first read primes the power integration
            out.ticks.append(self._tick(last, cur))
        return out

    def close(self) -> None:
        pass

    def _sample(self, now: float, out: GpuRead) -> _Reading:
        cur = _Reading(t=now)
        load = self._read(self._gpu.load, now, out)
        if load is not None and not 0 <= load <= _LOAD_FULL:
            self._report(out, now, str(self._gpu.load), ValueError(f"load {load} outside 0-{_LOAD_FULL}"))
            load = None
        cur.load_permille = load
        if self._gpu.cur_freq is not None:
            cur.freq_hz = self._read(self._gpu.cur_freq, now, out)
        if self._temp is not None:
            cur.temp_mc = self._read(self._temp, now, out)
        if self._rail is not None:
            cur.power_w = self._read_rail(self._rail, now, out)
        return cur

    def _tick(self, last: _Reading, cur: _Reading) -> GpuTick:
        dt = cur.t - last.t
        tick = GpuTick(uuid=self._idents[0].uuid, t0=last.t, t1=cur.t, power_w=cur.power_w)
        if cur.load_permille is not None:
            tick.busy_s = cur.load_permille / _LOAD_FULL * dt
            tick.util_max_pct, tick.util_method = cur.load_permille / 10, UTIL_INSTANT
        if last.power_w is not None and cur.power_w is not None:
            tick.energy_j = trapezoid_energy_j(last.t, last.power_w, cur.t, cur.power_w)
            tick.energy_method = ENERGY_POWER
        if cur.freq_hz is not None:
            tick.sm_clock_mhz = cur.freq_hz / 1e6
        if cur.temp_mc is not None:
            tick.temp_c = cur.temp_mc / 1e3
        return tick

    def _read(self, path: Path, now: float, out: GpuRead) -> int | None:
        try:
            return fs.read_int(path)
        except (OSError, ValueError) as exc:  # absent this tick; the other figures stand
            self._report(out, now, str(path), exc)
            return None

    def _read_rail(self, rail: fs.Rail, now: float, out: GpuRead) -> float | None:
        try:
            return rail.watts()
        except (OSError, ValueError) as exc:
            self._report(out, now, f"rail {rail.label}", exc)
            return None

    def _report(self, out: GpuRead, now: float, where: str, exc: BaseException) -> None:
        # One event per file and kind of failure: a file that stays unreadable is said once.
        key = (where, type(exc).__name__)
        if key in self._reported:
            return
        self._reported.add(key)
        msg = f"jetson: {where}: {type(exc).__name__}: {exc}"
        out.events.append(Event(t=now, kind="sampler_error", message=msg, payload={"error": type(exc).__name__}))


def no_jetson_gpu_reason(sysfs_root: str | os.PathLike[str] = "/") -> str | None:
    """Why a Jetson board has no usable GPU here, or None when this is no Jetson (or all is well)."""
    soc = fs.tegra_soc(sysfs_root)
    if soc is None:
        return None
    model = fs.board_property(sysfs_root, "model") or soc
    if fs.gpu_via_nvml(soc):
        return f"NVIDIA Jetson ({model}) reports its GPU through NVML only (JetPack 7): NVML is needed"
    if fs.find_gpu(sysfs_root) is not None:
        return None
    where = fs.under(sysfs_root, "sys/class/devfreq")
    return f"NVIDIA Jetson ({model}) without a GPU load file under {where} (GPU driver not loaded?)"


def _identity(root: str | os.PathLike[str], gpu: fs.GpuNodes) -> GpuIdentity:
    model = fs.board_property(root, "model") or "NVIDIA Jetson"
    serial = fs.board_property(root, "serial-number")
    if serial:
        key = f"serial:{serial}"
    else:
        machine = fs.read_dt_string(fs.under(root, "etc/machine-id"))  # a text file: same reading
        # Without either, the uuid is only as unique as the model: said in docs/JETSON.md.
        key = f"machine-id:{machine}" if machine else f"model:{model}:{gpu.device_name}"
    return GpuIdentity(index=0, uuid=f"JETSON-{uuidlib.uuid5(_UUID_NAMESPACE, key)}", name=model, source="jetson")


def _visible(visible: str | None, uuid: str) -> bool:
    """Whether CUDA_VISIBLE_DEVICES leaves the command the board's one GPU (CUDA's rules, visible.py).

    CUDA's own UUID for the GPU is unknown here (it differs from ours), so a ``GPU-...`` first entry
    is taken to name the only GPU there is.
    """
    if visible is not None and visible.strip().lower().startswith("gpu-"):
        return True
    return bool(resolve_visible(visible, [Candidate(uuid)]))


def _no_rail_message(rails: list[fs.Rail], board: fs.Rail | None) -> str:
    if not rails:
        return "jetson: no INA3221 power monitor found (hwmon or iio): GPU energy is absent"
    labels = ", ".join(r.label for r in rails)
    tail = f"; the board input rail {board.label} is not GPU energy" if board is not None else ""
    return f"jetson: no power-monitor rail with GPU in its label (found {labels}): GPU energy is absent{tail}"
