"""The scripted NVML's own tables: NVML constants it answers with, and how each product behaves.

Written from NVML's documentation, nvml.h/pynvml and behaviour reported in public bug threads,
never from gpuledger's collector (a fake that shares the collector's tables cannot catch the
collector's mistakes). ``tests/test_fake_nvml.py`` checks every number here against pynvml.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass

# -- NVML constants (values from nvml.h, as pynvml defines them) ------------------------------
# Clock-event reasons (nvmlClocksEventReason* in pynvml; bitmask of nvmlDeviceGetCurrentClocksEventReasons).
REASON_BITS: dict[str, int] = {
    "low_util": 0x1,  # nvmlClocksEventReasonGpuIdle
    "app_clocks": 0x2,  # nvmlClocksEventReasonApplicationsClocksSetting
    "power": 0x4,  # nvmlClocksEventReasonSwPowerCap
    "hw_slowdown": 0x8,  # nvmlClocksEventReasonHwSlowdown
    "sync_boost": 0x10,  # nvmlClocksEventReasonSyncBoost
    "thermal": 0x20,  # nvmlClocksEventReasonSwThermalSlowdown
    "hw_thermal": 0x40,  # nvmlClocksEventReasonHwThermalSlowdown
    "hw_power_brake": 0x80,  # nvmlClocksEventReasonHwPowerBrakeSlowdown
    "display_clock": 0x100,  # nvmlClocksEventReasonDisplayClockSetting
    # No nvmlClocksEventReason* names these two; pynvml keeps them as nvmlClocksThrottleReasonBoardLimit
    # and nvmlClocksThrottleReasonReliability (deprecated throttle-reason names).
    "board_limit": 0x200,
    "reliability": 0x400,
}
# Perf policies (NVML_PERF_POLICY_*, nvmlDeviceGetViolationStatus) and the reasons each one counts.
PERF_POLICY_POWER, PERF_POLICY_THERMAL, PERF_POLICY_SYNC_BOOST = 0, 1, 2
PERF_POLICY_BOARD_LIMIT, PERF_POLICY_LOW_UTILIZATION, PERF_POLICY_RELIABILITY = 3, 4, 5
POLICY_REASONS: dict[int, frozenset[str]] = {
    PERF_POLICY_POWER: frozenset({"power"}),
    PERF_POLICY_THERMAL: frozenset({"thermal", "hw_thermal"}),  # the thermal policy, software or hardware
    PERF_POLICY_SYNC_BOOST: frozenset({"sync_boost"}),
    PERF_POLICY_BOARD_LIMIT: frozenset({"board_limit"}),
    PERF_POLICY_LOW_UTILIZATION: frozenset({"low_util"}),
    PERF_POLICY_RELIABILITY: frozenset({"reliability"}),
}
# Field ids (NVML_FI_*, nvmlDeviceGetFieldValues).
FI_PERF_POLICY: dict[int, int] = {  # NVML_FI_DEV_PERF_POLICY_POWER .. _RELIABILITY: same counters as above
    74: PERF_POLICY_POWER,
    75: PERF_POLICY_THERMAL,
    76: PERF_POLICY_SYNC_BOOST,
    77: PERF_POLICY_BOARD_LIMIT,
    78: PERF_POLICY_LOW_UTILIZATION,
    79: PERF_POLICY_RELIABILITY,
}
FI_TOTAL_ENERGY_CONSUMPTION = 83  # mJ since the driver was last reloaded
FI_POWER_AVERAGE = 185  # mW, averaged over 1 s
FI_POWER_INSTANT = 186  # mW, instantaneous
# Architectures (NVML_DEVICE_ARCH_*, nvmlDeviceGetArchitecture).
ARCH_VOLTA, ARCH_TURING, ARCH_AMPERE, ARCH_ADA, ARCH_HOPPER = 5, 6, 7, 8, 9
ARCH_UNKNOWN = 0xFFFFFFFF

IDLE_SAMPLING = ("grid", "slow", "stop")
# The clock that stamps utilisation samples: nvmlSample_t.timeStamp is "CPU timestamp in
# microseconds" with no epoch (nvmlFieldValue_t.timestamp says "since 1970"). Most drivers use the
# Unix epoch; some CLOCK_BOOTTIME: a public GPU agent (2026-05) found its samples dated February
# 1970 on a host up 58 days, which is also the uptime the fake assumes without a boot clock.
SAMPLE_CLOCKS = ("wall", "boot")
DEFAULT_UPTIME_S = 58 * 86_400.0
PROCESS_LISTS = ("compute", "mps", "graphics")  # the running-process lists NVML keeps per device


# -- product profiles ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Profile:
    """How one kind of product samples and reports. Periods marked *assumed* are not documented.

    * ``sample_period_s``: utilisation sample period. NVML documents only "between 1 second and
      1/6 second depending on the product"; each profile's value is assumed, and the table covers
      both ends.
    * ``buffer_len``: samples the driver keeps (assumed, "on the order of 100").
    * ``idle_sampling``: what the driver does while the GPU is idle: ``"grid"`` keeps sampling,
      ``"slow"`` samples every ``idle_period_s``, ``"stop"`` takes no sample, so
      ``nvmlDeviceGetSamples`` answers NotFound (reported on recent drivers:
      polarsignals/gpu-metrics-agent PR 37, "ring buffers run dry whenever the GPU sits idle").
    * ``energy_update_s``: the energy counter moves in steps this far apart (0: continuous).
      About 100 ms on current GPUs (ml.energy, "Thermally Stable Profiling": "approximately every
      100 ms"); about 10 ms was seen on an older system (gpuopenanalytics/pynvml PR 18).
    * ``power_average_s``: ``nvmlDeviceGetPowerUsage`` is the mean over this trailing window
      (0: instantaneous). NVML API reference: "On Ampere (except GA100) or newer GPUs, the API
      returns power averaged over 1 sec interval. On GA100 and older architectures, instantaneous
      power is returned."
    * ``architecture``: what ``nvmlDeviceGetArchitecture`` answers (None: from the GPU's name).
    * ``phased``: sampling and counter updates start at a per-GPU offset derived from the uuid, as
      on hardware, where nothing lines them up with whole seconds or with each other.
    """

    name: str
    architecture: int | None
    sample_period_s: float
    buffer_len: int
    idle_sampling: str
    idle_period_s: float
    energy_update_s: float
    power_average_s: float
    phased: bool = True


PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        # Other datacenter Hopper (H100, H800, GH200): buffer dry while idle, as reported for recent
        # drivers (assumed here: not seen on the H200 below).
        Profile("hopper", ARCH_HOPPER, 1 / 6, 100, "stop", 1.0, 0.1, 1.0),
        # H200, as seen on one (driver 580.159.04, persistence mode on, 2026-12-04, the device
        # check): a sample every 0.2 s, busy or idle; the buffer held 71 samples (14 s); a cursor at
        # the newest sample answers NotFound; the energy counter moved every 100 ms; GetPowerUsage
        # equalled the 1 s average field (NVML_FI_DEV_POWER_AVERAGE), not the instant one.
        Profile("h200", ARCH_HOPPER, 0.2, 71, "grid", 1.0, 0.1, 1.0),
        # Datacenter Ampere GA100 (A100, A800, A30): instantaneous GetPowerUsage per NVML's docs;
        # slowed idle sampling (assumed).
        Profile("ampere-ga100", ARCH_AMPERE, 1 / 6, 120, "slow", 1.0, 0.1, 0.0),
        # Other Ampere (A10, A40, RTX 30xx): averaged GetPowerUsage per NVML's docs.
        Profile("ampere", ARCH_AMPERE, 1 / 6, 100, "slow", 1.0, 0.1, 1.0),
        # Volta and Turing datacenter parts: the slow end of the documented sample period (assumed),
        # sampling on a fixed grid even while idle, faster counter updates.
        Profile("volta", ARCH_VOLTA, 1.0, 100, "grid", 1.0, 0.02, 0.0),
        Profile("turing", ARCH_TURING, 1.0, 100, "grid", 1.0, 0.02, 0.0),
        # Consumer Ada (RTX 40xx).
        Profile("ada-consumer", ARCH_ADA, 1 / 6, 100, "stop", 1.0, 0.1, 1.0),
        # Any other name: a recent datacenter driver's behaviour, the most demanding for a collector.
        Profile("default", ARCH_UNKNOWN, 1 / 6, 100, "stop", 1.0, 0.1, 1.0),
        # For tests of unrelated features only: grid sampling even when idle, a continuous energy
        # counter, instantaneous power, no phase.
        Profile("ideal", None, 1 / 6, 120, "grid", 1.0, 0.0, 0.0, phased=False),
    )
}
# Product name (as nvmlDeviceGetName reports it) -> profile, first match wins.
_PRODUCTS: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern, re.IGNORECASE), name)
    for pattern, name in (
        (r"\bH200\b", "h200"),
        (r"\bG?H(100|200|800)\b", "hopper"),
        (r"\bA(100|800|30)\b", "ampere-ga100"),
        (r"\bA(10G?|16|40)\b|\bRTX 30\d0|\bRTX A\d000\b", "ampere"),
        (r"\bV100\b", "volta"),
        (r"\bT4\b", "turing"),
        (r"\bRTX 40\d0\b", "ada-consumer"),
    )
)


def profile_for_name(gpu_name: str) -> Profile:
    """The profile NVML's name for a GPU selects; ``default`` for names not in the table."""
    for pattern, name in _PRODUCTS:
        if pattern.search(gpu_name):
            return PROFILES[name]
    return PROFILES["default"]


def resolve_profile(profile: str | Profile | None, gpu_name: str) -> Profile:
    """A profile given by name or object, or the one the GPU's name selects."""
    if isinstance(profile, Profile):
        return profile
    if profile is None:
        return profile_for_name(gpu_name)
    try:
        return PROFILES[profile]
    except KeyError:
        raise ValueError(f"unknown profile {profile!r} (known: {', '.join(PROFILES)})") from None


def architecture(profile: Profile, gpu_name: str) -> int:
    """``nvmlDeviceGetArchitecture``'s answer: the profile's, else the one the name implies."""
    if profile.architecture is not None:
        return profile.architecture
    arch = profile_for_name(gpu_name).architecture
    return ARCH_UNKNOWN if arch is None else arch


def phase_fraction(uuid: str, salt: str) -> float:
    """A stable fraction in [0, 1) per GPU (and per clock domain), for sampling/update offsets."""
    return zlib.crc32(f"{salt}:{uuid}".encode()) / 2**32
