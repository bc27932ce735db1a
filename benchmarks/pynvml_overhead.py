"""nvidia-ml-py's own CPU per NVML query, the driver taken out.

    python benchmarks/pynvml_overhead.py [--calls 100000] [--repeat 5]

A query through pynvml is pynvml's Python and ctypes work (argument structs, the function-pointer
cache, the return check) plus the driver's (an ioctl and its work in the kernel). On a machine
without a GPU only the first part can be measured: here pynvml's real functions run with every
driver entry point replaced by one C function that returns at once with NVML_SUCCESS (libc's
``abs``, given a handle of 0; x86-64 and arm64 C calling conventions ignore the extra arguments).
What is printed is what pynvml itself costs per call, the floor under any real query.

Beside it, in the same run, the same calls answered by the scripted NVML (``FakeNvml``, one of
recorder_tick.py's A100s, its clock moving 10 µs a call), which stands in for pynvml and the
driver in the recorder's CPU benchmark (recorder_tick.py): whether its relative costs are
pynvml's too, in particular a field-value query (``nvmlDeviceGetFieldValues``, one call for
several figures) against the classic one-figure calls. The scripted buffer queries are not timed
(their cost depends on the cursor, which a loop of identical calls does not move).
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import itertools
import os
import sys
import timeit
from collections.abc import Callable
from importlib.metadata import version
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import machine_line, source_state

HANDLE = 0  # abs(0) == 0 == NVML_SUCCESS
FIELDS_PAIR = "nvmlDeviceGetFieldValues, energy + instant power"
SAMPLES = "nvmlDeviceGetSamples"
UNTIMED = {SAMPLES}  # scripted: a loop of calls from cursor 0 returns the whole buffer each time


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


def queries(nv: Any, h: Any) -> list[tuple[str, Callable[[], Any]]]:
    """The per-tick queries of the NVML collector on handle ``h`` of ``nv`` (pynvml or the script)."""
    import pynvml as c  # the constants: the script answers pynvml's

    energy, instant = c.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION, c.NVML_FI_DEV_POWER_INSTANT
    policies = [getattr(c, f"NVML_FI_DEV_PERF_POLICY_{p}") for p in
                ("POWER", "THERMAL", "SYNC_BOOST", "BOARD_LIMIT", "LOW_UTILIZATION", "RELIABILITY")]  # fmt: skip
    return [
        ("nvmlDeviceGetTotalEnergyConsumption", lambda: nv.nvmlDeviceGetTotalEnergyConsumption(h)),
        ("nvmlDeviceGetPowerUsage", lambda: nv.nvmlDeviceGetPowerUsage(h)),
        (FIELDS_PAIR, lambda: nv.nvmlDeviceGetFieldValues(h, [energy, instant])),
        ("nvmlDeviceGetFieldValues, 6 violation counters", lambda: nv.nvmlDeviceGetFieldValues(h, policies)),
        ("nvmlDeviceGetViolationStatus, power", lambda: nv.nvmlDeviceGetViolationStatus(h, c.NVML_PERF_POLICY_POWER)),
        (SAMPLES, lambda: nv.nvmlDeviceGetSamples(h, c.NVML_GPU_UTILIZATION_SAMPLES, 0)),
        ("nvmlDeviceGetUtilizationRates", lambda: nv.nvmlDeviceGetUtilizationRates(h)),
        ("nvmlDeviceGetMemoryInfo v2", lambda: nv.nvmlDeviceGetMemoryInfo(h, c.nvmlMemory_v2)),
        ("nvmlDeviceGetTemperatureV", lambda: nv.nvmlDeviceGetTemperatureV(h, c.NVML_TEMPERATURE_GPU)),
        ("nvmlDeviceGetTemperature", lambda: nv.nvmlDeviceGetTemperature(h, c.NVML_TEMPERATURE_GPU)),
        ("nvmlDeviceGetClockInfo", lambda: nv.nvmlDeviceGetClockInfo(h, c.NVML_CLOCK_SM)),
        ("nvmlDeviceGetCurrentClocksEventReasons", lambda: nv.nvmlDeviceGetCurrentClocksEventReasons(h)),
        ("nvmlDeviceGetComputeRunningProcesses", lambda: nv.nvmlDeviceGetComputeRunningProcesses(h)),
        ("nvmlDeviceGetProcessUtilization", lambda: nv.nvmlDeviceGetProcessUtilization(h, 0)),
    ]


def scripted() -> tuple[Any, Any]:
    """(FakeNvml, handle of its first GPU): one of recorder_tick.py's A100s, 10 µs of its time a call."""
    from recorder_tick import fake_gpus  # puts this tree's src/ on the path too

    from gpuledger.collect.fake_nvml import FakeNvml

    start = 1.7e9
    calls = itertools.count()
    fake = FakeNvml(fake_gpus(1, seconds=600), clock=lambda: start + 30 + next(calls) * 1e-5, start=start)
    fake.nvmlInit()
    return fake, fake.nvmlDeviceGetHandleByIndex(0)


def timed(call: Callable[[], Any], calls: int, repeat: int) -> float | str:
    """Best µs per call, or why the call cannot be timed this way."""
    try:
        call()
    except Exception as exc:  # an answer this function cannot take from a stub: say so, go on
        return type(exc).__name__
    return min(timeit.repeat(call, number=calls, repeat=repeat)) / calls * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=100_000, help="calls per timing (default 100000)")
    ap.add_argument("--repeat", type=int, default=5, help="timings per query; the best is kept (default 5)")
    args = ap.parse_args()

    import pynvml

    fake, fake_handle = scripted()  # before the stub: the script never reaches pynvml's library
    stub_driver(pynvml)
    print(machine_line())
    print(f"# {source_state()}; nvidia-ml-py {version('nvidia-ml-py')}; driver stubbed (one C function)")
    print(f"\nCPU per call, µs (best of {args.repeat} x {args.calls:,} calls)")
    print(f"  {'query':<50} {'pynvml':>8} {'scripted':>9}")
    real = {n: timed(f, args.calls, args.repeat) for n, f in queries(pynvml, HANDLE)}
    script = {n: timed(f, args.calls, args.repeat) for n, f in queries(fake, fake_handle) if n not in UNTIMED}
    for name, us in real.items():
        cells = [f"{v:8.2f}" if isinstance(v, float) else f"{v:>8}" for v in (us, script.get(name, "-"))]
        print(f"  {name:<50} {cells[0]} {cells[1]:>9}")
    print("  (pynvml: not timed where its two-call pattern cannot take a stub's answer; scripted: '-' where")
    print("   the answer depends on a buffer cursor)")
    for label, costs in (("pynvml", real), ("scripted NVML", script)):
        pair = costs["nvmlDeviceGetTotalEnergyConsumption"] + costs["nvmlDeviceGetPowerUsage"]
        fields = costs[FIELDS_PAIR]
        print(f"{label}: energy and power as one field-value query {fields:.2f} µs, as two classic calls "
              f"{pair:.2f} µs ({fields / pair:.1f}x)")  # fmt: skip
    print("(before the driver's work on real hardware: one round trip against two)")


if __name__ == "__main__":
    main()
