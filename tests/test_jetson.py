"""The Jetson collector on crafted sysfs trees laid out as Jetson Linux lays them out.

The trees follow the documents the collector is written from, not the collector: the devfreq class
(Documentation/ABI/testing/sysfs-class-devfreq: ``/sys/class/devfreq/<dev>`` links to the devfreq
device, whose ``device`` link leads to the GPU, where NVIDIA's GPU driver keeps ``load``, per-mille),
hwmon's ina3221 (Documentation/hwmon/ina3221.rst: ``in<n>_label``, ``in<n>_input`` mV,
``curr<n>_input`` mA), the L4T 32 ``ina3221x`` iio device (``rail_name_<n>``, ``in_power<n>_input``
mW), the thermal class (``type``, ``temp`` in millidegrees C) and the device tree (``compatible``,
``model``, ``serial-number``: NUL-terminated strings). Links are relative, as in sysfs.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuledger.collect.base import CollectorUnavailable
from gpuledger.collect.fake_nvml import FakeGpu, FakeNvml
from gpuledger.collect.gpus import NO_GPU_TAIL, open_gpu_collector
from gpuledger.collect.jetson import JetsonCollector
from gpuledger.core.model import ENERGY_POWER, UTIL_INSTANT, GpuInterval

T0 = 1_700_000_000.0
ORIN_RAILS = {"1-0040": ["VDD_GPU_SOC", "VDD_CPU_CV", "VIN_SYS_5V0"], "1-0041": [None, "VDDQ_VDD2_1V8AO", None]}
ORIN_NANO_RAILS = {"1-0040": ["VDD_IN", "VDD_CPU_GPU_CV", "VDD_SOC"]}


class Clock:
    def __init__(self, t: float = T0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def write(path: Path, text: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


def link(at: Path, target: str) -> None:
    at.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(target, at)


class OrinTree:
    """An AGX Orin on Jetson Linux 36: GPU ``17000000.gpu`` under ``bus@0``, INA3221 on hwmon."""

    def __init__(self, root: Path, rails: dict[str, list[str | None]] | None = None, serial: str = "1421022054321"):
        self.root = root
        dt = root / "sys/firmware/devicetree/base"
        write(dt / "compatible", b"nvidia,p3737-0000+p3701-0005\0nvidia,p3701-0005\0nvidia,tegra234\0")
        write(dt / "model", b"NVIDIA Jetson AGX Orin Developer Kit\0")
        if serial:
            write(dt / "serial-number", serial.encode() + b"\0")
        link(root / "proc/device-tree", "../sys/firmware/devicetree/base")
        gpu = root / "sys/devices/platform/bus@0/17000000.gpu"
        self.load = write(gpu / "load", "0\n")
        self.cur_freq = write(gpu / "devfreq/17000000.gpu/cur_freq", "306000000\n")
        write(gpu / "devfreq/17000000.gpu/max_freq", "1300500000\n")
        link(gpu / "devfreq/17000000.gpu/device", "../../../17000000.gpu")
        link(root / "sys/class/devfreq/17000000.gpu", "../../devices/platform/bus@0/17000000.gpu/devfreq/17000000.gpu")
        # Another devfreq device (the video image compositor): no load file, must not be taken.
        vic = root / "sys/devices/platform/bus@0/15340000.vic"
        write(vic / "devfreq/15340000.vic/cur_freq", "115200000\n")
        link(vic / "devfreq/15340000.vic/device", "../../../15340000.vic")
        link(root / "sys/class/devfreq/15340000.vic", "../../devices/platform/bus@0/15340000.vic/devfreq/15340000.vic")
        fan = root / "sys/devices/platform/pwm-fan/hwmon/hwmon0"
        write(fan / "name", "pwmfan\n")
        link(root / "sys/class/hwmon/hwmon0", "../../devices/platform/pwm-fan/hwmon/hwmon0")
        self.channels: dict[str, Path] = {}  # label: hwmon chip folder, channel n as suffix
        for i, (addr, labels) in enumerate(sorted((ORIN_RAILS if rails is None else rails).items()), start=1):
            chip = root / f"sys/devices/platform/bus@0/c240000.i2c/i2c-1/{addr}/hwmon/hwmon{i}"
            write(chip / "name", "ina3221\n")
            for ch, label in enumerate(labels, start=1):
                write(chip / f"in{ch}_input", "0\n")
                write(chip / f"curr{ch}_input", "0\n")
                if label is not None:  # an unconnected channel has no label
                    write(chip / f"in{ch}_label", label + "\n")
                    self.channels[label] = chip / f"in{ch}"
            link(
                root / f"sys/class/hwmon/hwmon{i}",
                f"../../devices/platform/bus@0/c240000.i2c/i2c-1/{addr}/hwmon/hwmon{i}",
            )
        self.temp = write(root / "sys/devices/virtual/thermal/thermal_zone1/temp", "41000\n")
        write(root / "sys/devices/virtual/thermal/thermal_zone1/type", "gpu-thermal\n")
        write(root / "sys/devices/virtual/thermal/thermal_zone0/type", "cpu-thermal\n")
        write(root / "sys/devices/virtual/thermal/thermal_zone0/temp", "52000\n")
        for z in (0, 1):
            link(root / f"sys/class/thermal/thermal_zone{z}", f"../../devices/virtual/thermal/thermal_zone{z}")

    def set_rail(self, label: str, millivolts: int | str, milliamps: int | str) -> None:
        base = self.channels[label]
        chip, n = base.parent, base.name[2:]
        (chip / f"in{n}_input").write_text(f"{millivolts}\n")
        (chip / f"curr{n}_input").write_text(f"{milliamps}\n")


class XavierTree:
    """An AGX Xavier on L4T 32: GPU ``17000000.gv11b`` (also linked as ``gpu.0``), INA3221 on iio."""

    def __init__(self, root: Path) -> None:
        self.root = root
        write(root / "proc/device-tree/compatible", b"nvidia,p2972-0000\0nvidia,tegra194\0")
        write(root / "proc/device-tree/model", b"Jetson-AGX\0")
        write(root / "proc/device-tree/serial-number", b"0422818036117\0")
        gpu = root / "sys/devices/17000000.gv11b"
        self.load = write(gpu / "load", "0\n")
        write(gpu / "devfreq/17000000.gv11b/cur_freq", "1377000000\n")
        link(gpu / "devfreq/17000000.gv11b/device", "../../../17000000.gv11b")
        link(root / "sys/class/devfreq/17000000.gv11b", "../../devices/17000000.gv11b/devfreq/17000000.gv11b")
        link(root / "sys/devices/gpu.0", "17000000.gv11b")
        self.power: dict[str, Path] = {}
        chips = (("iio:device0", "1-0040", ["GPU", "CPU", "SOC"]), ("iio:device1", "1-0041", ["CV", "VDDRQ", "SYS5V"]))
        for dev, addr, labels in chips:
            folder = root / f"sys/devices/3160000.i2c/i2c-1/{addr}/{dev}"
            write(folder / "name", "ina3221x\n")
            for ch, label in enumerate(labels):
                write(folder / f"rail_name_{ch}", label + "\n")
                self.power[label] = write(folder / f"in_power{ch}_input", "0\n")
                write(folder / f"in_current{ch}_input", "0\n")
                write(folder / f"in_voltage{ch}_input", "0\n")
            link(root / f"sys/bus/iio/devices/{dev}", f"../../../devices/3160000.i2c/i2c-1/{addr}/{dev}")
        write(root / "sys/class/thermal/thermal_zone2/type", "GPU-therm\n")
        write(root / "sys/class/thermal/thermal_zone2/temp", "38500\n")


def watts(millivolts: float, milliamps: float) -> float:
    return millivolts / 1000 * milliamps / 1000


def run_script(tree: OrinTree, col: JetsonCollector, steps: list[tuple[float, int, int, int]]) -> tuple[list, list]:
    """Write each step's files, then read: (seconds since the previous read, load, mV, mA) on the GPU rail."""
    ticks, events = [], []
    t = T0
    for dt, load, mv, ma in steps:
        t += dt
        tree.load.write_text(f"{load}\n")
        tree.set_rail("VDD_GPU_SOC", mv, ma)
        got = col.read(set(), t)
        ticks += got.ticks
        events += got.events
    return ticks, events


def test_orin_busy_time_and_energy_over_scripted_ticks(tmp_path: Path) -> None:
    tree = OrinTree(tmp_path)
    col = JetsonCollector(sysfs_root=tmp_path)
    steps = [(0, 0, 5000, 400), (2.0, 250, 5000, 1200), (1.5, 1000, 4980, 3000), (0.5, 0, 5010, 500)]
    ticks, events = run_script(tree, col, steps)
    assert events == []
    assert len(ticks) == 3  # the first read primes
    assert [t.busy_s for t in ticks] == pytest.approx([0.5, 1.5, 0.0])
    assert [t.util_max_pct for t in ticks] == [25.0, 100.0, 0.0]
    p = [watts(mv, ma) for _, _, mv, ma in steps]
    expected = [(p[0] + p[1]) / 2 * 2.0, (p[1] + p[2]) / 2 * 1.5, (p[2] + p[3]) / 2 * 0.5]
    assert [t.energy_j for t in ticks] == pytest.approx(expected)
    assert [t.power_w for t in ticks] == pytest.approx(p[1:])
    assert {t.util_method for t in ticks} == {UTIL_INSTANT}
    assert {t.energy_method for t in ticks} == {ENERGY_POWER}
    assert [(t.t0, t.t1) for t in ticks] == [(T0, T0 + 2.0), (T0 + 2.0, T0 + 3.5), (T0 + 3.5, T0 + 4.0)]
    last = ticks[-1]
    assert last.sm_clock_mhz == pytest.approx(306.0) and last.temp_c == pytest.approx(41.0)
    # Unified memory: no device-memory figures at all, never a zero.
    for t in ticks:
        assert (t.mem_used_b, t.mem_reserved_b, t.proc_mem_b, t.proc_sm_util_pct, t.throttle_s) == (None,) * 5
    assert col.power_rails == {"gpu": "VDD_GPU_SOC", "board": "VIN_SYS_5V0"}


def test_identity_comes_from_the_device_tree_and_is_stable(tmp_path: Path) -> None:
    OrinTree(tmp_path / "a")
    OrinTree(tmp_path / "b", serial="1421022099999")
    (dev,) = JetsonCollector(sysfs_root=tmp_path / "a").devices()
    assert dev.name == "NVIDIA Jetson AGX Orin Developer Kit"
    assert dev.source == "jetson" and dev.index == 0 and dev.uuid.startswith("JETSON-")
    assert dev.memory_total_b is None and dev.pci_bus_id is None and dev.power_limit_w is None
    assert JetsonCollector(sysfs_root=tmp_path / "a").devices()[0].uuid == dev.uuid  # same board, same uuid
    assert JetsonCollector(sysfs_root=tmp_path / "b").devices()[0].uuid != dev.uuid  # another board


def test_without_a_serial_number_the_machine_id_names_the_board(tmp_path: Path) -> None:
    for name, machine in (("a", "5e6d1c0b9f8a4e2d8c7b6a5f4e3d2c1b"), ("b", "0123456789abcdef0123456789abcdef")):
        OrinTree(tmp_path / name, serial="")
        write(tmp_path / name / "etc/machine-id", machine + "\n")
    a = JetsonCollector(sysfs_root=tmp_path / "a").devices()[0].uuid
    assert a == JetsonCollector(sysfs_root=tmp_path / "a").devices()[0].uuid
    assert a != JetsonCollector(sysfs_root=tmp_path / "b").devices()[0].uuid


def test_xavier_l4t32_layout_reads_the_iio_power_monitor(tmp_path: Path) -> None:
    tree = XavierTree(tmp_path)
    col = JetsonCollector(sysfs_root=tmp_path)
    assert col.devices()[0].name == "Jetson-AGX"
    assert col.power_rails == {"gpu": "GPU", "board": None}
    tree.power["GPU"].write_text("1200\n")  # mW
    tree.power["CPU"].write_text("9000\n")  # another rail: must not count
    col.read(set(), T0)
    tree.load.write_text("600\n")
    tree.power["GPU"].write_text("3600\n")
    got = col.read(set(), T0 + 4.0)
    assert got.events == []
    (tick,) = got.ticks
    assert tick.busy_s == pytest.approx(2.4)
    assert tick.energy_j == pytest.approx((1.2 + 3.6) / 2 * 4.0)
    assert tick.power_w == pytest.approx(3.6)
    assert tick.sm_clock_mhz == pytest.approx(1377.0) and tick.temp_c == pytest.approx(38.5)


def test_the_gpu_only_rail_wins_over_a_shared_one(tmp_path: Path) -> None:
    OrinTree(tmp_path, rails={"1-0040": ["VDD_IN", "VDD_CPU_GPU_CV", "VDD_SOC"], "1-0041": ["POM_5V_GPU", None, None]})
    assert JetsonCollector(sysfs_root=tmp_path).power_rails == {"gpu": "POM_5V_GPU", "board": "VDD_IN"}


def test_orin_nano_energy_is_the_shared_cpu_gpu_rail(tmp_path: Path) -> None:
    tree = OrinTree(tmp_path, rails=ORIN_NANO_RAILS)
    col = JetsonCollector(sysfs_root=tmp_path)
    assert col.power_rails == {"gpu": "VDD_CPU_GPU_CV", "board": "VDD_IN"}
    tree.set_rail("VDD_IN", 5000, 2000)  # the whole module: never GPU energy
    tree.set_rail("VDD_CPU_GPU_CV", 5000, 600)
    col.read(set(), T0)
    (tick,) = col.read(set(), T0 + 1.0).ticks
    assert tick.energy_j == pytest.approx(3.0)


def test_only_ina3221_channels_and_gpu_devfreq_devices_count(tmp_path: Path) -> None:
    tree = OrinTree(tmp_path, rails={"1-0040": ["VDD_IN", "VDD_SOC", "VDD_CPU_CV"]})
    # Another hwmon chip (its in/curr numbering means other things) with a channel called GPU.
    other = tmp_path / "sys/devices/platform/bus@0/c250000.i2c/i2c-7/7-0045/hwmon/hwmon9"
    write(other / "name", "ina219\n")
    write(other / "in1_label", "VDD_GPU\n")
    write(other / "in1_input", "5000\n")
    write(other / "curr1_input", "800\n")
    link(tmp_path / "sys/class/hwmon/hwmon9", "../../devices/platform/bus@0/c250000.i2c/i2c-7/7-0045/hwmon/hwmon9")
    # Even another engine with a load file of its own is not the GPU.
    write(tmp_path / "sys/devices/platform/bus@0/15340000.vic/load", "900\n")
    col = JetsonCollector(sysfs_root=tmp_path)
    assert col.power_rails["gpu"] is None
    tree.load.write_text("100\n")
    col.read(set(), T0)
    (tick,) = col.read(set(), T0 + 1).ticks
    assert tick.busy_s == pytest.approx(0.1) and tick.energy_j is None


@pytest.mark.parametrize(
    "rails",
    [{"1-0040": ["VDD_IN", "VDD_SOC", "VDD_CPU_CV"]}, {"1-0040": ["CH1", "CH2", "CH3"]}],
    ids=["no-gpu", "unnamed"],
)
def test_no_gpu_rail_leaves_energy_absent_and_says_so_once(tmp_path: Path, rails: dict) -> None:
    tree = OrinTree(tmp_path, rails=rails)
    col = JetsonCollector(sysfs_root=tmp_path)
    assert col.power_rails["gpu"] is None
    ticks, events = [], []
    for i in range(4):
        tree.load.write_text("500\n")
        got = col.read(set(), T0 + i)
        ticks += got.ticks
        events += got.events
    assert [e.kind for e in events] == ["sampler_error"]
    assert "GPU energy is absent" in events[0].message
    assert all(lbl in events[0].message for lbl in rails["1-0040"])
    assert [(t.energy_j, t.energy_method, t.power_w) for t in ticks] == [(None, None, None)] * 3
    assert [t.busy_s for t in ticks] == pytest.approx([0.5] * 3)  # the rest stands


def test_a_board_without_a_power_monitor(tmp_path: Path) -> None:
    tree = OrinTree(tmp_path, rails={})
    col = JetsonCollector(sysfs_root=tmp_path)
    tree.load.write_text("100\n")
    first = col.read(set(), T0)
    assert [e.message for e in first.events] == [
        "jetson: no INA3221 power monitor found (hwmon or iio): GPU energy is absent"
    ]
    (tick,) = col.read(set(), T0 + 10).ticks
    assert tick.energy_j is None and tick.busy_s == pytest.approx(1.0)


def test_an_unreadable_file_is_absent_said_once_and_recovers(tmp_path: Path) -> None:
    tree = OrinTree(tmp_path)
    col = JetsonCollector(sysfs_root=tmp_path)
    tree.set_rail("VDD_GPU_SOC", 5000, 1000)
    tree.load.write_text("400\n")
    col.read(set(), T0)
    # Root reads any file whatever its mode, so a folder stands where the file was: open() fails
    # with an OSError, as a sysfs attribute does when its driver errors (EIO, ENODATA ...).
    tree.load.unlink()
    tree.load.mkdir()
    reads = [col.read(set(), T0 + i) for i in (1, 2, 3)]
    events = [e for r in reads for e in r.events]
    assert len(events) == 1 and events[0].kind == "sampler_error"
    assert "load" in events[0].message and events[0].payload == {"error": "IsADirectoryError"}
    ticks = [t for r in reads for t in r.ticks]
    assert [t.busy_s for t in ticks] == [None] * 3 and [t.util_method for t in ticks] == [None] * 3
    assert [t.energy_j for t in ticks] == pytest.approx([5.0] * 3)  # power still integrates
    tree.load.rmdir()
    tree.load.write_text("400\n")
    (tick,) = col.read(set(), T0 + 4).ticks
    assert tick.busy_s == pytest.approx(0.4)


def test_garbage_in_a_file_is_absent_not_a_crash(tmp_path: Path) -> None:
    tree = OrinTree(tmp_path)
    col = JetsonCollector(sysfs_root=tmp_path)
    tree.set_rail("VDD_GPU_SOC", 5000, 1000)
    col.read(set(), T0)
    tree.set_rail("VDD_GPU_SOC", 5000, "n/a")
    tree.load.write_text("1500\n")  # a per-mille file cannot say 150 %
    tree.cur_freq.write_text("\n")
    got = col.read(set(), T0 + 1)
    (tick,) = got.ticks
    assert (tick.busy_s, tick.energy_j, tick.power_w, tick.sm_clock_mhz) == (None, None, None, None)
    assert tick.temp_c == pytest.approx(41.0)
    messages = sorted(e.message for e in got.events)
    assert len(messages) == 3 and {e.kind for e in got.events} == {"sampler_error"}
    assert any("curr1_input: not an integer: 'n/a'" in m for m in messages)
    assert any("load 1500 outside 0-1000" in m for m in messages)
    # The span after the bad reading has one good end only: no energy for it either.
    tree.set_rail("VDD_GPU_SOC", 5000, 2000)
    tree.load.write_text("50\n")
    (tick,) = col.read(set(), T0 + 2).ticks
    assert tick.energy_j is None and tick.power_w == pytest.approx(10.0) and tick.busy_s == pytest.approx(0.05)
    (tick,) = col.read(set(), T0 + 3).ticks
    assert tick.energy_j == pytest.approx(10.0)


@pytest.mark.parametrize("value", ["", "-1", "NoDevFiles", "nodevfiles", " ", "1", "1,0", "MIG-abc"])
def test_cuda_visible_devices_that_hide_the_gpu(tmp_path: Path, value: str) -> None:
    OrinTree(tmp_path)
    col = JetsonCollector(visible=value, sysfs_root=tmp_path)
    assert col.devices() == []
    assert col.read(set(), T0).ticks == [] and col.read(set(), T0 + 1).ticks == []


@pytest.mark.parametrize("value", [None, "0", "0,1", "GPU-3a9e1c2b-7f40-5d1e-8c2b-1f0e9d8c7b6a"])
def test_cuda_visible_devices_that_show_the_gpu(tmp_path: Path, value: str | None) -> None:
    OrinTree(tmp_path)
    assert len(JetsonCollector(visible=value, sysfs_root=tmp_path).devices()) == 1


def test_not_a_jetson(tmp_path: Path) -> None:
    with pytest.raises(CollectorUnavailable):
        JetsonCollector(sysfs_root=tmp_path)
    # A desktop ARM board with a devfreq GPU that has a load file is still no Jetson.
    write(tmp_path / "proc/device-tree/compatible", b"rockchip,rk3588\0")
    write(tmp_path / "sys/class/devfreq/fb000000.gpu/device/load", "12\n")
    with pytest.raises(CollectorUnavailable):
        JetsonCollector(sysfs_root=tmp_path)


# --- the automatic choice in open_gpu_collector ------------------------------------------------


def nvml_missing() -> FakeNvml:
    return FakeNvml([], clock=Clock(), library_missing=True)


def test_no_nvml_and_a_jetson_picks_the_jetson_collector(tmp_path: Path) -> None:
    OrinTree(tmp_path)
    col, why = open_gpu_collector({}, nvml=nvml_missing(), which=lambda _: None, sysfs_root=str(tmp_path))
    assert why is None and [d.source for d in col.devices()] == ["jetson"]


def test_the_jetson_comes_before_nvidia_smi(tmp_path: Path) -> None:
    OrinTree(tmp_path)

    def smi_run(argv, timeout):  # JetPack 6's nvidia-smi: every figure N/A
        raise AssertionError("nvidia-smi must not be asked on a Jetson")

    col, why = open_gpu_collector(
        {}, nvml=nvml_missing(), which=lambda _: "/usr/sbin/nvidia-smi", smi_run=smi_run, sysfs_root=str(tmp_path)
    )
    assert why is None and col.devices()[0].source == "jetson"


@pytest.mark.parametrize("value", ["", "-1", "NoDevFiles"])
def test_a_hidden_jetson_gpu_gives_the_usual_reason(tmp_path: Path, value: str) -> None:
    OrinTree(tmp_path)
    col, why = open_gpu_collector(
        {"CUDA_VISIBLE_DEVICES": value}, nvml=nvml_missing(), which=lambda _: None, sysfs_root=str(tmp_path)
    )
    assert col is None
    assert why == f"CUDA_VISIBLE_DEVICES={value!r} leaves the command no GPU: {NO_GPU_TAIL}"


def test_jetpack6_nvml_that_lists_only_nvgpu_gives_way_to_sysfs(tmp_path: Path) -> None:
    OrinTree(tmp_path)
    nvml = FakeNvml([FakeGpu("GPU-6f1e2d3c-0000-1111-2222-333344445555", name="Orin (nvgpu)")], clock=Clock())
    col, why = open_gpu_collector({}, nvml=nvml, sysfs_root=str(tmp_path))
    assert why is None and col.devices()[0].source == "jetson"
    # The same NVML on a machine where no Jetson GPU is found stays in use.
    empty = tmp_path / "empty"
    empty.mkdir()
    nvml = FakeNvml([FakeGpu("GPU-6f1e2d3c-0000-1111-2222-333344445555", name="Orin (nvgpu)")], clock=Clock())
    col, why = open_gpu_collector({}, nvml=nvml, sysfs_root=str(empty))
    assert why is None and col.devices()[0].source == "nvml"


def test_a_working_nvml_is_kept_even_beside_a_jetson_tree(tmp_path: Path) -> None:
    OrinTree(tmp_path)
    col, why = open_gpu_collector({}, nvml=FakeNvml([FakeGpu("GPU-a")], clock=Clock()), sysfs_root=str(tmp_path))
    assert why is None and col.devices()[0].source == "nvml"


def test_a_jetson_without_its_gpu_says_jetson_in_the_reason(tmp_path: Path) -> None:
    tree = OrinTree(tmp_path)
    shutil.rmtree(tmp_path / "sys/class/devfreq")
    tree.load.unlink()
    col, why = open_gpu_collector({}, nvml=nvml_missing(), which=lambda _: None, sysfs_root=str(tmp_path))
    assert col is None
    assert "NVIDIA Jetson (NVIDIA Jetson AGX Orin Developer Kit) without a GPU load file" in why
    assert why.endswith("nvidia-smi not on PATH: GPU figures are absent; host metrics were recorded")


def test_off_jetson_the_reason_is_unchanged(tmp_path: Path) -> None:
    col, why = open_gpu_collector({}, nvml=nvml_missing(), which=lambda _: None, sysfs_root=str(tmp_path))
    assert col is None and "Jetson" not in why and why.startswith("no NVIDIA driver found")


# --- arithmetic over any script ------------------------------------------------------------------

