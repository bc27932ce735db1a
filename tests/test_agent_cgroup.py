"""Host figures of containers from crafted cgroup v2 and v1 trees (node/cgroup_stats.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuledger.core.metering.cgroup_path import read_cgroup
from gpuledger.node.cgroup_stats import CgroupCollector, interval_peak, io_bytes_v1, io_bytes_v2, locate

CID = "d" * 64
V2_SCOPE = f"/system.slice/docker-{CID}.scope"
GiB = 2**30


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def v2_cgroup(root: Path, *, usage_usec: int, current: int, inactive: int, peak: int, rbytes: int, wbytes: int,
              pids: int = 7, procs: tuple[int, ...] = (11, 12)) -> Path:  # fmt: skip
    d = root / V2_SCOPE.lstrip("/")
    write(d / "cgroup.controllers", "cpu io memory pids\n")  # every v2 directory has it, no v1 one does
    write(d / "cpu.stat", f"usage_usec {usage_usec}\nuser_usec {usage_usec // 2}\nsystem_usec {usage_usec // 2}\n")
    write(d / "memory.current", f"{current}\n")
    write(d / "memory.peak", f"{peak}\n")
    write(d / "memory.stat", f"anon {current - inactive}\nfile {inactive}\ninactive_file {inactive}\nactive_file 0\n")
    write(d / "io.stat", f"8:0 rbytes={rbytes // 2} wbytes={wbytes} rios=3 wios=4 dbytes=0 dios=0\n"
                         f"259:0 rbytes={rbytes - rbytes // 2} wbytes=0 rios=1 wios=0 dbytes=0 dios=0\n")  # fmt: skip
    write(d / "pids.current", f"{pids}\n")
    write(d / "cgroup.procs", "".join(f"{p}\n" for p in procs))
    return d


def collector(root: Path, lines: list[str]) -> CgroupCollector:
    files = locate(str(root), read_cgroup(lines))
    assert files is not None
    return CgroupCollector(files)  # the host-wide counters are this machine's real ones


def test_v2_container_counters_become_interval_figures(tmp_path: Path) -> None:
    v2_cgroup(tmp_path, usage_usec=10_000_000, current=3 * GiB, inactive=GiB, peak=3 * GiB, rbytes=100, wbytes=50)
    c = collector(tmp_path, ["0::" + V2_SCOPE])
    assert c.files.cpu.version == 2 and c.files.missing == ()
    assert c.read(100.0) is None  # primes the counters: the run's figures start here
    v2_cgroup(tmp_path, usage_usec=14_500_000, current=5 * GiB, inactive=GiB, peak=6 * GiB, rbytes=4196, wbytes=1074)
    tick = c.read(102.0)
    assert tick is not None and (tick.t0, tick.t1) == (100.0, 102.0)
    assert tick.cpu_s == pytest.approx(4.5)  # 4.5 CPU-seconds in 2 s: over two cores busy
    assert (tick.read_b, tick.write_b) == (4096, 1024)  # summed over both devices
    assert tick.rss_b == 4 * GiB  # the working set: charged memory less the inactive file cache
    assert (tick.threads, tick.procs) == (7, 2)
    assert tick.sys_t0 is None  # host-wide counters only at a reading that closes an interval
    # the lifetime peak rose during the interval: the closing reading reports it (less the cache)
    closing = c.read(104.0, closes_interval=True)
    assert closing is not None and closing.rss_b == 5 * GiB
    assert closing.sys_t0 == 100.0 and closing.sys_mem_used_b is not None  # over the whole interval
    v2_cgroup(tmp_path, usage_usec=15_000_000, current=2 * GiB, inactive=0, peak=6 * GiB, rbytes=4196, wbytes=1074,
              procs=(11,))  # fmt: skip
    later = c.read(106.0, closes_interval=True)
    assert later is not None and later.rss_b == 2 * GiB and later.procs == 1  # the peak did not rise again


def test_v1_container_counters(tmp_path: Path) -> None:
    scope = f"/docker/{CID}"
    write(tmp_path / "cpu,cpuacct" / scope.lstrip("/") / "cpuacct.usage", "2000000000\n")
    write(tmp_path / "cpu,cpuacct" / scope.lstrip("/") / "cgroup.procs", "5\n6\n7\n")
    mem = tmp_path / "memory" / scope.lstrip("/")
    write(mem / "memory.usage_in_bytes", f"{2 * GiB}\n")
    write(mem / "memory.max_usage_in_bytes", f"{2 * GiB}\n")
    write(mem / "memory.stat", f"cache 100\ntotal_inactive_file {GiB // 2}\n")
    blk = tmp_path / "blkio" / scope.lstrip("/")
    write(blk / "blkio.throttle.io_service_bytes_recursive", "8:0 Read 100\n8:0 Write 10\n8:0 Total 110\nTotal 110\n")
    write(tmp_path / "pids" / scope.lstrip("/") / "pids.current", "9\n")
    lines = [f"12:memory:{scope}", f"4:cpu,cpuacct:{scope}", f"7:blkio:{scope}", f"3:pids:{scope}"]
    c = collector(tmp_path, lines)
    assert c.files.cpu.version == 1 and c.files.memory is not None
    assert c.read(10.0) is None
    write(tmp_path / "cpu,cpuacct" / scope.lstrip("/") / "cpuacct.usage", "3500000000\n")
    write(blk / "blkio.throttle.io_service_bytes_recursive", "8:0 Read 600\n8:0 Write 30\n8:0 Total 630\n")
    tick = c.read(11.0, closes_interval=True)
    assert tick is not None and tick.cpu_s == pytest.approx(1.5)
    assert (tick.read_b, tick.write_b, tick.rss_b, tick.threads, tick.procs) == (500, 20, GiB + GiB // 2, 9, 3)


def test_a_removed_cgroup_reads_as_no_further_use(tmp_path: Path) -> None:
    d = v2_cgroup(tmp_path, usage_usec=1_000_000, current=GiB, inactive=0, peak=GiB, rbytes=0, wbytes=0)
    c = collector(tmp_path, ["0::" + V2_SCOPE])
    c.read(1.0)
    for f in d.iterdir():
        f.unlink()
    tick = c.read(2.0, closes_interval=True)
    assert tick is not None and (tick.cpu_s, tick.rss_b, tick.read_b) == (0.0, 0, 0) and c.gone


def test_where_a_cgroup_cannot_be_read(tmp_path: Path) -> None:
    v2_cgroup(tmp_path, usage_usec=1, current=1, inactive=0, peak=1, rbytes=0, wbytes=0)
    assert locate(str(tmp_path), read_cgroup(["0::/../.." + V2_SCOPE])) is None  # outside our cgroup namespace
    assert locate(str(tmp_path), read_cgroup(["0::/user.slice/session-1.scope"])) is None  # no container
    assert locate(str(tmp_path / "elsewhere"), read_cgroup(["0::" + V2_SCOPE])) is None  # not mounted there
    # a hybrid host mounts the unified hierarchy under unified/
    hybrid = tmp_path / "hybrid"
    v2_cgroup(hybrid / "unified", usage_usec=1, current=1, inactive=0, peak=1, rbytes=0, wbytes=0)
    files = locate(str(hybrid), read_cgroup(["0::" + V2_SCOPE]))
    assert files is not None and files.cpu.path.startswith(str(hybrid / "unified"))


def test_io_stat_parsers() -> None:
    assert io_bytes_v2("8:0 rbytes=10 wbytes=20 rios=1\n8:16 rbytes=5 wbytes=0\n") == (15, 20)
    assert io_bytes_v2("") == (0, 0)
    assert io_bytes_v1("8:0 Read 7\n8:0 Write 3\n8:0 Sync 10\n8:16 Read 1\nTotal 11\n") == (8, 3)


@given(st.lists(st.integers(0, 2**40), min_size=1, max_size=20), st.integers(0, 2**40), st.integers(0, 2**40),
       st.integers(0, 2**30))  # fmt: skip
def test_interval_peak_is_never_below_the_samples_and_only_uses_a_risen_peak(samples, before, now, inactive) -> None:
    top = max(samples)
    got = interval_peak(top, now, before, inactive)
    assert got >= top
    if now <= before:
        assert got == top
    else:
        assert got == max(top, now - inactive)


def test_a_path_outside_the_agents_cgroup_namespace_is_placed_in_the_host_hierarchy(tmp_path: Path) -> None:
    # The DaemonSet: the agent's container has its own cgroup namespace ("0::/" for itself), the
    # host's hierarchy is mounted at the cgroup root, and a pod's process reads "0::/../../<pod>/...".
    from gpuledger.node import cgroup_stats

    agent_pod = "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod9f3c.slice"
    agent_dir = tmp_path / agent_pod / "cri-containerd-agent.scope"
    write(agent_dir / "cgroup.procs", "1\n4242\n")  # the agent's pid, as the host sees it (hostPID)
    proc = tmp_path / "proc"
    write(proc / "4242" / "cgroup", "0::/\n")
    cgroup_stats._NS_ROOTS.clear()
    root = cgroup_stats.namespace_root(str(tmp_path), pid=4242, proc=str(proc))
    assert root == "/" + agent_pod + "/cri-containerd-agent.scope"
    v2_cgroup(tmp_path, usage_usec=5_000_000, current=GiB, inactive=0, peak=GiB, rbytes=0, wbytes=0)
    climbed = "0::/../../../.." + V2_SCOPE  # from the agent's namespace root up to the host's, then down
    files = locate(str(tmp_path), read_cgroup([climbed]))
    assert files is not None and files.cpu.path == str(tmp_path) + V2_SCOPE
    cgroup_stats._NS_ROOTS.clear()
    assert locate(str(tmp_path / "nowhere"), read_cgroup([climbed])) is None  # cannot be placed: /proc instead
