"""The /proc fast path reads what psutil reads, on a real process tree (no mocks).

The tree's processes allocate memory, do storage I/O, burn CPU, start a grandchild that exits, then
block on a pipe: idle, so both readers see the same moment and every figure must agree (CPU to
the float's last bits, I/O bytes, threads, parents; memory within the kernel's per-CPU counter
slack, see RSS_SLACK_B). Then the cases a tick must survive:
a process that ends between two reads, and a process of another user whose io file is closed to us.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import psutil
import pytest

from gpuledger.collect.host import ProcessTreeCollector
from gpuledger.collect.procfs import Gone, ProcfsReader, PsutilReader

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the /proc fast path is Linux only")

MIB = 2**20
# /proc/<pid>/stat's rss is the kernel's quick sum of its per-CPU memory counters (three: file,
# anon, shmem), each CPU holding back up to a batch of max(32, 2 x CPUs) pages; psutil reads statm,
# which recent kernels sum exactly. Within that slack, and no further, the two may differ.
CPUS = os.cpu_count() or 1
RSS_SLACK_B = 3 * CPUS * max(32, 2 * CPUS) * os.sysconf("SC_PAGE_SIZE")

# A member of the tree: memory, written and fsynced bytes, read bytes, CPU, a grandchild that ends
# (reaped: its CPU lands in our counters), a thread; then "ready" and idle until stdin closes.
MEMBER = r"""
import os, subprocess, sys, threading, time
mb, path = int(sys.argv[1]), sys.argv[2]
buf = bytearray(mb * 2**20)
for i in range(0, len(buf), 4096):
    buf[i] = 1  # resident, not just reserved
with open(path, "wb") as f:
    f.write(os.urandom(2**20)); f.flush(); os.fsync(f.fileno())
with open(path, "rb") as f:
    os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    f.read()
t = time.process_time()
while time.process_time() - t < 0.05:
    pass
subprocess.run([sys.executable, "-c", "x = bytearray(8 * 2**20); sum(range(10**5))"], check=True)
threading.Thread(target=threading.Event().wait, daemon=True).start()
print("ready", flush=True)
for line in sys.stdin:  # each line: one more fsynced MiB, then "done"
    with open(path, "ab") as f:
        f.write(os.urandom(2**20)); f.flush(); os.fsync(f.fileno())
    print("done", flush=True)
