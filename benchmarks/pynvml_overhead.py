"""nvidia-ml-py's own CPU per NVML query, the driver taken out.

    python benchmarks/pynvml_overhead.py [--calls 100000] [--repeat 5]

A query through pynvml is pynvml's Python and ctypes work (argument structs, the function-pointer
cache, the return check) plus the driver's (an ioctl and its work in the kernel). On a machine
without a GPU only the first part can be measured: here pynvml's real functions run with every
driver entry point replaced by one C function that returns at once with NVML_SUCCESS (libc's
``abs``, given a handle of 0; x86-64 and arm64 C calling conventions ignore the extra arguments).
What is printed is what pynvml itself costs per call, the floor under any real query.

It answers one question the recorder's CPU benchmark (recorder_tick.py) cannot: whether the
scripted NVML's relative costs (which stand in for pynvml and the driver there) are pynvml's too,
in particular a field-value query (``nvmlDeviceGetFieldValues``, one call for several figures)
against the classic one-figure calls.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import os
import sys
import timeit
from collections.abc import Callable
from importlib.metadata import version
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import machine_line, source_state

HANDLE = 0  # abs(0) == 0 == NVML_SUCCESS


def stub_driver(nv: Any) -> None:
    """Every entry point pynvml looks up answers NVML_SUCCESS at once (no library, no GPU)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    stub = libc.abs

    class Stubbed(dict):  # pynvml's function-pointer cache, answering every name
        def __contains__(self, name: object) -> bool:
            return True

        def __missing__(self, name: str) -> Any:
            return stub

    nv._nvmlGetFunctionPointer_cache = Stubbed()


def queries(nv: Any) -> list[tuple[str, Callable[[], Any]]]:
    """The per-tick queries of the NVML collector, as pynvml calls them."""
    energy, instant = nv.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION, nv.NVML_FI_DEV_POWER_INSTANT
    policies = [getattr(nv, f"NVML_FI_DEV_PERF_POLICY_{p}") for p in
                ("POWER", "THERMAL", "SYNC_BOOST", "BOARD_LIMIT", "LOW_UTILIZATION", "RELIABILITY")]  # fmt: skip
    h = HANDLE
    return [
        ("nvmlDeviceGetTotalEnergyConsumption", lambda: nv.nvmlDeviceGetTotalEnergyConsumption(h)),
        ("nvmlDeviceGetPowerUsage", lambda: nv.nvmlDeviceGetPowerUsage(h)),
        ("nvmlDeviceGetFieldValues, energy + instant power", lambda: nv.nvmlDeviceGetFieldValues(h, [energy, instant])),
        ("nvmlDeviceGetFieldValues, 6 violation counters", lambda: nv.nvmlDeviceGetFieldValues(h, policies)),
        ("nvmlDeviceGetViolationStatus (one policy)", lambda: nv.nvmlDeviceGetViolationStatus(h, 0)),
        ("nvmlDeviceGetSamples (empty buffer)", lambda: nv.nvmlDeviceGetSamples(h, nv.NVML_GPU_UTILIZATION_SAMPLES, 0)),
        ("nvmlDeviceGetUtilizationRates", lambda: nv.nvmlDeviceGetUtilizationRates(h)),
        ("nvmlDeviceGetMemoryInfo v2", lambda: nv.nvmlDeviceGetMemoryInfo(h, nv.nvmlMemory_v2)),
        ("nvmlDeviceGetTemperatureV", lambda: nv.nvmlDeviceGetTemperatureV(h, nv.NVML_TEMPERATURE_GPU)),
        ("nvmlDeviceGetTemperature", lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)),
        ("nvmlDeviceGetClockInfo", lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
        ("nvmlDeviceGetCurrentClocksEventReasons", lambda: nv.nvmlDeviceGetCurrentClocksEventReasons(h)),
        ("nvmlDeviceGetComputeRunningProcesses (none)", lambda: nv.nvmlDeviceGetComputeRunningProcesses(h)),
        ("nvmlDeviceGetProcessUtilization (none)", lambda: nv.nvmlDeviceGetProcessUtilization(h, 0)),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=100_000, help="calls per timing (default 100000)")
    ap.add_argument("--repeat", type=int, default=5, help="timings per query; the best is kept (default 5)")
    args = ap.parse_args()

    import pynvml

    stub_driver(pynvml)
    print(machine_line())
    print(f"# {source_state()}; nvidia-ml-py {version('nvidia-ml-py')}; driver stubbed (one C function)")
    print(f"\npynvml's own CPU per call, µs (best of {args.repeat} x {args.calls:,} calls)")
    costs = {}
    for name, call in queries(pynvml):
        try:
            call()
        except Exception as exc:  # a stub answer this function cannot take: say so, go on
            print(f"  {name:<52} not measurable with a stub: {type(exc).__name__}: {exc}")
            continue
        costs[name] = min(timeit.repeat(call, number=args.calls, repeat=args.repeat)) / args.calls * 1e6
        print(f"  {name:<52} {costs[name]:6.2f}")
    pair = costs["nvmlDeviceGetTotalEnergyConsumption"] + costs["nvmlDeviceGetPowerUsage"]
    fields = costs["nvmlDeviceGetFieldValues, energy + instant power"]
    print(f"\nenergy and power: one field-value query {fields:.2f} µs, two classic calls {pair:.2f} µs "
          f"({fields / pair:.1f}x), before the driver's work (one round trip against two)")  # fmt: skip


if __name__ == "__main__":
    main()
