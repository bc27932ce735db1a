"""Host figures from real cgroup layouts: a recorded v1 hybrid host, a v2 host after the kernel's
documentation, and this machine's own cgroups (node/cgroup_stats.py).

A hybrid host mounts an empty cgroup v2 tree at ``<root>/unified``; a container's directory there
has ``cpu.stat`` and ``cgroup.procs`` but no memory, I/O or pids files, which live in the v1
controllers. Taking the unified directory read memory, I/O and threads as 0.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ci_support import in_ci
from gpuledger.core.metering.cgroup_path import read_cgroup
from gpuledger.core.model import DISCOVERED
from gpuledger.node.cgroup_stats import CgroupCollector, CgroupFiles, Source, locate
from gpuledger.node.claims import Allocation, Claims, ContainerClaim
from gpuledger.store import Ledger
from test_agent_loop import GPU0, Node
from test_agent_procfacts import make_proc

DATA = Path(__file__).resolve().parent / "data" / "cgroup"
HYBRID, V2 = DATA / "hybrid-v1", DATA / "v2-docs"
MiB = 2**20


def fixture_lines(fixture: Path) -> list[str]:
    return (fixture / "proc-cgroup").read_text().splitlines()


def scope_of(fixture: Path) -> str:
    return next(line.split(":", 2)[2] for line in fixture_lines(fixture) if line.startswith("0::"))


def value(path: Path) -> int:
    return int(path.read_text().split()[0])


def stat(path: Path, key: str) -> int:
    return next(int(v) for k, v in (line.split() for line in path.read_text().splitlines()) if k == key)


# -- the recorded hybrid host --------------------------------------------------------------------


def test_a_hybrid_host_reads_memory_io_and_threads_from_its_v1_controllers() -> None:
    root, scope = HYBRID / "tree", scope_of(HYBRID)
    unified = root / "unified" / scope.lstrip("/")
    # the trap, as recorded: the unified directory looks like a cgroup v2 one but holds no counters
    assert (unified / "cpu.stat").is_file() and (unified / "cgroup.procs").is_file()
    assert not (unified / "memory.current").exists() and not (unified / "io.stat").exists()
    files = locate(str(root), read_cgroup(fixture_lines(HYBRID)))
    assert files is not None and files.missing == ()
    v1 = {name: Source(f"{root}/{name}{scope}", 1) for name in ("cpuacct", "memory", "blkio", "pids")}
    assert (files.cpu, files.memory, files.io, files.pids) == (v1["cpuacct"], v1["memory"], v1["blkio"], v1["pids"])
    c = CgroupCollector(files)
    assert c.read(1.0) is None
    tick = c.read(2.0, closes_interval=True)
    mem = root / "memory" / scope.lstrip("/")
    working = value(mem / "memory.usage_in_bytes") - stat(mem / "memory.stat", "total_inactive_file")
    assert tick is not None and tick.rss_b == working and working > 30 * MiB  # the child's 32 MiB, not 0
    assert (tick.threads, tick.procs) == (1, 1)  # pids.current and the cpuacct cgroup.procs
    assert (tick.read_b, tick.write_b) == (0, 0)  # blkio's real "Total 0": no change between the two readings
    assert c._peak_b() == value(mem / "memory.max_usage_in_bytes")


def test_a_v2_directory_without_memory_or_io_counters_is_not_read_as_zero(tmp_path: Path) -> None:
    # The hybrid host's unified tree on its own: what the old locate() took for the container.
    shutil.copytree(HYBRID / "tree" / "unified", tmp_path / "unified")
    files = locate(str(tmp_path), read_cgroup(fixture_lines(HYBRID)))
    assert files is not None and files.cpu.version == 2
    assert (files.memory, files.io, files.pids) == (None, None, None)
    assert files.missing == ("memory", "io")  # not available: the agent reads the process tree instead
    with pytest.raises(ValueError, match="no memory or io counter"):
        CgroupCollector(files)


# -- the v2 host, from the kernel's documentation ------------------------------------------------


def test_a_v2_host_reads_every_figure_from_the_one_directory() -> None:
    root, scope = V2 / "tree", scope_of(V2)
    files = locate(str(root), read_cgroup(fixture_lines(V2)))
    d = Source(f"{root}{scope}", 2)
    assert files == CgroupFiles(d, d, d, d)
    c = CgroupCollector(files)
    assert c.read(1.0) is None
    tick = c.read(2.0, closes_interval=True)
    assert tick is not None and tick.rss_b == 2 * 2**30  # 3 GiB charged less 1 GiB inactive file cache
    assert (tick.threads, tick.procs, tick.cpu_s) == (4, 2, 0.0)
    assert c._peak_b() == 4 * 2**30


def test_a_v2_host_without_the_pids_controller_counts_the_threads_it_lists(tmp_path: Path) -> None:
    shutil.copytree(V2 / "tree", tmp_path / "tree")
    d = tmp_path / "tree" / scope_of(V2).lstrip("/")
    for name in ("pids.current", "pids.max", "pids.events"):
        (d / name).unlink()
    files = locate(str(tmp_path / "tree"), read_cgroup(fixture_lines(V2)))
    assert files is not None and files.pids is None and files.missing == ()
    c = CgroupCollector(files)
    c.read(1.0)
    tick = c.read(2.0)
    assert tick is not None and tick.threads == 4  # cgroup.threads, not the process count (2)


# -- a discovered run on the recorded hybrid host ------------------------------------------------


def test_a_discovered_container_run_on_a_hybrid_host_has_its_memory(tmp_path: Path, ledger_url: str) -> None:
    shutil.copytree(HYBRID / "tree", tmp_path / "cgroup")
    lines = "\n".join(fixture_lines(HYBRID))
    cid = scope_of(HYBRID).rsplit("/", 1)[1]
    make_proc(tmp_path / "proc", 300, "python", uid=0, cgroup=lines, cmdline=["python", "train.py"], pgid=300,
              start=1000)  # fmt: skip
    claims = Claims(containers={cid: ContainerClaim(cid, name="hybrid-train")},
                    allocations=[Allocation(GPU0, "container", cid)])  # fmt: skip
    node = Node(tmp_path, ledger_url, claims, procs={300: (2**30, 40.0)})
    node.tick(8)
    node.stop()
    mem = tmp_path / "cgroup" / "memory" / scope_of(HYBRID).lstrip("/")
    working = value(mem / "memory.usage_in_bytes") - stat(mem / "memory.stat", "total_inactive_file")
    with Ledger(ledger_url) as led:
        [run] = led.list_runs()
        assert run.status == DISCOVERED and run.meta["node"]["host_figures"] == "cgroup"
        host = led.host_intervals(run.id)
        assert host and max(h.rss_max_b for h in host) == working  # was 0 B: the empty unified dir was read
        assert max(h.threads_max for h in host) == 1


def test_a_container_whose_cgroup_has_no_memory_counter_is_measured_from_its_processes(
    tmp_path: Path, ledger_url: str
) -> None:
    # Only the hybrid host's unified tree: cpu.stat and cgroup.procs, no memory or I/O files.
    shutil.copytree(HYBRID / "tree" / "unified", tmp_path / "cgroup" / "unified")
    cid = scope_of(HYBRID).rsplit("/", 1)[1]
    make_proc(tmp_path / "proc", 300, "python", uid=0, cgroup="\n".join(fixture_lines(HYBRID)),
              cmdline=["python", "train.py"], pgid=300, start=1000)  # fmt: skip
    claims = Claims(containers={cid: ContainerClaim(cid, name="hybrid-train")},
                    allocations=[Allocation(GPU0, "container", cid)])  # fmt: skip
    node = Node(tmp_path, ledger_url, claims, procs={300: (2**30, 40.0)})
    node.tick(4)
    node.stop()
    with Ledger(ledger_url) as led:
        [run] = led.list_runs()
        assert run.meta["node"]["host_figures"] != "cgroup"  # never the cgroup's 0 B
        notes = [e.message for e in led.events(run.id, kind="note")]
        assert any("has no memory or io counter" in n and "process tree" in n for n in notes), notes


# -- this machine's real cgroups -----------------------------------------------------------------

CGROUP = "/sys/fs/cgroup"
CONTROLLERS = ("memory", "cpuacct", "blkio", "pids")


def _mounts() -> dict[str, tuple[str, str]]:
    with open("/proc/self/mounts", encoding="utf-8") as fh:
        return {point: (fstype, opts) for _dev, point, fstype, opts, *_ in (line.split() for line in fh)}


def _hybrid_host() -> bool:
    m = _mounts()
    unified = m.get(f"{CGROUP}/unified", ("", ""))[0] == "cgroup2"
    return unified and all(m.get(f"{CGROUP}/{c}", ("", ""))[0] == "cgroup" for c in CONTROLLERS)


@pytest.fixture
def real_cgroup() -> Iterator[tuple[subprocess.Popen[str], str]]:
    """A child process in a fresh cgroup of its own in each v1 controller and in the unified tree."""
    if not _hybrid_host():
        pytest.skip(f"not a cgroup v1 hybrid host (v1 controllers and cgroup2 at {CGROUP}/unified)")
    if os.geteuid() != 0:
        if in_ci():
            pytest.fail("this is a cgroup v1 hybrid host: CI must run this test as root to make a cgroup")
        pytest.skip("making a cgroup needs root, and CI is not set")
    scope = f"/gpuledger-test-{secrets.token_hex(4)}/{secrets.token_hex(32)}"
    dirs = [Path(f"{CGROUP}/{c}{scope}") for c in (*CONTROLLERS, "unified")]
    # allocates and touches 64 MiB and starts 3 threads once it is in the cgroups, then waits
    code = ("import sys, threading\nsys.stdin.readline()\nbuf = bytearray(64 << 20)\n"
            "for i in range(0, len(buf), 4096): buf[i] = 1\n"
            "ev = threading.Event()\nts = [threading.Thread(target=ev.wait) for _ in range(3)]\n"
            "[t.start() for t in ts]\nprint('ready', flush=True)\nsys.stdin.readline()\nev.set()\n")  # fmt: skip
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdin is not None and child.stdout is not None
    try:
        for d in dirs:
            d.mkdir(parents=True)
            (d / "cgroup.procs").write_text(str(child.pid))
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "ready"
        yield child, scope
    finally:
        child.kill()
        child.wait()
        deadline = time.monotonic() + 30
        for d in dirs:
            for p in (d, d.parent):
                while p.exists():
                    try:
                        p.rmdir()
                    except OSError:
                        if time.monotonic() > deadline:
                            raise
                        time.sleep(0.05)  # an emptied cgroup can be busy a moment after its last process


def test_this_hybrid_hosts_real_cgroup_gives_the_v1_figures(real_cgroup: tuple[subprocess.Popen[str], str]) -> None:
    child, scope = real_cgroup
    facts = read_cgroup(Path(f"/proc/{child.pid}/cgroup").read_text().splitlines())
    assert facts.scope == scope
    files = locate(CGROUP, facts)
    assert files is not None and files.missing == ()
    assert files.memory == Source(f"{CGROUP}/memory{scope}", 1) and files.io == Source(f"{CGROUP}/blkio{scope}", 1)
    assert files.cpu == Source(f"{CGROUP}/cpuacct{scope}", 1) and files.pids == Source(f"{CGROUP}/pids{scope}", 1)
    c = CgroupCollector(files)
    assert c.read(time.time()) is None
    tick = c.read(time.time() + 1, closes_interval=True)
    assert tick is not None
    assert tick.rss_b >= 64 * MiB  # the child's touched buffer, charged to the v1 memory cgroup
    assert (tick.threads, tick.procs) == (4, 1)  # main thread and three more; one process
    peak = c._peak_b()
    assert peak is not None and peak >= 64 * MiB
