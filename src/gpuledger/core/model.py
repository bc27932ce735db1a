"""The records gpuledger keeps: plain dataclasses, no I/O.

Units are in the field names: ``_s`` seconds, ``_j`` joules, ``_b`` bytes, ``_w`` watts,
``_c`` degrees Celsius, ``_mhz`` megahertz, ``_pct`` percent 0-100. Times (``t0``, ``t1``,
``started_at`` ...) are Unix epoch seconds as floats. ``None`` always means "not measured /
not supported", never zero.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

RUN_STATUSES = ("running", "succeeded", "failed", "killed", "lost", "imported", "discovered")
# Found by the node agent (``gpuledger agent``) with no wrapper: open while ``ended_at`` is None,
# finished (for rollups, cost and chargeback) once its agent set an end.
DISCOVERED = "discovered"


def run_is_open(status: str | None, ended_at: float | None) -> bool:
    """Still being recorded: ``running``, or ``discovered`` without an end yet."""
    return status == "running" or (status == DISCOVERED and ended_at is None)


# How a GPU's busy time was measured, per interval.
UTIL_SAMPLES = "samples"  # integrated from the driver's utilisation sample buffer
UTIL_INSTANT = "instant"  # instantaneous utilisation x tick length
# How a GPU's energy was measured, per interval.
ENERGY_COUNTER = "counter"  # cumulative hardware energy counter
ENERGY_POWER = "power"  # trapezoidal integration of power readings


@dataclass(frozen=True)
class GpuIdentity:
    """One GPU as the run sees it."""

    index: int  # index as CMD sees it (position in CUDA_VISIBLE_DEVICES order)
    uuid: str
    name: str
    pci_bus_id: str | None = None
    memory_total_b: int | None = None
    power_limit_w: float | None = None
    driver_version: str | None = None
    cuda_version: str | None = None
    mig_mode: str | None = None  # "enabled" / "disabled" / None when unsupported
    mig_parent_uuid: str | None = None  # set when this device is a MIG slice
    mig_profile: str | None = None  # e.g. "1g.10gb"; slice share of the parent
    nvml_index: int | None = None  # the driver's own index (may differ from ``index``)
    source: str = "nvml"  # "nvml", "nvidia-smi" or "replay"


@dataclass(slots=True)  # one per GPU per tick
class GpuTick:
    """What a GPU collector measured on one device between two reads (t0, t1].

    Integrals (``busy_s``, ``energy_j``, ``throttle_s``) cover exactly the span; gauges are the
    value read at t1 (or the max seen in the span where the driver buffer gives one). Except
    ``throttle_s`` and a counter's ``energy_j`` (NVML's cumulative counters), which are read only
    where an interval ends: there they cover the span since the previous such read, at other ticks
    they are None (not read; ``energy_method`` None too).
    """

    uuid: str
    t0: float
    t1: float
    busy_s: float | None = None
    util_method: str | None = None
    util_max_pct: float | None = None
    # How the span was covered when busy time came from the sample buffer (None otherwise):
    util_idle_s: float | None = None  # unsampled, taken as idle (the driver had nothing to sample)
    util_unknown_s: float | None = None  # samples lost or unusable: measured by the instant reading, or unmeasured
    energy_j: float | None = None
    energy_method: str | None = None
    power_w: float | None = None
    mem_used_b: int | None = None
    mem_reserved_b: int | None = None
    temp_c: float | None = None
    sm_clock_mhz: float | None = None
    mem_clock_mhz: float | None = None
    # Seconds spent throttled per reason in the span (see above); None when not read or not known.
    throttle_s: dict[str, float] | None = None
    proc_mem_b: int | None = None  # GPU memory held by the run's own processes
    proc_sm_util_pct: float | None = None  # the run's processes' share of SM, 0-100
    proc_method: str | None = None  # how the run's processes were found: "pid", "cgroup", "pidns"
    # NVML's energy counter as read (mJ since the driver loaded), where it was read; for exporters
    # that publish the device's own counter (node/metrics.py's dcgm-exporter names).
    energy_total_mj: int | None = None
    gpu_instance_id: int | None = None  # a MIG slice's GPU instance id (NVML), None for a whole GPU


@dataclass
class GpuInterval:
    """Exact integrals and gauge extremes for one device over one recording interval."""

    device_uuid: str
    seq: int  # per run and device, 0, 1, 2 ... (idempotency key with run id)
    t0: float
    t1: float
    samples: int = 0
    busy_s: float | None = None
    util_method: str | None = None
    util_max_pct: float | None = None
    util_idle_s: float | None = None
    util_unknown_s: float | None = None
    # Of util_unknown_s, the time no instant reading measured either: neither busy nor idle.
    # None on rows stored before it (busy.unmeasured_seconds then applies the per-interval rule).
    util_unmeasured_s: float | None = None
    energy_j: float | None = None
    energy_method: str | None = None
    power_max_w: float | None = None
    mem_used_max_b: int | None = None
    mem_used_last_b: int | None = None
    mem_reserved_b: int | None = None
    proc_mem_max_b: int | None = None
    proc_sm_util_avg_pct: float | None = None
    proc_method: str | None = None
    temp_max_c: float | None = None
    sm_clock_avg_mhz: float | None = None
    mem_clock_max_mhz: float | None = None
    throttle_s: dict[str, float] | None = None


@dataclass
class HostTick:
    """What the host collector measured between two reads (t0, t1].

    The tree's figures cover exactly (t0, t1]. The host-wide ones (``sys_*``, ``iowait_s``,
    ``disk_*``, ``net_*``) are read less often and cover (``sys_t0``, t1]: since the previous
    host-wide read, which may be several ticks back but never before the interval the tick belongs to.
    """

    t0: float
    t1: float
    cpu_s: float  # process tree, user + system, including reaped children
    rss_b: int  # process tree resident memory now
    read_b: int  # process tree storage bytes read in the span
    write_b: int
    threads: int
    procs: int
    sys_cpu_util_pct: float | None = None
    iowait_s: float | None = None
    sys_mem_used_b: int | None = None
    disk_read_b: int | None = None
    disk_write_b: int | None = None
    net_rx_b: int | None = None
    net_tx_b: int | None = None
    sys_t0: float | None = None  # start of the span the host-wide figures cover; None when there are none


@dataclass
class HostInterval:
    seq: int
    t0: float
    t1: float
    samples: int = 0
    cpu_s: float = 0.0
    rss_max_b: int = 0
    read_b: int = 0
    write_b: int = 0
    threads_max: int = 0
    procs_max: int = 0
    sys_cpu_util_avg_pct: float | None = None
    iowait_s: float | None = None
    sys_mem_used_max_b: int | None = None
    disk_read_b: int | None = None
    disk_write_b: int | None = None
    net_rx_b: int | None = None
    net_tx_b: int | None = None


@dataclass
class Event:
    """Something that happened during a run (epoch end, sampler error, signal, alert ...)."""

    t: float
    kind: str
    message: str = ""
    payload: dict[str, Any] = field(default_factory=dict)


@dataclass
class Metric:
    """A training metric (loss, mAP, lr ...) at an epoch or step."""

    t: float
    key: str
    value: float
    epoch: int | None = None
    step: int | None = None


@dataclass
class RunRecord:
    id: str
    command: list[str]
    user: str
    host: str
    cwd: str
    started_at: float
    name: str | None = None
    status: str = "running"
    ended_at: float | None = None
    exit_code: int | None = None
    signal: int | None = None
    labels: dict[str, str] = field(default_factory=dict)
    git: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    attempt_of: str | None = None
    replayed: bool = False
    interval_s: float = 5.0
    recorder_pid: int | None = None  # lets a later reader see the recorder died (status "lost")
    log_path: str | None = None  # the on-disk log written by the output relay
    status_reason: str | None = None  # one line saying why it failed / was lost
    gpu_note: str | None = None  # why there are no GPU figures, when there are none
    # What ran, beyond the command: hyper-parameters, model, dataset, weights ... (integrations fill it)
    meta: dict[str, Any] = field(default_factory=dict)
