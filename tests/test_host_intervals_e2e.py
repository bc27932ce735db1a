"""A real CPU YOLO training wrapped by ``gpuledger run``: every stored host interval is physically possible.

Epoch boundaries cut intervals (two cuts per boundary: ``epoch_end`` then ``epoch_start``, often
handled back to back), so this is where a host-wide counter delta read at one moment could land in an
interval that did not contain it: a sub-millisecond interval carrying seconds of disk writes and
iowait would show rates no machine reaches. Each interval is checked against what this machine can
do over that interval's own span, at the default interval (5 s: host-wide counters read at interval
ends and cuts only) and at 1 s (a regular close every tick, so cuts land right after closes).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from ci_support import need_module
from gpuledger.core.model import HostInterval, RunRecord
from gpuledger.recorder.recorder import SLIVER_S
from gpuledger.store import Ledger
from test_yolo_training import COMMON, GPULEDGER, SRC, TIMEOUT_S, _yolo
from yolo_support import make_dataset, prepare_config_dir, yolo_env

need_module("ultralytics", "pip install -r requirements-test.txt")

pytestmark = pytest.mark.slow

EPOCHS = 6
CPUS = os.cpu_count() or 1
CLK_TCK = os.sysconf("SC_CLK_TCK")
# Every byte a disk or a NIC counts crosses the link the device sits on, and no single device has a
# wider one than PCIe 5.0 x16: about 63 GB/s each way. Memory-backed block devices (loop, ram, zram)
# move data at one CPU's memcpy speed, slower still. So the host-wide rate is below 64 GB/s per
# counted device; the wrongly placed deltas this guards against were thousands of times above it.
LINK_B_PER_S = 64e9


def _counted_disks() -> int:
    """Whole disks (what /sys/block lists), as the host counters count them."""
    with open("/proc/diskstats") as fh:
        names = {line.split()[2] for line in fh if len(line.split()) >= 14}
    return sum(os.path.exists("/sys/block/" + name.replace("/", "!")) for name in names)


def _counted_nics() -> int:
    """Network interfaces other than loopback (traffic mirrors, ifb*, are not counted either)."""
    with open("/proc/net/dev") as fh:
        names = [line.split(":", 1)[0].strip() for line in fh.readlines()[2:]]
    return sum(name != "lo" and not name.startswith("ifb") for name in names)


def _train(root: Path, interval: str) -> tuple[RunRecord, list[HostInterval]]:
    config = prepare_config_dir(root / "config")
    data = make_dataset(root / "dataset", "detect")
    db = f"sqlite:///{root}/ledger.db"
    env = yolo_env(config)
    env.update(GPULEDGER_HOME=str(root / "home"), GPULEDGER_DB=db)
    env["PYTHONPATH"] = os.pathsep.join([SRC, *filter(None, [env.get("PYTHONPATH")])])
    env.pop("CUDA_VISIBLE_DEVICES", None)
    argv = [*GPULEDGER, "run", "--interval", interval, "--", _yolo(), "train", "model=yolov8n.yaml", f"data={data}",
            f"epochs={EPOCHS}", f"project={root / 'runs'}", "name=host", *COMMON]  # fmt: skip
    out = subprocess.run(argv, env=env, cwd=root, capture_output=True, timeout=TIMEOUT_S)
    assert out.returncode == 0, out.stderr.decode(errors="replace")[-4000:]
    with Ledger(db) as ledger:
        [run] = ledger.list_runs()
        return run, ledger.host_intervals(run.id)


@pytest.mark.skipif(not os.path.exists("/proc/diskstats"), reason="the device counts read Linux's /proc")
@pytest.mark.parametrize("interval", ["5", "1"])
def test_every_host_interval_is_within_what_the_machine_can_do(tmp_path: Path, interval: str) -> None:
    run, intervals = _train(tmp_path, interval)
    assert len(intervals) >= EPOCHS  # at least one interval per epoch: the boundaries cut them
    assert intervals[0].t0 >= run.started_at - 1.0
    disk_bound, net_bound = LINK_B_PER_S * max(1, _counted_disks()), LINK_B_PER_S * max(1, _counted_nics())
    problems = []
    for i, iv in enumerate(intervals):
        span = iv.t1 - iv.t0
        where = f"interval {iv.seq} [{iv.t0:.4f}, {iv.t1:.4f}] ({span * 1000:.2f} ms)"
        if i + 1 < len(intervals):
            if intervals[i + 1].t0 != iv.t1:
                problems.append(f"{where}: the next interval starts at {intervals[i + 1].t0:.4f}, not where it ends")
            if span < SLIVER_S:  # only the last one, closed at stop, may be that short
                problems.append(f"{where}: shorter than {SLIVER_S * 1000:g} ms")
        # /proc/stat sums all CPUs' nanoseconds and floors once to a clock tick: one tick of slack.
        if iv.iowait_s is not None and iv.iowait_s > CPUS * span + 1 / CLK_TCK:
            problems.append(f"{where}: iowait {iv.iowait_s:.3f} s is more than {CPUS} CPUs can wait")
        # /proc/<pid>/stat floors user and system time separately: under two clock ticks per process.
        tree_slack = 2 * (iv.procs_max + 1) / CLK_TCK
        if iv.cpu_s > CPUS * span + tree_slack:
            problems.append(f"{where}: the tree used {iv.cpu_s:.3f} CPU-s, more than {CPUS} CPUs give")
        if iv.sys_cpu_util_avg_pct is not None and not 0 <= iv.sys_cpu_util_avg_pct <= 100:
            problems.append(f"{where}: host CPU utilisation {iv.sys_cpu_util_avg_pct} %")
        for name, value, bound in (
            ("disk read", iv.disk_read_b, disk_bound),
            ("disk write", iv.disk_write_b, disk_bound),
            ("net rx", iv.net_rx_b, net_bound),
            ("net tx", iv.net_tx_b, net_bound),
        ):
            if value is not None and value > bound * span:
                problems.append(f"{where}: {name} {value / 1e6:.1f} MB is {value / span / 1e9:.0f} GB/s")
    assert not problems, "\n".join(problems)
    assert any(iv.iowait_s is not None for iv in intervals)  # the host-wide series were there to check
