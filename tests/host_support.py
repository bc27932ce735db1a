"""A scripted host-wide reader for the host collector's tests: counters that follow a test clock.

It stands in for the machine's /proc/stat, meminfo, diskstats and net/dev (or psutil's host
functions), which a test cannot steer: each counter grows at a known rate, so what any span's delta
must be is known exactly: the integral of the rate over that span, and nothing from outside it. It
returns readings in the shape the collector takes (``SysSample``: cumulative busy, total and
iowait CPU-seconds summed over all CPUs, memory in use, per-device byte pairs).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gpuledger.collect.system import SysSample

CPUS = 2
IOWAIT_FRACTION = 0.125  # of all CPU time; a power of two keeps the arithmetic exact
DISK_READ_B_PER_S = 1024 * 300  # multiples of 1024: on times that are multiples of 1/1024 s, exact
DISK_WRITE_B_PER_S = 1024 * 700
NET_RX_B_PER_S = 1024 * 50
NET_TX_B_PER_S = 1024 * 20


class ScriptedSystem:
    """Host-wide counters at time ``clock()``; busy fraction of the CPUs per phase ``(start, fraction)``.

    ``fail_next`` makes the next ``read`` raise, as a reader that lost its files would.
    """

    def __init__(self, clock: Callable[[], float], phases: Sequence[tuple[float, float]] = ((0.0, 0.25),)) -> None:
        self.clock = clock
        self.starts = [start for start, _ in phases]
        assert self.starts[0] == 0.0 and self.starts == sorted(self.starts), "phases start at 0, in time order"
        self.fractions = [fraction for _, fraction in phases]
        self.reads: list[float] = []
        self.fail_next = False

    def busy_s(self, t: float) -> float:
        """Busy CPU-seconds of all CPUs from 0 to ``t`` (the integral of the phases)."""
        done, i = 0.0, 0
        while i + 1 < len(self.starts) and self.starts[i + 1] < t:
            done += (self.starts[i + 1] - self.starts[i]) * self.fractions[i]
            i += 1
        return CPUS * (done + (t - self.starts[i]) * self.fractions[i])

    def read(self) -> SysSample:
        if self.fail_next:
            self.fail_next = False
            raise OSError("scripted: the host counters could not be read")
        t = self.clock()
        self.reads.append(t)
        total = CPUS * t
        return SysSample(
            cpu=(self.busy_s(t), total, IOWAIT_FRACTION * total),
            mem_used_b=2**30 + int(t),
            disks={"vda": (round(DISK_READ_B_PER_S * t), round(DISK_WRITE_B_PER_S * t))},
            nets={"eth0": (round(NET_RX_B_PER_S * t), round(NET_TX_B_PER_S * t))},
        )

    def close(self) -> None:
        pass


def expected_util_pct(system: ScriptedSystem, t0: float, t1: float) -> float:
    """Host CPU utilisation over (t0, t1]: busy over total CPU time (iowait is not busy)."""
    return 100.0 * (system.busy_s(t1) - system.busy_s(t0)) / (CPUS * (t1 - t0))
