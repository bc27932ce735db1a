"""Host-wide counters for the host collector: CPU split, memory in use, disk and network bytes.

``SystemReader(procfs=...)`` reads the cumulative counters (``SysSample``); ``system_fields(prev, now)``
turns two readings into a HostTick's ``sys_*``, ``iowait_s``, ``disk_*`` and ``net_*`` fields. Any
part that cannot be read is None, absent rather than zero, and never stops the run's
own figures.

On Linux it reads /proc/stat, meminfo, diskstats and net/dev through kept-open files re-read with
pread: ~0.15 ms a read in the recorder's real 1 s loop on a 2-core VM (benchmarks/recorder_tick.py,
"host counters"), against ~1-2 ms with psutil's host functions, which stay as the portable reader.
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

import psutil

from gpuledger.collect.procfs import OpenFiles

_SECTOR_B = 512  # /proc/diskstats counts 512-byte sectors whatever the device's block size


_Pairs = dict[str, tuple[int, int]]  # device -> (read or rx bytes, write or tx bytes), cumulative


class SysSample(NamedTuple):
    cpu: tuple[float, float, float | None] | None  # busy, total and iowait CPU-seconds, all CPUs
    mem_used_b: int | None
    disks: _Pairs | None
    nets: _Pairs | None


def _counted_nic(name: str) -> bool:
    # lo is not network; ifb devices mirror a real interface's traffic for shaping (double count)
    return name != "lo" and not name.startswith("ifb")


def _cpu_split(fields: dict[str, float]) -> tuple[float, float, float | None]:
    # guest time is already inside user/nice (what psutil.cpu_percent does too)
    total = sum(v for k, v in fields.items() if k not in ("guest", "guest_nice"))
    iowait = fields.get("iowait")
    return total - fields["idle"] - (iowait or 0.0), total, iowait


class SystemReader:
    """Host counters from /proc (Linux) or psutil; any part it cannot read is None, absent rather than 0."""

    _CPU_NAMES = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal", "guest", "guest_nice")

    def __init__(self, procfs: bool) -> None:
        self._procfs = procfs
        self._tck = os.sysconf("SC_CLK_TCK") if procfs else 0  # /proc/stat counts clock ticks
        self._is_disk: dict[str, bool] = {}
        self._files = OpenFiles()

    def read(self) -> SysSample:
        if self._procfs:
            parts = (self._cpu, self._mem, self._disks, self._nets)
        else:
            parts = (self._ps_cpu, self._ps_mem, self._ps_disks, self._ps_nets)
        values = []
        for part in parts:
            try:
                values.append(part())
            except Exception:  # a host counter must never stop the run's own figures
                values.append(None)
        return SysSample(*values)

    def close(self) -> None:
        self._files.close_all()

    def _cpu(self) -> tuple[float, float, float | None]:
        head = self._files.read("/proc/stat").split(b"\n", 1)[0].split()[1:]
        return _cpu_split({k: int(v) / self._tck for k, v in zip(self._CPU_NAMES, head, strict=False)})

    def _mem(self) -> int:
        data = self._files.read("/proc/meminfo")

        def kib(key: bytes) -> int:
            at = data.index(key) + len(key)
            return int(data[at : data.index(b"\n", at)].split()[0])

        return (kib(b"MemTotal:") - kib(b"MemAvailable:")) * 1024  # psutil's virtual_memory().used

    def _disks(self) -> _Pairs | None:
        out: _Pairs = {}
        for line in self._files.read("/proc/diskstats").splitlines():
            f = line.split()
            if len(f) >= 14 and self._whole_disk(f[2].decode()):
                out[f[2].decode()] = (int(f[5]) * _SECTOR_B, int(f[9]) * _SECTOR_B)
        return out or None  # no disks (a container): absent, not zero

    def _whole_disk(self, name: str) -> bool:
        # as psutil: devices listed in /sys/block, so partitions are not counted twice
        if name not in self._is_disk:
            self._is_disk[name] = os.path.exists("/sys/block/" + name.replace("/", "!"))
        return self._is_disk[name]

    def _nets(self) -> _Pairs:
        out: _Pairs = {}
        for line in self._files.read("/proc/net/dev").splitlines()[2:]:
            name, _, rest = line.partition(b":")
            f = rest.split()
            if _counted_nic(name.strip().decode()):
                out[name.strip().decode()] = (int(f[0]), int(f[8]))
        return out

    @staticmethod
    def _ps_cpu() -> tuple[float, float, float | None]:
        return _cpu_split(psutil.cpu_times()._asdict())

    @staticmethod
    def _ps_mem() -> int:
        return int(psutil.virtual_memory().used)

    @staticmethod
    def _ps_disks() -> _Pairs | None:
        d = psutil.disk_io_counters()
        return None if d is None else {"all": (d.read_bytes, d.write_bytes)}

    @staticmethod
    def _ps_nets() -> _Pairs:
        nics = psutil.net_io_counters(pernic=True)
        return {k: (v.bytes_recv, v.bytes_sent) for k, v in nics.items() if _counted_nic(k)}


def _pairs_delta(prev: _Pairs | None, now: _Pairs | None) -> tuple[int, int] | tuple[None, None]:
    """Bytes moved since ``prev``, over devices present both times; a device whose counter went back
    (reset, re-plugged) adds nothing rather than a negative or made-up figure."""
    if not prev or not now or not (prev.keys() & now.keys()):
        return None, None
    a = b = 0
    for name in prev.keys() & now.keys():
        (a1, b1), (a0, b0) = now[name], prev[name]
        if a1 >= a0 and b1 >= b0:
            a, b = a + a1 - a0, b + b1 - b0
    return a, b


def system_fields(prev: SysSample | None, now: SysSample) -> dict[str, Any]:
    util = iowait = None
    if prev and prev.cpu and now.cpu:
        busy, total = now.cpu[0] - prev.cpu[0], now.cpu[1] - prev.cpu[1]
        util = min(100.0, max(0.0, 100.0 * busy / total)) if total > 0 else None
        if now.cpu[2] is not None and prev.cpu[2] is not None:
            iowait = max(0.0, now.cpu[2] - prev.cpu[2])
    disk_r, disk_w = _pairs_delta(prev and prev.disks, now.disks)
    net_rx, net_tx = _pairs_delta(prev and prev.nets, now.nets)
    return {
        "sys_cpu_util_pct": util, "iowait_s": iowait, "sys_mem_used_b": now.mem_used_b,
        "disk_read_b": disk_r, "disk_write_b": disk_w, "net_rx_b": net_rx, "net_tx_b": net_tx,
    }  # fmt: skip
