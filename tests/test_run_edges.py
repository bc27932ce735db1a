"""A run's edges (issue 34): the whole allocation, from CMD's launch to its exit, lies in intervals.

The first interval starts at a reading taken just before ``gpuledger run`` launches CMD (the energy
counter, the utilisation sample cursor), the last ends at the reading taken when CMD is reaped, and
that reading classifies the time after the newest utilisation sample (docs/METERING.md, "A run's
edges"). So on a GPU that is busy 78 % of the time at 500 W the summary says 78 % and the energy is
500 W over the run, however short the run; and the summary, the interval export, the bill and the
team server all add up to the same allocated seconds.

The end-to-end tests run the real CLI on a replayed GPU (the scripted NVML that the collector reads
as it reads a real one); their expectations come from the trace file alone. The property tests
drive the same collector over the scripted NVML on a manual clock.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import math
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from e2e_helpers import GPULEDGER, cli_env, run_cli, show_json
from gpuledger.collect.fake_nvml import FakeGpu, FakeNvml, TracePoint
from gpuledger.collect.nvml import NvmlCollector
from gpuledger.core.metering.busy import CARRY_MAX_S, unmeasured_seconds
from gpuledger.core.model import GpuInterval, HostInterval, HostTick
from gpuledger.recorder.edge import Edge
from gpuledger.recorder.recorder import Recorder
from gpuledger.store import Ledger
from server_support import ServerProcess, backend_url, setup_accounts

UUID = "GPU-3f0c2a55-78aa-4d1e-9b6c-0e4d7a2c5b10"
UTIL_PCT, POWER_W = 78, 500.0
# A constant GPU, as an H200 reports it (a utilisation sample every 0.2 s, a 1 s average for
# nvmlDeviceGetPowerUsage). Its energy counter moves continuously here: a stepped counter (0.1 s
# on an H200) is exact only to a step at each end, the hardware's resolution, not ours.
TRACE = [
    {"format": "gpuledger-gpu-trace", "version": 1,
     "gpus": [{"uuid": UUID, "name": "NVIDIA H200", "power_limit_w": 700.0, "energy_update_s": 0}]},
    {"t": 0, "gpu": 0, "util_pct": UTIL_PCT, "power_w": POWER_W, "mem_used_b": 2 * 2**30, "temp_c": 55},
]  # fmt: skip
# The command notes when it really ran, on the wall clock, so the run can be checked to cover it.
CMD = textwrap.dedent(
    """
    import json, sys, time
    began = time.time()
    time.sleep(4)
    json.dump([began, time.time()], open(sys.argv[1], "w"))
    """
)
CLOCKS_S = 0.005  # the recorder's clock and the wall clock agree to within this over a few seconds
UH_S = 0.0036  # the bill states GPU-hours to the micro-hour


def _write_trace(path: Path) -> tuple[float, float]:
    """The trace file, and the utilisation and power it scripts (what the test expects)."""
    path.write_text("".join(json.dumps(line) + "\n" for line in TRACE))
    points = [json.loads(line) for line in path.read_text().splitlines()[1:]]
    assert len({(p["util_pct"], p["power_w"]) for p in points}) == 1  # constant: the integral is a product
    return points[0]["util_pct"] / 100, points[0]["power_w"]


def _csv_rows(text: str, series: str) -> list[dict[str, str]]:
    rows = [r for r in csv.DictReader(io.StringIO(text)) if r["series"] == series]
    return sorted(rows, key=lambda r: int(r["seq"]))


def _assert_tiles(spans: list[tuple[float, float]], start: float, end: float) -> None:
    """Intervals that follow each other without gap or overlap from ``start`` to ``end``."""
    assert spans, "no interval"
    assert spans[0][0] == pytest.approx(start, abs=1e-6)
    assert spans[-1][1] == pytest.approx(end, abs=1e-6)
    for (_, t1), (t0, _) in itertools.pairwise(spans):
        assert t0 == pytest.approx(t1, abs=1e-6)


@pytest.mark.slow
def test_a_short_run_on_a_constant_gpu_counts_its_whole_allocation(tmp_path: Path) -> None:
    util, power = _write_trace(tmp_path / "gpu.jsonl")
    env = cli_env(tmp_path / "home", f"sqlite:///{tmp_path}/ledger.db")
    ran = tmp_path / "ran.json"
    out = run_cli(["run", "--interval", "1", "--replay-gpus", str(tmp_path / "gpu.jsonl"), "-q", "--",
                   sys.executable, "-c", CMD, str(ran)], env)  # fmt: skip
    assert out.returncode == 0, out.stderr.decode()
    began, finished = json.loads(ran.read_text())
    s = show_json(_newest(env), env)
    start, end = s["started_at_epoch"], s["ended_at_epoch"]
    # The run holds the GPU from the launch (before the command's first instruction) to its exit.
    assert start <= began + CLOCKS_S and end >= finished - CLOCKS_S
    assert end - start < (finished - began) + 30  # and not for long beside it, even on a loaded machine
    allocated = s["gpus"][0]["allocated_seconds"]
    assert allocated == pytest.approx(end - start, abs=1e-6) == pytest.approx(s["wall_seconds"], abs=1e-6)

    # What the trace scripts, over [launch, exit]: busy 78 % of it, 500 W all along.
    assert s["mean_utilization"] == pytest.approx(util, abs=0.005)  # the issue saw 71 % on such a run
    gpu = s["gpus"][0]
    assert gpu["busy_seconds"] == pytest.approx(util * allocated, abs=0.005 * allocated)
    assert gpu["energy_joules"] == pytest.approx(power * allocated, rel=0.005)
    assert gpu["unmeasured_seconds"] == 0.0  # the instant reading measured the last samples' tail

    # The interval export covers exactly that span, GPU and host alike.
    text = run_cli(["export", "--format", "csv"], env).stdout.decode()
    for series in ("gpu", "host"):
        rows = _csv_rows(text, series)
        _assert_tiles([(float(r["t0"]), float(r["t1"])) for r in rows], start, end)
        assert math.fsum(float(r["t1"]) - float(r["t0"]) for r in rows) == pytest.approx(allocated, abs=1e-6)
    gpu_rows = _csv_rows(text, "gpu")
    assert math.fsum(float(r["busy_s"]) for r in gpu_rows) == pytest.approx(gpu["busy_seconds"], abs=1e-6)
    assert math.fsum(float(r["energy_j"]) for r in gpu_rows) == pytest.approx(gpu["energy_joules"], abs=1e-6)

    # The bill prices the same GPU-seconds (a replayed run is priced, though never billed).
    cost = json.loads(run_cli(["cost", "--json"], env).stdout)
    (line,) = cost["runs"][0]["gpus"]
    assert line["allocated_gpu_h"] * 3600 == pytest.approx(allocated, abs=UH_S)
    assert line["busy_gpu_h"] * 3600 == pytest.approx(gpu["busy_seconds"], abs=UH_S)
    assert line["unmeasured_gpu_h"] == 0.0


def _newest(env: dict[str, str]) -> str:
    shown = run_cli(["runs", "--json"], env)
    assert shown.returncode == 0, shown.stderr.decode()
    (run,) = json.loads(shown.stdout)
    return run["id"]


WAITS_THEN_GROWS = textwrap.dedent(
    """
    import os, sys, time
    while not os.path.exists(sys.argv[1]):
        time.sleep(0.02)
    block = bytearray(150 * 2**20)
    """
)


@pytest.mark.slow
def test_a_command_seen_small_keeps_the_peak_it_reached_just_before_it_ended(tmp_path: Path) -> None:
    # With the recorder started sooner after the launch, a reading may see a short command small
    # and miss the peak it reaches just before it ends. Its wait4 ru_maxrss is that peak when it is
    # above gpuledger's own memory's high-water mark, even when gpuledger's own ru_maxrss is far
    # larger: it counts the image gpuledger was started from, its parent's (here 400 MiB, as a long
    # test session or a launcher holding a dataset in memory has).
    ballast = bytearray(400 * 2**20)  # resident: bytearray writes its zeros
    env = cli_env(tmp_path / "home", f"sqlite:///{tmp_path}/ledger.db")
    go = tmp_path / "go"
    proc = subprocess.Popen(
        [*GPULEDGER, "run", "--interval", "0.5", "-q", "--", sys.executable, "-c", WAITS_THEN_GROWS, str(go)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not _peak_so_far(env):  # a written reading has seen the command, waiting and small
            assert time.monotonic() < deadline, "no reading of the command was written"
            time.sleep(0.1)
    finally:
        go.touch()
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode()
    assert 150 * 2**20 <= show_json(_newest(env), env)["peak_rss_bytes"] <= 250 * 2**20
    del ballast


def _peak_so_far(env: dict[str, str]) -> int:
    listed = run_cli(["runs", "--json"], env)
    rows = json.loads(listed.stdout) if listed.returncode == 0 else []
    if len(rows) != 1:
        return 0
    shown = run_cli(["show", rows[0]["id"], "--json"], env)
    return (json.loads(shown.stdout).get("peak_rss_bytes") or 0) if shown.returncode == 0 else 0


def _rows(url: str, run_id: str) -> dict[str, Any]:
    with Ledger(url) as led:
        run = led.get_run(run_id)
        return {
            "span": (run.started_at, run.ended_at, run.status),
            "gpu": sorted((i.seq, i.t0, i.t1, i.busy_s, i.energy_j) for i in led.gpu_intervals(run_id)),
            "host": sorted((i.seq, i.t0, i.t1, i.cpu_s) for i in led.host_intervals(run_id)),
        }


@pytest.mark.slow
def test_the_team_server_gets_the_same_edges(tmp_path: Path) -> None:
    _write_trace(tmp_path / "gpu.jsonl")
    home = tmp_path / "home"
    local_url = f"sqlite:///{home}/ledger.db"
    with backend_url("sqlite", tmp_path) as url:
        tokens = setup_accounts(url)
        with ServerProcess(url, log=tmp_path / "server.log") as server:
            env = cli_env(home, local_url, GPULEDGER_TOKEN=tokens.agent_a)
            out = run_cli(["run", "--server", server.url, "--project", "A", "--interval", "1", "--replay-gpus",
                           str(tmp_path / "gpu.jsonl"), "-q", "--", sys.executable, "-c", "import time; time.sleep(2)"],
                          env)  # fmt: skip
            assert out.returncode == 0, out.stderr.decode()
            with Ledger(local_url) as led:
                run_id = led.list_runs()[0].id
            mine = _rows(local_url, run_id)
            deadline = time.monotonic() + 120  # the pusher hands the last batches over as the run ends
            while (theirs := _rows(url, run_id) if _server_has(url, run_id) else None) != mine:
                assert time.monotonic() < deadline, f"the server holds {theirs}, the run {mine}"
                time.sleep(0.2)
    start, end, status = theirs["span"]
    assert status == "succeeded"
    for key in ("gpu", "host"):
        _assert_tiles([(t0, t1) for _, t0, t1, *_ in theirs[key]], start, end)


def _server_has(url: str, run_id: str) -> bool:
    with Ledger(url) as led:
        return any(r.id == run_id for r in led.list_runs())


# -- the edge arithmetic, on a manual clock ---------------------------------------------------


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class Host:
    """A host collector whose readings say only when they were taken."""

    def __init__(self) -> None:
        self.last: float | None = None

    def read(self, now: float, closes_interval: bool = False) -> HostTick | None:
        last, self.last = self.last, now
        if last is None:
            return None
        return HostTick(last, now, cpu_s=0.0, rss_b=0, read_b=0, write_b=0, threads=0, procs=0)

    def pids(self) -> set[int]:
        return set()

    def close(self) -> None:
        pass


class Sink:
    def __init__(self) -> None:
        self.gpu: list[GpuInterval] = []
        self.host: list[HostInterval] = []

    def __call__(self, gpu, host, events, metrics) -> None:
        self.gpu += gpu
        self.host += host


def _record(
    util_pct: int, power_w: float, period_s: float, phase_s: float, sampling: str, gaps: list[float],
    launch_s: float, interval_s: float, instant: bool,
) -> tuple[float, float, Sink]:  # fmt: skip
    """A run on a constant scripted GPU: collectors read just before the launch (``Edge``), then the
    recorder's readings ``gaps`` apart, the last one ``stop``'s. Returns (start, end, what was written)."""
    clock = Clock(1_000_000.0)
    gpu = FakeGpu(
        UUID, name="NVIDIA A100-SXM4-80GB", points=[TracePoint(0.0, util_pct=util_pct, power_w=power_w)],
        sample_period_s=period_s, sample_phase_s=phase_s, idle_sampling=sampling, energy_update_s=0.0,
        power_average_s=0.0, unsupported=frozenset() if instant else frozenset({"nvmlDeviceGetUtilizationRates"}),
    )  # fmt: skip
    fake = FakeNvml([gpu], clock=clock, start=clock.t)
    clock.t += launch_s
    edge = Edge(clock, Host(), NvmlCollector(nvml=fake, clock=clock), None)
    primed = edge.read()
    sink = Sink()
    rec = Recorder(sink, host=edge.host, gpu=edge.gpu, interval_s=interval_s, clock=clock, primed_at=primed.t)
    for gap in gaps[:-1]:
        clock.t += gap
        rec.step()
    clock.t += gaps[-1]
    rec.stop()
    return primed.t, clock.t, sink


edge_runs = dict(
    util_pct=st.integers(0, 100),
    power_w=st.floats(20.0, 700.0),
    period_s=st.sampled_from([1 / 6, 0.2, 0.5, 1.0]),
    phase_s=st.floats(0.0, 0.99),
    sampling=st.sampled_from(["grid", "slow", "stop"]),
    gaps=st.lists(st.floats(0.05, 2.0), min_size=1, max_size=12),
    # The GPU ran before the run began (another job, a warm-up): none of that is the run's. Long enough
    # for the buffer to show the sample period (until it is learned, docs/METERING.md says what
    # the first busy samples of a run may lack: a limitation of the samples, not of the edges).
    launch_s=st.floats(2.5, 6.0),
    interval_s=st.sampled_from([0.5, 1.0, 2.0, 5.0]),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**edge_runs)
def test_intervals_cover_the_run_from_the_first_reading_to_the_last(**run: Any) -> None:
    start, end, sink = _record(**run, instant=True)
    _assert_tiles([(i.t0, i.t1) for i in sorted(sink.gpu, key=lambda i: i.seq)], start, end)
    _assert_tiles([(i.t0, i.t1) for i in sorted(sink.host, key=lambda i: i.seq)], start, end)
    held = end - start
    # Every second of [start, end] is counted once: busy at the scripted percentage (the time after
    # the newest sample by the instant reading), energy at the scripted power (mJ steps).
    assert math.fsum(i.busy_s for i in sink.gpu) == pytest.approx(run["util_pct"] / 100 * held, abs=1e-6)
    assert math.fsum(i.energy_j for i in sink.gpu) == pytest.approx(run["power_w"] * held, abs=2e-3)
    assert math.fsum(unmeasured_seconds(i) for i in sink.gpu) == 0.0


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**edge_runs)
def test_without_an_instant_reading_the_edge_is_unmeasured_never_idle(**run: Any) -> None:
    start, end, sink = _record(**run, instant=False)
    held = end - start
    unmeasured = math.fsum(unmeasured_seconds(i) for i in sink.gpu)
    busy = math.fsum(i.busy_s for i in sink.gpu)
    idle = math.fsum(i.util_idle_s or 0.0 for i in sink.gpu)
    # At most the time after the newest sample is left unmeasured: a period on a busy GPU, a second on
    # an idle one (the driver may sample it once a second); the rest is busy at the scripted
    # percentage, and time the driver did not sample is idle only on an idle GPU.
    assert 0.0 <= unmeasured <= (run["period_s"] * 1.1 if run["util_pct"] else CARRY_MAX_S) + 1e-9
    assert busy == pytest.approx(run["util_pct"] / 100 * (held - unmeasured), abs=1e-6)
    if run["util_pct"]:
        assert idle == pytest.approx(0.0, abs=1e-9)