step = st.tuples(
    st.floats(min_value=0.01, max_value=30.0),
    st.integers(min_value=0, max_value=1000),
    st.integers(min_value=0, max_value=20_000),
    st.integers(min_value=-50, max_value=10_000),
)


@settings(max_examples=40, deadline=None)
@given(st.lists(step, min_size=1, max_size=12))
def test_totals_are_the_sum_of_load_times_time_and_of_trapezoids(steps: list[tuple[float, int, int, int]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        tree = OrinTree(Path(tmp))
        col = JetsonCollector(sysfs_root=tmp)
        ticks, events = run_script(tree, col, [(0.0, 0, 0, 0), *steps])
    assert events == [] and len(ticks) == len(steps)
    times = [T0]
    for dt, *_ in steps:
        times.append(times[-1] + dt)  # as run_script adds them (epoch floats round the steps)
    spans = [b - a for a, b in itertools.pairwise(times)]
    busy = sum(load / 1000 * span for span, (_, load, _, _) in zip(spans, steps, strict=True))
    powers = [0.0] + [max(watts(mv, ma), 0.0) for _, _, mv, ma in steps]  # a supply rail gives nothing back
    energy = sum((powers[i] + powers[i + 1]) / 2 * spans[i] for i in range(len(steps)))
    assert sum(t.busy_s for t in ticks) == pytest.approx(busy, rel=1e-9, abs=1e-9)
    assert sum(t.energy_j for t in ticks) == pytest.approx(energy, rel=1e-9, abs=1e-9)
    assert all(0.0 <= t.busy_s <= t.t1 - t.t0 + 1e-9 and t.energy_j >= 0.0 for t in ticks)


def test_the_jetson_doc_names_real_interval_fields() -> None:
    doc = (Path(__file__).resolve().parents[1] / "docs" / "JETSON.md").read_text()
    table = doc.split("## What each figure measures", 1)[1].split("Absent", 1)[0]
    named = re.findall(r"^\| [^|`]*\(`(\w+)`", table, flags=re.MULTILINE)
    assert len(named) == 6
    assert set(named) <= {f.name for f in dataclasses.fields(GpuInterval)}


class ThorTree:
    """A Jetson AGX Thor on JetPack 7 (Jetson Linux 38): T264 in the device tree. A devfreq GPU entry
    with a ``load`` file is added too, so the test shows NVML is chosen for the SoC, not for a missing
    file."""

    def __init__(self, root: Path) -> None:
        dt = root / "sys/firmware/devicetree/base"
        write(dt / "compatible", b"nvidia,p3971-0080+p3834-0008\0nvidia,p3834-0008\0nvidia,tegra264\0")
        write(dt / "model", b"NVIDIA Jetson AGX Thor Developer Kit\0")
        link(root / "proc/device-tree", "../sys/firmware/devicetree/base")
        gpu = root / "sys/devices/platform/gpu"
        write(gpu / "load", "500\n")
        write(gpu / "devfreq/gpu/cur_freq", "1575000000\n")
        link(gpu / "devfreq/gpu/device", "../../../gpu")
        link(root / "sys/class/devfreq/gpu", "../../devices/platform/gpu/devfreq/gpu")


def test_jetson_thor_is_read_through_nvml(tmp_path: Path) -> None:
    ThorTree(tmp_path)
    thor = FakeNvml([FakeGpu("GPU-7a3c1d2e-0000-1111-2222-333344445555", name="NVIDIA Thor")], clock=Clock())
    col, why = open_gpu_collector({}, nvml=thor, sysfs_root=str(tmp_path))
    assert why is None and col.devices()[0].source == "nvml" and col.devices()[0].name == "NVIDIA Thor"
    with pytest.raises(CollectorUnavailable, match="through NVML"):
        JetsonCollector(sysfs_root=str(tmp_path))


def test_jetson_thor_without_nvml_says_nvml_is_needed(tmp_path: Path) -> None:
    ThorTree(tmp_path)
    col, why = open_gpu_collector({}, nvml=nvml_missing(), which=lambda _: None, sysfs_root=str(tmp_path))
    assert col is None
    assert "NVIDIA Jetson (NVIDIA Jetson AGX Thor Developer Kit) reports its GPU through NVML only" in why
