"""Where a Jetson module keeps its GPU and power-monitor figures in sysfs, found rather than assumed.

Every path is joined under a root (``/`` on a board, a crafted tree in tests). Nothing here needs
root: the files read are world-readable on Jetson Linux. The facts relied on, and their sources
(docs/JETSON.md says the same for users):

* **Is this a Jetson?** The device-tree root node's ``compatible`` list names the SoC
  (``nvidia,tegra210`` Nano/TX1, ``nvidia,tegra186`` TX2, ``nvidia,tegra194`` Xavier,
  ``nvidia,tegra234`` Orin); ``model`` names the board, ``serial-number`` its serial (Devicetree
  Specification, root node properties). Strings there end in NUL.
* **GPU load and clock.** The integrated GPU registers a devfreq device (kernel
  Documentation/ABI/testing/sysfs-class-devfreq: ``/sys/class/devfreq/<dev>/cur_freq``, in Hz, the
  devfreq unit). Its name differs by generation: ``57000000.gpu`` (Nano), ``17000000.gp10b`` (TX2),
  ``17000000.gv11b`` (Xavier), ``17000000.ga10b`` (Orin, L4T 35) or ``17000000.gpu`` (Orin, L4T 36).
  The GPU driver (nvgpu) puts a world-readable ``load`` file on the GPU device itself, reached from
  devfreq through the ``device`` link: the PMU's busy share, in per-mille (0-1000), 0 while the GPU
  is power-gated. Older releases also link the GPU device as ``/sys/devices/gpu.0``.
* **Power.** The INA3221 monitor, through hwmon on L4T 34 and later (kernel
  Documentation/hwmon/ina3221.rst: ``in[123]_label`` rail name, ``in[123]_input`` bus voltage in mV,
  ``curr[123]_input`` current in mA; power = V x I per rail), and through NVIDIA's ``ina3221x`` iio
  driver on L4T 32 (``rail_name_[012]``, ``in_power[012]_input`` in mW).
* **Temperature.** The thermal zone whose ``type`` starts with ``gpu`` (``GPU-therm``,
  ``gpu-thermal``); ``temp`` is in millidegrees Celsius (Documentation/ABI/testing/sysfs-class-thermal).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

# Device names of the integrated GPU across generations: "...gpu" / "gpu.0", or the nvgpu chip
# name (gk20a, gm20b, gp10b, gv11b, ga10b, gb10b).
_GPU_DEVICE = re.compile(r"gpu|g[kmpvab]\d{2}[ab]\b", re.IGNORECASE)
# Where older releases link the GPU device when its devfreq entry does not lead to a load file.
_LEGACY_GPU_DEVICES = ("sys/devices/gpu.0", "sys/devices/platform/gpu.0")
_INA3221_CHANNELS = (1, 2, 3)  # hwmon numbers channels from 1
_INA3221X_CHANNELS = (0, 1, 2)  # the L4T 32 iio driver from 0
# Labels of the module's input rail: VDD_IN (Orin NX/Nano, Xavier NX, TX2), POM_5V_IN (Nano),
# VIN_SYS_5V0 (AGX Orin: the 5 V system input).
_BOARD_INPUT_TOKENS = frozenset({"IN", "VIN"})


def under(root: str | os.PathLike[str], relative: str) -> Path:
    """``relative`` (a path as on the board, without the leading slash) under ``root``."""
    return Path(root, relative)


def read_text(path: Path) -> str:
    """A sysfs attribute as text; raises OSError when it cannot be read."""
    with open(path, "rb") as f:
        return f.read().decode("utf-8", errors="replace").strip()


def read_int(path: Path) -> int:
    """A sysfs attribute holding one integer (hwmon, devfreq and thermal all write integers).

    Raises OSError when unreadable and ValueError when the text is not an integer.
    """
    text = read_text(path)
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{path.name}: not an integer: {text[:40]!r}") from None


def read_dt_string(path: Path) -> str | None:
    """The first string of a device-tree property (NUL-terminated), or None when unreadable."""
    try:
        raw = path.read_bytes()
    except OSError:
        return None
    text = raw.split(b"\0", 1)[0].decode("utf-8", errors="replace").strip()
    return text or None


def tegra_soc(root: str | os.PathLike[str]) -> str | None:
    """The ``nvidia,tegra...`` entry of the device-tree ``compatible`` list, or None off Jetson."""
    for rel in ("proc/device-tree/compatible", "sys/firmware/devicetree/base/compatible"):
        try:
            raw = under(root, rel).read_bytes()
        except OSError:
            continue
        for entry in raw.split(b"\0"):
            text = entry.decode("utf-8", errors="replace").strip()
            if text.startswith("nvidia,tegra"):
                return text
    return None


# SoCs whose GPU the NVIDIA driver (not nvgpu) runs and NVML reports: Jetson Thor (T264, JetPack 7).
NVML_SOCS = ("nvidia,tegra264",)


def gpu_via_nvml(soc: str | None) -> bool:
    """Whether the board's GPU is read through NVML rather than sysfs (Jetson Thor)."""
    return soc in NVML_SOCS