"""


def start_members(tmp: str, sizes: list[int]) -> list[subprocess.Popen[bytes]]:
    members = [
        subprocess.Popen(
            [sys.executable, "-c", MEMBER, str(mb), os.path.join(tmp, f"m{i}")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        for i, mb in enumerate(sizes)
    ]
    for m in members:  # a blocking read: no deadline to guess, and a dead member ends it at once
        assert m.stdout is not None
        assert m.stdout.readline() == b"ready\n", "a member of the test tree failed"
    return members


@contextlib.contextmanager
def tree(tmp: str, sizes: list[int]) -> Iterator[list[subprocess.Popen[bytes]]]:
    members = start_members(tmp, sizes)
    try:
        yield members
    finally:
        for m in members:
            assert m.stdin is not None
            m.stdin.close()
        for m in members:
            m.wait(timeout=60)
            assert m.stdout is not None
            m.stdout.close()


def settled(pids: list[int], deadline_s: float = 30.0) -> None:
    """Wait until every process sleeps (state S): then neither reader can see a figure move."""
    deadline = time.monotonic() + deadline_s
    while any(psutil.Process(p).status() != psutil.STATUS_SLEEPING for p in pids):
        assert time.monotonic() < deadline, "the test tree did not go idle"
        time.sleep(0.01)


def test_every_figure_of_a_real_tree_matches_psutil(tmp_path: os.PathLike[str]) -> None:
    with tree(os.fspath(tmp_path), [16, 48, 96]) as members:
        pids = [m.pid for m in members]
        settled(pids)
        fast, slow = ProcfsReader(), PsutilReader()
        for pid in pids:
            a, b = fast.sample(pid), slow.sample(pid)
            assert a.ppid == b.ppid == os.getpid()
            assert a.threads == b.threads == 2
            assert abs(a.rss_b - b.rss_b) <= RSS_SLACK_B
            assert a.usage.read_b == b.usage.read_b and a.usage.write_b == b.usage.write_b
            assert a.usage.cpu_s == pytest.approx(b.usage.cpu_s, abs=1e-9)
            # The grandchild's CPU is in the member's (reaped) counters, and its own burn too.
            assert a.usage.cpu_s >= 0.05
            # Start: clock ticks after boot, the same instant as psutil's creation time.
            assert psutil.boot_time() + a.start / os.sysconf("SC_CLK_TCK") == pytest.approx(b.start, abs=0.05)
            # The plain tuple of the every-tick path is the same reading.
            assert fast.stat(pid) == (a.ppid, a.start, a.usage.cpu_s, a.rss_b, a.threads)
            assert fast.io(pid) == (a.usage.read_b, a.usage.write_b)
        rss = {pid: fast.sample(pid).rss_b for pid in pids}
        assert rss[pids[0]] + 24 * MIB < rss[pids[1]] < rss[pids[2]] - 24 * MIB  # 16, 48, 96 MiB allocated
        assert fast.sample(pids[0]).usage.write_b >= MIB  # fsynced: on the disk, not only in the cache
        fast.close()


def test_collectors_on_either_reader_report_the_same_tree(tmp_path: os.PathLike[str]) -> None:
    before = {p.pid for p in psutil.Process().children()}  # a session-wide server is not the tree
    with tree(os.fspath(tmp_path), [8, 24, 40, 8]) as members:
        settled([m.pid for m in members])
        collectors = {
            backend: ProcessTreeCollector(os.getpid(), before, include_root=False, backend=backend, rescan_every=1)
            for backend in ("procfs", "psutil")
        }
        for c in collectors.values():
            assert c.read() is None and c.read() is not None
        for m in members:  # I/O after the collectors found them: it must come from the io counters
            assert m.stdin is not None and m.stdout is not None
            m.stdin.write(b"write\n")
            m.stdin.flush()
            assert m.stdout.readline() == b"done\n"
        settled([m.pid for m in members])
        ticks = {backend: c.read(closes_interval=True) for backend, c in collectors.items()}
        a, b = ticks["procfs"], ticks["psutil"]
        assert a is not None and b is not None
        assert (a.procs, a.threads) == (b.procs, b.threads) == (4, 8)
        assert abs(a.rss_b - b.rss_b) <= 4 * RSS_SLACK_B and a.rss_b > 80 * MIB
        assert a.write_b == b.write_b >= 4 * MIB  # this tick's: one more MiB each
        fast, slow = (c.totals() for c in collectors.values())
        # Counted from birth (the gpuledger-run shape): each member's own and its grandchild's.
        assert (fast.read_b, fast.write_b) == (slow.read_b, slow.write_b) and fast.write_b >= 8 * MIB
        assert fast.cpu_s == pytest.approx(slow.cpu_s, abs=1e-6) and fast.cpu_s >= 4 * 0.05
        for c in collectors.values():
            assert c.pids() == {m.pid for m in members}
            c.close()


def test_a_process_that_ends_between_two_reads_is_gone_and_the_tick_comes(tmp_path: os.PathLike[str]) -> None:
    before = {p.pid for p in psutil.Process().children()}
    fds_before = len(os.listdir("/proc/self/fd"))
    with tree(os.fspath(tmp_path), [8, 8]) as members:
        c = ProcessTreeCollector(os.getpid(), before, include_root=False, backend="procfs", rescan_every=1)
        c.read()
        first = c.read()
        assert first is not None and first.procs == 2
        victim = members[0]
        victim.kill()
        victim.wait()  # reaped: its kept stat file now answers ESRCH, or its pid is free
        tick = c.read()
        assert tick is not None and tick.procs == 1 and c.pids() == {members[1].pid}
        assert tick.rss_b > 0 and tick.threads == 2
        reader = ProcfsReader()
        with pytest.raises(Gone):
            reader.sample(victim.pid)
        c.close()
        reader.close()
    assert len(os.listdir("/proc/self/fd")) <= fds_before  # every kept file was given back


NOBODY = 65534

# Run as another user: read a process of ours (root's) with the fast path, and meter it.
AS_OTHER_USER = r"""
import json, os, sys
from gpuledger.collect.host import ProcessTreeCollector
from gpuledger.collect.procfs import ProcfsReader
os.setgid(65534); os.setuid(65534)  # after the imports: the interpreter's files may be root's only
target = int(sys.argv[1])
s = ProcfsReader().sample(target)
c = ProcessTreeCollector(target, include_root=True, backend="procfs")
c.read()
tick = c.read(closes_interval=True)
print(json.dumps({"io": [s.usage.read_b, s.usage.write_b], "threads": s.threads, "cpu": s.usage.cpu_s,
                  "procs": tick.procs, "tick_threads": tick.threads, "rss": tick.rss_b}))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become another user for the check")
def test_another_users_process_keeps_its_ticks_without_io(tmp_path: os.PathLike[str]) -> None:
    with tree(os.fspath(tmp_path), [8]) as members:
        target = members[0].pid
        settled([target])
        src = os.path.dirname(os.path.dirname(os.path.abspath(sys.modules["gpuledger"].__file__ or "")))
        out = subprocess.run(
            [sys.executable, "-c", AS_OTHER_USER, str(target)],
            env={**os.environ, "PYTHONPATH": src},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert out.returncode == 0, out.stderr
        seen = json.loads(out.stdout)
        mine = ProcfsReader().sample(target)
        assert mine.usage.write_b >= MIB  # root can read it: the other user cannot
        assert seen["io"] == [0, 0]  # absent, not an error that drops the process
        assert seen["threads"] == mine.threads and seen["cpu"] == pytest.approx(mine.usage.cpu_s, abs=1e-9)
        assert (seen["procs"], seen["tick_threads"]) == (1, mine.threads) and seen["rss"] == mine.rss_b


def test_a_pid_that_is_no_process_is_gone() -> None:
    reader = ProcfsReader()
    with pytest.raises(Gone):
        reader.sample(2**22 + 4321)  # above pid_max: never a process
    assert reader.io(2**22 + 4321) == (0, 0)


def test_a_short_born_window_is_probed_and_threads_are_not_taken_for_processes() -> None:
    import threading

    from gpuledger.collect.procfs import _list_proc, _listed_born

    reader = ProcfsReader()
    reader._listed = 10**6  # as after listing a huge host: any window is probed pid by pid
    since = reader.last_pid()
    assert since is not None
    release = threading.Event()
    threads = [threading.Thread(target=release.wait) for _ in range(3)]
    for t in threads:
        t.start()
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        upto = reader.last_pid()
        assert upto is not None
        thread_ids = {t.native_id for t in threads}
        assert len(thread_ids) == 3 and all(since < tid <= upto for tid in thread_ids if since < upto)
        probed = reader.scan_born(since, upto)
        listed = _listed_born(_list_proc(), since, upto)
        for found in (probed, listed):  # the probe finds what the listing finds: processes only
            assert (child.pid, os.getpid()) in {(p, pp) for p, pp, _ in found}
            assert not thread_ids & {p for p, _, _ in found}
        assert [p for p, _, _ in probed] == sorted(p for p, _, _ in probed)  # parents first
    finally:
        release.set()
        assert child.stdin is not None
        child.stdin.close()
        child.wait()
