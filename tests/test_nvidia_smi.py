"""The nvidia-smi fallback: pure parsing on captured-style output, and the collector on a fake runner."""

from __future__ import annotations

import pytest

from gpuledger.collect.base import CollectorUnavailable
from gpuledger.collect.nvidia_smi import BASE_FIELDS, FIELD_SETS, NvidiaSmiCollector, parse_csv, parse_value
from gpuledger.core.model import ENERGY_POWER, UTIL_INSTANT

MiB = 2**20
# nvidia-smi --query-gpu=<FIELD_SETS[0]> --format=csv,noheader,nounits, as a driver prints it
QUERY = "".join(
    ", ".join(row) + "\n"
    for row in (
        ("0", "GPU-6a3e0c1d-2b4f-4e6a-9c8d-7f1e2d3c4b5a", "NVIDIA A100-SXM4-80GB", "00000000:07:00.0", "550.54.15",
         "81920", "20480", "312.45", "400.00", "61", "1410", "1593", "97", "Disabled", "0x0000000000000004"),
        ("1", "GPU-7b4f1d2e-3c5a-4f7b-8d9e-8a2f3e4d5c6b", "NVIDIA A100-SXM4-80GB", "00000000:0F:00.0", "550.54.15",
         "81920", "3", "[N/A]", "400.00", "34", "210", "1593", "0", "Enabled", "0x0000000000000001"),
    )
)  # fmt: skip
T4 = "0, GPU-t4, Tesla T4, 00000000:00:1E.0, 470.82.01, 15109, 0, [Not Supported], [Not Supported], 38, 300, 5000, 0\n"
APPS = "GPU-6a3e0c1d-2b4f-4e6a-9c8d-7f1e2d3c4b5a, 4242, 18000\nGPU-6a3e0c1d-2b4f-4e6a-9c8d-7f1e2d3c4b5a, 77, 1000\n"


class Runner:
    """Stands in for running nvidia-smi: answers per query kind, records the calls."""

    def __init__(self, query: str = QUERY, apps: str = APPS, reject: tuple[str, ...] = ()) -> None:
        self.query, self.apps, self.reject, self.calls = query, apps, reject, []

    def __call__(self, argv, timeout_s):
        self.calls.append(argv)
        arg = argv[1]
        for field in self.reject:
            if field in arg:
                raise RuntimeError(f'Field "{field}" is not a valid field to query.')
        return self.apps if arg.startswith("--query-compute-apps") else self.query


def test_parse_values() -> None:
    assert parse_value("power.draw", " 312.45 ") == 312.45
    for raw in ("[N/A]", "[Not Supported]", "N/A", "[Unknown Error]", "[GPU is lost]", ""):
        assert parse_value("power.draw", raw) is None
    assert parse_value("name", "NVIDIA A100-SXM4-80GB") == "NVIDIA A100-SXM4-80GB"
    rows = parse_csv(QUERY, FIELD_SETS[0])
    assert len(rows) == 2
    assert rows[1]["power.draw"] is None and rows[1]["utilization.gpu"] == 0.0
    assert rows[0]["clocks_event_reasons.active"] == "0x0000000000000004"
    assert parse_csv("garbage line\n", FIELD_SETS[0]) == []


def test_identity_and_ticks() -> None:
    runner = Runner()
    col = NvidiaSmiCollector(None, run=runner)
    a, b = col.devices()
    assert (a.index, a.name, a.memory_total_b, a.power_limit_w, a.source) == (
        0, "NVIDIA A100-SXM4-80GB", 81920 * MiB, 400.0, "nvidia-smi",
    )  # fmt: skip
    assert (a.pci_bus_id, a.driver_version) == ("00000000:07:00.0", "550.54.15")
    assert (a.mig_mode, b.mig_mode) == ("disabled", "enabled")
    assert col.read({77}, 100.0).ticks == []  # primes
    r = col.read({77}, 102.0)
    t, u = r.ticks
    assert (t.busy_s, t.util_method, t.util_max_pct) == (pytest.approx(1.94), UTIL_INSTANT, 97.0)
    assert (t.energy_j, t.energy_method, t.power_w) == (pytest.approx(624.9), ENERGY_POWER, 312.45)
    assert (t.mem_used_b, t.temp_c, t.sm_clock_mhz) == (20480 * MiB, 61.0, 1410.0)
    assert t.proc_mem_b == 1000 * MiB  # only pid 77 is ours
    assert t.throttle_s["power"] == 2.0 and t.throttle_s["thermal"] == 0.0
    assert u.energy_j is None and u.power_w is None and u.proc_mem_b == 0  # [N/A] power: absent, not 0
    assert u.throttle_s["low_util"] == 2.0


def test_older_driver_field_sets_and_visibility() -> None:
    runner = Runner(query=T4, reject=("clocks_event_reasons.active", "mig.mode.current"))
    col = NvidiaSmiCollector("0", run=runner)
    assert runner.calls[-1][1] == "--query-gpu=" + ",".join(BASE_FIELDS)
    (d,) = col.devices()
    assert (d.uuid, d.power_limit_w, d.mig_mode) == ("GPU-t4", None, None)
    col.read(set(), 0.0)
    (t,) = col.read(set(), 1.0).ticks
    assert t.throttle_s is None and t.energy_j is None and t.proc_mem_b is None
    assert NvidiaSmiCollector("1", run=Runner(query=T4)).devices() == []


def test_failures_never_raise_from_read() -> None:
    with pytest.raises(CollectorUnavailable, match="nvidia-smi failed"):
        NvidiaSmiCollector(None, run=Runner(reject=("index",)))
    runner = Runner()
    col = NvidiaSmiCollector(None, run=runner)
    col.read(set(), 0.0)

    def hung(argv, timeout_s):
        raise TimeoutError("nvidia-smi did not answer in 2 s")

    col._run = hung
    events = col.read(set(), 1.0).events + col.read(set(), 2.0).events
    assert [e.kind for e in events] == ["sampler_error"]  # said once
    col._run = runner
    assert len(col.read(set(), 3.0).ticks) == 2