def board_property(root: str | os.PathLike[str], name: str) -> str | None:
    """A device-tree root property such as ``model`` or ``serial-number``."""
    for rel in (f"proc/device-tree/{name}", f"sys/firmware/devicetree/base/{name}"):
        value = read_dt_string(under(root, rel))
        if value:
            return value
    return None


@dataclass(frozen=True)
class GpuNodes:
    """The integrated GPU's files: ``load`` always, ``cur_freq`` when a devfreq entry was found."""

    device_name: str  # e.g. "17000000.ga10b"
    load: Path
    cur_freq: Path | None


def find_gpu(root: str | os.PathLike[str]) -> GpuNodes | None:
    """The integrated GPU's devfreq entry and load file, or None when there is none."""
    devfreq = under(root, "sys/class/devfreq")
    entries = sorted(_listdir(devfreq))
    for name in entries:
        if _GPU_DEVICE.search(name) and _is_file(devfreq / name / "device" / "load"):
            return GpuNodes(name, devfreq / name / "device" / "load", devfreq / name / "cur_freq")
    for rel in _LEGACY_GPU_DEVICES:
        load = under(root, rel) / "load"
        if _is_file(load):
            named = next((n for n in entries if _GPU_DEVICE.search(n)), None)
            return GpuNodes(named or Path(rel).name, load, None if named is None else devfreq / named / "cur_freq")
    return None


def find_gpu_temperature(root: str | os.PathLike[str]) -> Path | None:
    """The ``temp`` file of the GPU's thermal zone, or None."""
    zones = under(root, "sys/class/thermal")
    for name in sorted(_listdir(zones)):
        if not name.startswith("thermal_zone"):
            continue
        try:
            kind = read_text(zones / name / "type")
        except OSError:
            continue
        if kind.lower().startswith("gpu"):
            return zones / name / "temp"
    return None


@dataclass(frozen=True)
class Rail:
    """One INA3221 channel: hwmon gives volts and amps, the L4T 32 iio driver gives milliwatts."""

    label: str
    millivolts: Path | None = None
    milliamps: Path | None = None
    milliwatts: Path | None = None

    def watts(self) -> float:
        """Power now. Raises OSError / ValueError when a file cannot be read or parsed.

        Negative readings (shunt offset at near-zero current) count as 0: a supply rail does not
        give energy back.
        """
        if self.milliwatts is not None:
            power = read_int(self.milliwatts) / 1e3
        else:
            assert self.millivolts is not None and self.milliamps is not None
            power = read_int(self.millivolts) * read_int(self.milliamps) / 1e6
        return max(power, 0.0)


def find_rails(root: str | os.PathLike[str]) -> list[Rail]:
    """Every labelled INA3221 channel: hwmon first, else the L4T 32 iio driver."""
    rails = _hwmon_rails(under(root, "sys/class/hwmon"))
    return rails or _iio_rails(under(root, "sys/bus/iio/devices"))


def _hwmon_rails(hwmon: Path) -> list[Rail]:
    rails = []
    for name in sorted(_listdir(hwmon)):
        chip = hwmon / name
        try:
            if read_text(chip / "name") != "ina3221":
                continue
        except OSError:
            continue
        for ch in _INA3221_CHANNELS:
            label = _label(chip / f"in{ch}_label")
            if label is not None:
                rails.append(Rail(label, millivolts=chip / f"in{ch}_input", milliamps=chip / f"curr{ch}_input"))
    return rails


def _iio_rails(iio: Path) -> list[Rail]:
    rails = []
    for name in sorted(_listdir(iio)):
        for ch in _INA3221X_CHANNELS:
            label = _label(iio / name / f"rail_name_{ch}")
            if label is not None:
                rails.append(Rail(label, milliwatts=iio / name / f"in_power{ch}_input"))
    return rails


def _label(path: Path) -> str | None:
    try:
        return read_text(path) or None
    except OSError:
        return None


def _tokens(label: str) -> list[str]:
    return [t for t in re.split(r"[^A-Z0-9]+", label.upper()) if t]


def pick_gpu_rail(rails: list[Rail]) -> Rail | None:
    """The rail that feeds the GPU: a label with a ``GPU`` word, the fewest other words first.

    So a GPU-only rail (AGX Xavier ``GPU``, Nano ``POM_5V_GPU``) wins over a shared one
    (AGX Orin ``VDD_GPU_SOC``: GPU and SoC; Orin NX/Nano ``VDD_CPU_GPU_CV``: CPU, GPU and the
    CV engines).
    """
    gpu = [r for r in rails if "GPU" in _tokens(r.label)]
    return min(gpu, key=lambda r: len(_tokens(r.label)), default=None)


def pick_board_rail(rails: list[Rail]) -> Rail | None:
    """The module's input rail (``VDD_IN``, ``POM_5V_IN``, ``VIN_SYS_5V0``), when monitored."""
    return next((r for r in rails if _BOARD_INPUT_TOKENS & set(_tokens(r.label))), None)


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except OSError:  # a folder we may not search (EACCES) hides nothing we could read anyway
        return False


def _listdir(path: Path) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []
