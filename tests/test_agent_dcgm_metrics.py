"""The agent's dcgm-exporter names on its real /metrics server, read the way Prometheus reads them.

A scripted NVML (a whole GPU, and a GPU in MIG mode with two slices) is read by the real NVML
collector; its ticks feed NodeMetrics as the agent's loop does; /metrics is fetched over HTTP and
parsed with prometheus_client's text parser (and, when installed, checked by the real promtool).
What is expected is dcgm-exporter 4.8's exposition: labels ``gpu``, ``UUID``, ``pci_bus_id``,
``device``, ``modelName``, ``GPU_I_PROFILE``/``GPU_I_ID`` on MIG slices, ``hostname`` (lower case
since dcgm-exporter pull request #655), the driver version; ``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION``
a counter of the device's mJ since the driver loaded (NVML's counter, as DCGM reads it).
"""

from __future__ import annotations

import shutil
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ci_support import missing
from gpuledger.collect.fake_nvml import FakeGpu, FakeNvml, TracePoint
from gpuledger.collect.nvml import NvmlCollector
from gpuledger.node.metrics import NodeMetrics, OwnerLabels, serve

WHOLE = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
PARENT = "GPU-bbbbbbbb-0000-0000-0000-000000000000"
SLICES = ("MIG-cccccccc-0000-0000-0000-000000000000", "MIG-dddddddd-0000-0000-0000-000000000000")
OFFSET_MJ = 7_000_000_000  # the counter had counted 7 MJ before the agent started: "since boot"
ENERGY = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
T0 = 1_800_000_000.0


class Clock:
    def __init__(self) -> None:
        self.t = T0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def scraped() -> Iterator[tuple[str, dict[str, str], FakeNvml, Clock]]:
    """(body, response headers, the scripted NVML, its clock) after 10 readings of 2 s."""
    clock = Clock()
    busy = [TracePoint(0.0, util_pct=50, mem_used_b=2**30, power_w=200, temp_c=55, procs={})]
    gpus = [
        FakeGpu(WHOLE, profile="ideal", points=busy, pci_bus_id="00000000:8D:00.0", energy_offset_mj=OFFSET_MJ),
        FakeGpu(PARENT, profile="ideal", pci_bus_id="00000000:91:00.0", points=busy, mig=[
            FakeGpu(SLICES[0], mig_profile="3g.40gb", gpu_instance_id=2, points=busy),
            FakeGpu(SLICES[1], mig_profile="1g.10gb", gpu_instance_id=13, points=busy),
        ]),
    ]  # fmt: skip
    fake = FakeNvml(gpus, clock=clock, start=clock.t)
    collector = NvmlCollector(nvml=fake, clock=clock, all_processes=True)
    metrics = NodeMetrics("gpu-node-7", dcgm_names=True, clock=clock)
    job = OwnerLabels(run_id="r1", slurm_job="4242")
    for i in range(10):
        clock.t += 2.0
        read = collector.read(set(), clock.t, closes_interval=(i % 5 == 4))
        ticks = {t.uuid: t for t in read.ticks}
        for ident in collector.devices():
            metrics.observe(ident, ticks.get(ident.uuid), [(job, None)] if ident.uuid == WHOLE else [])
    server, _thread = serve(metrics, 0, "127.0.0.1")
    try:
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        request = urllib.request.Request(url, headers={"Accept": "application/openmetrics-text;version=1.0.0"})
        with urllib.request.urlopen(request, timeout=30) as resp:
            yield resp.read().decode(), dict(resp.headers), fake, clock
    finally:
        server.shutdown()
        server.server_close()
        collector.close()


def samples(body: str, name: str) -> list:
    return [s for f in text_string_to_metric_families(body) if f.name == name for s in f.samples]


def test_the_exposition_is_prometheus_text_whatever_the_scraper_asks(scraped) -> None:
    body, headers, _, _ = scraped
    assert headers["Content-Type"].startswith("text/plain; version=0.0.4")  # as dcgm-exporter answers
    assert f"# TYPE {ENERGY} counter\n" in body and f"# TYPE {ENERGY}_total" not in body


def test_energy_is_the_devices_counter_since_the_driver_loaded(scraped) -> None:
    body, _, fake, _ = scraped
    [family] = [f for f in text_string_to_metric_families(body) if f.name == ENERGY]
    assert family.type == "counter"
    [sample] = family.samples  # the whole GPU only: a MIG slice has no counter of its own
    assert sample.labels["UUID"] == WHOLE
    # on the wire under its exact name (the parser itself names a counter's sample <name>_total)
    assert [ln.split("{")[0] for ln in body.splitlines() if ln.startswith(ENERGY)] == [ENERGY]
    # the counter as NVML last answered it at the interval's end (t0 + 20 s), offset included
    handle = fake.nvmlDeviceGetHandleByUUID(WHOLE)
    assert sample.value == fake.nvmlDeviceGetTotalEnergyConsumption(handle)
    assert OFFSET_MJ + 20 * 200 * 1000 * 0.99 < sample.value <= OFFSET_MJ + 20 * 200 * 1000 * 1.01  # 200 W x 20 s


def test_whole_gpu_labels_follow_dcgm_exporter_4_8(scraped) -> None:
    body, _, _, _ = scraped
    [s] = [s for s in samples(body, "DCGM_FI_DEV_FB_USED") if s.labels["UUID"] == WHOLE]
    assert set(s.labels) == {"gpu", "UUID", "pci_bus_id", "device", "modelName", "hostname",
                             "DCGM_FI_DRIVER_VERSION", "container", "namespace", "pod", "hpc_job"}  # fmt: skip
    assert s.labels["gpu"] == "0" and s.labels["pci_bus_id"] == "00000000:8D:00.0" and s.labels["device"] == "nvidia0"
    assert s.labels["hostname"] == "gpu-node-7" and "Hostname" not in s.labels
    assert s.labels["hpc_job"] == "4242"  # the Slurm job, as --hpc-job-mapping-dir would label it
    assert s.value == 1024.0  # MiB


def test_mig_slices_carry_their_parent_and_their_gpu_instance(scraped) -> None:
    body, _, _, _ = scraped
    # (NVML gives a slice no utilisation: memory is the figure a slice has)
    mig = [s.labels for s in samples(body, "DCGM_FI_DEV_FB_USED") if "GPU_I_ID" in s.labels]
    assert sorted((m["GPU_I_PROFILE"], m["GPU_I_ID"]) for m in mig) == [("1g.10gb", "13"), ("3g.40gb", "2")]
    for m in mig:  # dcgm-exporter names a slice by its physical GPU
        assert m["gpu"] == "1" and m["UUID"] == PARENT and m["pci_bus_id"] == "00000000:91:00.0"
        assert m["device"] == "nvidia1" and m["modelName"] == "NVIDIA A100-SXM4-80GB"
    whole = [s.labels for s in samples(body, "DCGM_FI_DEV_FB_USED") if s.labels["UUID"] == WHOLE]
    assert whole and all("GPU_I_PROFILE" not in w and "GPU_I_ID" not in w for w in whole)


def test_promtool_reads_the_exposition(scraped, tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        missing("promtool", "apt-get install prometheus")
    body = scraped[0]
    done = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True, text=True, timeout=60)
    # promtool parses it; its only remarks are the lint's naming advice, which dcgm-exporter's own
    # names draw too (upper case, a counter without _total)
    assert done.returncode in (0, 3), done.stdout + done.stderr  # 3: lint remarks only; 1: unparsable
    problems = [ln for ln in (done.stdout + done.stderr).splitlines() if ln.strip()]
    assert all(ENERGY in ln or "DCGM_FI_" in ln for ln in problems), problems
    assert "error" not in (done.stdout + done.stderr).lower()
