"""ProcessTreeCollector on real process trees (no mocks).

Like ``gpuledger run``, the test process starts the tree as its own child, makes itself a child
subreaper (so orphans come back to it), reaps with ``os.wait4`` and credits the exact rusage; the
OS's own accounting (``RUSAGE_CHILDREN``) is the reference. Both readers (the /proc fast path and
psutil) are checked for the accounting rules.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import random
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import psutil
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuledger.collect.base import HostCollector
from gpuledger.collect.host import ProcessTreeCollector, Usage
from gpuledger.core.metering.intervals import merge_host_ticks
from gpuledger.core.model import HostInterval, HostTick
from host_support import (
    CPUS,
    DISK_READ_B_PER_S,
    DISK_WRITE_B_PER_S,
    IOWAIT_FRACTION,
    NET_RX_B_PER_S,
    NET_TX_B_PER_S,
    ScriptedSystem,
    expected_util_pct,
)

PR_SET_CHILD_SUBREAPER = 36
MB = 1_000_000
BACKENDS = ["procfs", "psutil"] if sys.platform.startswith("linux") else ["psutil"]

# Burns CPU (not wall) time, so a busy shared machine does not change the amount.
BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < {s}: pass\n"


def burner(seconds: float) -> list[str]:
    return [sys.executable, "-c", BURN.format(s=seconds)]


def py(code: str, **kw: object) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", code], **kw)  # type: ignore[call-overload]


def children_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def reap(collector: ProcessTreeCollector, pid: int, flags: int = 0) -> bool:
    """wait4 + credit, as gpuledger's reaping loop does; False when ``pid`` has not ended yet."""
    got, _, ru = os.wait4(pid, flags)
    if got == 0:
        return False
    collector.credit_reaped(pid, ru.ru_utime + ru.ru_stime, ru.ru_inblock * 512, ru.ru_oublock * 512)
    return True


def forget_popen(proc: subprocess.Popen[bytes]) -> None:
    proc.returncode = 0  # we reaped it with wait4: Popen must not wait on a pid that may be reused


class Sampler:
    """Reads a collector and keeps every tick, checking the invariants on the way."""

    def __init__(self, collector: ProcessTreeCollector) -> None:
        self.c = collector
        self.ticks: list[HostTick] = []
        assert collector.read() is None  # the first read primes
        self.last_total = collector.totals()

    def read(self) -> HostTick:
        tick = self.c.read()
        assert tick is not None
        assert tick.cpu_s >= 0 and tick.read_b >= 0 and tick.write_b >= 0
        assert tick.t1 >= tick.t0 and tick.rss_b >= 0 and tick.procs == len(self.c.pids())
        total = self.c.totals()
        assert all(now >= before for now, before in zip(total, self.last_total, strict=True)), "not monotonic"
        self.last_total = total
        self.ticks.append(tick)
        return tick

    def until(self, done: Callable[[], bool], every_s: float = 0.1, limit_s: float = 60.0) -> None:
        deadline = time.monotonic() + limit_s
        while not done():
            assert time.monotonic() < deadline, "the test tree did not finish in time"
            self.read()
            time.sleep(every_s)
        self.read()

    def cpu_s(self) -> float:
        total = sum(t.cpu_s for t in self.ticks)
        assert total == pytest.approx(self.c.totals().cpu_s)  # ticks sum to the cumulative total
        return total


@pytest.fixture
def subreaper() -> Iterator[None]:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        pytest.skip("PR_SET_CHILD_SUBREAPER is not available (needs Linux 3.4+)")
    before = {p.pid for p in psutil.Process().children()}
    try:
        yield
    finally:
        libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
        for leftover in psutil.Process().children():  # a failed test must not leak into the next
            if leftover.pid not in before:
                with contextlib.suppress(psutil.Error, ChildProcessError):
                    leftover.kill()
                    os.waitpid(leftover.pid, 0)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def run_collector(
    backend: str, exclude_pids: frozenset[int] | None = None, rescan_every: int = 1
) -> ProcessTreeCollector:
    # The gpuledger-run shape: the root is us, not metered; our children are the run. Children we
    # had before (a session-wide server of another test module) are not.
    exclude = {p.pid for p in psutil.Process().children()} if exclude_pids is None else exclude_pids
    return ProcessTreeCollector(os.getpid(), exclude, rescan_every=rescan_every, include_root=False, backend=backend)


def assert_close(measured: float, expected: float, rel: float = 0.02, abs_s: float = 0.0) -> None:
    assert abs(measured - expected) <= max(rel * expected, abs_s), (measured, expected)


def test_implements_the_protocol() -> None:
    collector: HostCollector = ProcessTreeCollector(os.getpid())
    t = time.time()
    assert collector.read(t) is None  # the first read primes
    tick = collector.read(t + 1.0)
    assert tick is not None and (tick.t0, tick.t1) == (t, t + 1.0) and tick.rss_b > 0
    assert os.getpid() in collector.pids()
    collector.close()


@pytest.mark.usefixtures("subreaper")
def test_two_workers_match_os_accounting(backend: str) -> None:
    before = children_cpu_s()
    sampler = Sampler(run_collector(backend))
    code = (
        "import subprocess, sys, time\n"
        f"workers = [subprocess.Popen({burner(1.5)!r}) for _ in range(2)]\n"
        "[w.wait() for w in workers]\n"
        "print('reaped', flush=True)\n"
        "sys.stdin.read()\n"  # linger until told, so that a read sees the workers inside its counters
    )
    root = py(code, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert root.stdin is not None and root.stdout is not None
    sampler.until(lambda: bool(sampler.ticks) and sampler.ticks[-1].procs == 3)  # the root and both workers
    assert root.stdout.readline() == b"reaped\n"
    sampler.read()
    pre_credit = sampler.c.totals().cpu_s  # our own reading, the root idle on its stdin
    root.stdin.close()
    sampler.until(lambda: reap(sampler.c, root.pid, os.WNOHANG))
    forget_popen(root)
    expected = children_cpu_s() - before
    assert expected >= 3.0
    assert_close(pre_credit, expected, abs_s=0.05)  # our own reading, before the exact credit
    assert_close(sampler.cpu_s(), expected)


@pytest.mark.usefixtures("subreaper")
def test_short_lived_grandchildren_are_counted(backend: str) -> None:
    # Grandchildren live between reads and are never seen; their parent waits for them.
    before = children_cpu_s()
    collector = run_collector(backend, rescan_every=1000)  # only the early scan: grandchildren unseen
    sampler = Sampler(collector)
    code = (
        f"import subprocess, sys\nfor _ in range(6): subprocess.run({burner(0.2)!r})\n"
        "print('done', flush=True)\nsys.stdin.read()\n"  # linger until told: a read sees it all
    )
    root = py(code, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert root.stdin is not None and root.stdout is not None
    sampler.read()  # the first read after priming scans: the root is known from here on
    assert root.stdout.readline() == b"done\n"
    sampler.read()
    pre_credit = collector.totals().cpu_s
    root.stdin.close()
    sampler.until(lambda: reap(collector, root.pid, os.WNOHANG))
    forget_popen(root)
    expected = children_cpu_s() - before
    assert expected >= 1.2
    # The last read before the root exits misses only the root's own exit (~50 ms of CPU on a
    # loaded machine); one missed 0.2 s grandchild would still fail this.
    assert_close(pre_credit, expected, abs_s=0.1)
    assert_close(sampler.cpu_s(), expected)


ORPHANING_PARENT = (
    "import subprocess, sys, time\n"
    "g = subprocess.Popen({grandchild!r})\n"
    "print(g.pid, flush=True)\n"
    "t = time.process_time()\n"
    "while time.process_time() - t < 0.3: pass\n"
)  # exits without waiting: the grandchild is orphaned and comes back to us (subreaper)


@pytest.mark.usefixtures("subreaper")
def test_orphaned_grandchild_is_adopted_and_counted(backend: str) -> None:
    before = children_cpu_s()
    sampler = Sampler(run_collector(backend))
    parent = py(ORPHANING_PARENT.format(grandchild=burner(1.5)), stdout=subprocess.PIPE)
    assert parent.stdout is not None
    grandchild = int(parent.stdout.readline())
    sampler.until(lambda: reap(sampler.c, parent.pid, os.WNOHANG))
    forget_popen(parent)
    assert psutil.Process(grandchild).ppid() == os.getpid()  # adopted by us, the subreaper
    assert grandchild in sampler.c.pids()
    sampler.until(lambda: reap(sampler.c, grandchild, os.WNOHANG))
    expected = children_cpu_s() - before
    assert expected >= 1.8
    assert_close(sampler.cpu_s(), expected)


@pytest.mark.parametrize("read_between", [False, True], ids=["credit-first", "read-first"])
@pytest.mark.parametrize("first", ["grandchild", "parent"])
@pytest.mark.usefixtures("subreaper")
def test_credits_in_any_order_do_not_double_count(backend: str, first: str, read_between: bool) -> None:
    # Both end between two reads; gpuledger's wait4(-1) may hand them over in either order, and the
    # sampler thread may notice they are gone before the reaping thread credits them.
    before = children_cpu_s()
    sampler = Sampler(run_collector(backend))
    parent = py(ORPHANING_PARENT.format(grandchild=burner(0.6)), stdout=subprocess.PIPE)
    assert parent.stdout is not None
    grandchild = int(parent.stdout.readline())
    sampler.until(lambda: len(sampler.c.pids()) == 2)
    sampler.until(lambda: sampler.c.totals().cpu_s > 0)  # both tracked, with some CPU seen
    deadline = time.monotonic() + 30
    for pid in (parent.pid, grandchild):  # both end, unread and unreaped (zombies)
        try:
            while psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        except psutil.NoSuchProcess:
            # Only a waitpid(-1) elsewhere in this pytest process (a child watcher left by an earlier
            # test's event loop) can take our zombie; the credit order cannot be staged then.
            pytest.skip(f"pid {pid} was reaped by another waiter in the test process")
    order = [grandchild, parent.pid] if first == "grandchild" else [parent.pid, grandchild]
    usage = {pid: os.wait4(pid, 0)[2] for pid in order}
    forget_popen(parent)
    if read_between:
        sampler.read()
    for pid in order:
        ru = usage[pid]
        sampler.c.credit_reaped(pid, ru.ru_utime + ru.ru_stime, ru.ru_inblock * 512, ru.ru_oublock * 512)
    sampler.read()
    expected = children_cpu_s() - before
    assert_close(sampler.cpu_s(), expected)


@pytest.mark.parametrize("read_between", [False, True], ids=["credit-first", "read-first"])
@pytest.mark.usefixtures("subreaper")
def test_credit_replaces_the_reaped_subtree(backend: str, read_between: bool) -> None:
    # A child tracked alive at the last read is reaped by its parent, which then ends at once: the
    # parent's rusage holds the child, so what we had counted for the child must go.
    before = children_cpu_s()
    sampler = Sampler(run_collector(backend))
    code = f"import subprocess, sys\nc = subprocess.Popen({burner(0.8)!r})\nsys.stdin.read()\nc.wait()\n"
    parent = py(code, stdin=subprocess.PIPE)
    assert parent.stdin is not None
    sampler.until(lambda: len(sampler.c.pids()) == 2)
    # The child's CPU, seen while it runs (it burns 0.8 s, then waits to be reaped).
    sampler.until(lambda: sampler.c.totals().cpu_s > 0.2, every_s=0.05)
    parent.stdin.close()  # from here on, no read until the parent has ended
    deadline = time.monotonic() + 30
    while psutil.Process(parent.pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    ru = os.wait4(parent.pid, 0)[2]
    forget_popen(parent)
    if read_between:
        sampler.read()
    sampler.c.credit_reaped(parent.pid, ru.ru_utime + ru.ru_stime, ru.ru_inblock * 512, ru.ru_oublock * 512)
    sampler.read()
    assert_close(sampler.cpu_s(), children_cpu_s() - before)


def test_preexisting_child_reaped_later_counts_only_its_metered_part(backend: str) -> None:
    # track() on a process that already has a busy child: the child's CPU before the first read is
    # not the run's, also once the root has reaped it and it is inside the root's counters.
    child = f"import sys, time\n{BURN.format(s=0.6)}print('half', flush=True)\nsys.stdin.read()\n{BURN.format(s=0.3)}"
    code = (
        "import subprocess, sys\n"
        f"c = subprocess.Popen([sys.executable, '-c', {child!r}], stdin=subprocess.PIPE, stdout=subprocess.PIPE)\n"
        "c.stdout.readline()\n"
        "print(c.pid, flush=True)\n"
        "sys.stdin.readline()\n"
        "c.stdin.close()\n"
        "c.wait()\n"
        "print('reaped', flush=True)\n"
        "sys.stdin.read()\n"
    )
    root = py(code, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert root.stdin is not None and root.stdout is not None
    try:
        child_pid = int(root.stdout.readline())
        sampler = Sampler(ProcessTreeCollector(root.pid, include_root=True, rescan_every=1, backend=backend))
        root_at_prime = sum(psutil.Process(root.pid).cpu_times()[:4])
        child_at_prime = sum(psutil.Process(child_pid).cpu_times()[:4])
        assert child_pid in sampler.c.pids() and child_at_prime > 0.5
        sampler.read()
        root.stdin.write(b"go\n")
        root.stdin.flush()
        assert root.stdout.readline() == b"reaped\n"
        sampler.read()
        assert sampler.c.pids() == {root.pid}
        root_now = sum(psutil.Process(root.pid).cpu_times()[:4])  # own + the reaped child's total
        assert_close(sampler.cpu_s(), root_now - root_at_prime - child_at_prime, abs_s=0.05)
    finally:
        root.stdin.close()
        root.wait()


def test_baseline_when_the_root_is_included(backend: str) -> None:
    # track(): the root's CPU before the first read is not the run's.
    code = BURN.format(s=0.8) + "import sys\nsys.stdout.write('ok\\n'); sys.stdout.flush()\n" + BURN.format(s=0.8)
    code += "sys.stdout.write('idle\\n'); sys.stdout.flush()\nsys.stdin.read()\n"
    root = py(code, stdout=subprocess.PIPE, stdin=subprocess.PIPE)
    assert root.stdout is not None and root.stdin is not None
    try:
        assert root.stdout.readline() == b"ok\n"
        sampler = Sampler(ProcessTreeCollector(root.pid, include_root=True, backend=backend))
        at_prime = psutil.Process(root.pid).cpu_times()
        sampler.until(lambda: sum(psutil.Process(root.pid).cpu_times()[:2]) - sum(at_prime[:2]) > 0.75)
        assert root.stdout.readline() == b"idle\n"  # no CPU burnt between our read and psutil's
        sampler.read()
        assert root.pid in sampler.c.pids()
        now = psutil.Process(root.pid).cpu_times()
        assert_close(sampler.cpu_s(), now.user + now.system - at_prime.user - at_prime.system, abs_s=0.03)
        assert 0.7 < sampler.cpu_s() < 1.0
    finally:
        root.stdin.close()
        root.wait()


_OWN_PROCESS = """
import json, os, resource, sys
from gpuledger.collect.host import ProcessTreeCollector

def own_cpu_s():
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime

tick_s = 1 / os.sysconf("SC_CLK_TCK")

def burn_until(low, high, at_least_s=0.0):
    start = own_cpu_s()
    while not (own_cpu_s() - start >= at_least_s and low < (own_cpu_s() % tick_s) / tick_s < high):
        pass

c = ProcessTreeCollector(os.getpid(), include_root=True, backend=sys.argv[1])
burn_until(0.0, 0.1)
before_prime = own_cpu_s()
c.read()
after_prime = own_cpu_s()
burn_until(0.65, 0.9, at_least_s=0.1)
before = own_cpu_s()
tick = c.read()
after = own_cpu_s()
json.dump([before_prime, after_prime, before, after, tick.cpu_s, tick.procs], sys.stdout)
"""


def test_the_collectors_own_process_is_metered_to_the_microsecond_not_the_clock_tick(backend: str) -> None:
    # gpuledger.track() meters the process it runs in. /proc/<pid>/stat counts its CPU in whole
    # clock ticks, each rounded down: prime just after a tick and read most of a tick past one, so
    # tick counting would read over 3 ms short. Measured in a fresh interpreter, whose tree is
    # itself alone (this one's may hold a still-running child of another test, burning CPU).
    out = subprocess.run([sys.executable, "-c", _OWN_PROCESS, backend], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    before_prime, after_prime, before, after, cpu_s, procs = json.loads(out.stdout)
    assert procs == 1
    assert before - after_prime - 0.0015 <= cpu_s <= after - before_prime + 0.0015  # the kernel's figure


@pytest.mark.usefixtures("subreaper")
def test_memory_grower_rss(backend: str) -> None:
    code = (
        "import sys, time\n"
        "blocks = []\n"
        "for _ in range(10):\n"
        "    blocks.append(bytearray(b'x') * (20 * 1000 * 1000))\n"  # filled, so resident
        "    time.sleep(0.1)\n"
        "print('full', flush=True)\n"
        "sys.stdin.read()\n"  # hold it all until a read has seen it
    )
    sampler = Sampler(run_collector(backend))
    proc = py(code, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    assert proc.stdout.readline() == b"full\n"
    sampler.read()
    proc.stdin.close()
    sampler.until(lambda: reap(sampler.c, proc.pid, os.WNOHANG), every_s=0.05)
    forget_popen(proc)
    assert max(t.rss_b for t in sampler.ticks) >= 180 * MB
    assert sampler.ticks[-1].rss_b == 0 and sampler.ticks[-1].procs == 0


@pytest.mark.skipif(not os.path.exists(f"/proc/{os.getpid()}/io"), reason="/proc/<pid>/io is unavailable")
@pytest.mark.usefixtures("subreaper")
def test_writer_bytes(backend: str, tmp_path: os.PathLike[str]) -> None:
    target = os.path.join(os.fspath(tmp_path), "blob")
    code = (
        "import os, sys\n"
        f"with open({target!r}, 'wb') as f:\n"
        "    for _ in range(50): f.write(os.urandom(1000 * 1000))\n"
        "    f.flush(); os.fsync(f.fileno())\n"
        "print('written', flush=True)\n"
        "sys.stdin.read()\n"
    )
    sampler = Sampler(run_collector(backend))
    proc = py(code, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdin is not None
    assert proc.stdout.readline() == b"written\n"
    sampler.read()
    seen = sampler.c.totals().write_b
    if seen == 0:
        proc.stdin.close()
        proc.wait()
        pytest.skip("the kernel reports no storage writes here (tmpfs, or no task I/O accounting)")
    proc.stdin.close()
    sampler.until(lambda: reap(sampler.c, proc.pid, os.WNOHANG))
    forget_popen(proc)
    assert seen >= 50 * MB  # read by the collector itself, before the credit
    assert 50 * MB <= sampler.c.totals().write_b < 60 * MB  # the credit did not count it twice
    assert sum(t.write_b for t in sampler.ticks) == sampler.c.totals().write_b


@pytest.mark.usefixtures("subreaper")
def test_excluded_subtree_is_not_counted(backend: str) -> None:
    before = children_cpu_s()
    others = frozenset(p.pid for p in psutil.Process().children())
    run = py(BURN.format(s=1.0))
    relay_code = f"import subprocess\nsubprocess.run({burner(1.0)!r})\n" + BURN.format(s=0.5)
    relay = py(relay_code)
    sampler = Sampler(run_collector(backend, exclude_pids=others | {relay.pid}))
    excluded_seen = False
    while not reap(sampler.c, run.pid, os.WNOHANG):
        sampler.read()
        relay_tree = {relay.pid} | {p.pid for p in psutil.Process(relay.pid).children(recursive=True)}
        excluded_seen |= len(relay_tree) > 1
        assert not (sampler.c.pids() & relay_tree)
        time.sleep(0.1)
    forget_popen(run)
    run_cpu = children_cpu_s() - before
    reap(sampler.c, relay.pid)  # a credit for an excluded pid is ignored
    forget_popen(relay)
    sampler.read()
    assert excluded_seen
    assert_close(sampler.cpu_s(), run_cpu)


SPAWNER = (
    "import os, random, subprocess, sys, time\n"
    "kids = []\n"
    "while not os.path.exists(sys.argv[1]):\n"  # until the test has seen enough
    "    if random.random() < 0.3:\n"
    "        kids.append(subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(0.3)']))\n"
    "    else:\n"
    "        kids.append(subprocess.Popen(['sleep', str(random.random() / 10)]))\n"
    "    time.sleep(0.02)\n"
    "    kids = [k for k in kids if k.poll() is None]\n"
    "for k in kids: k.wait()\n"
)


@pytest.mark.usefixtures("subreaper")
def test_races_never_raise_and_totals_stay_monotonic(backend: str, tmp_path: os.PathLike[str]) -> None:
    # Processes are born, killed and reaped (or left as zombies) while we read as fast as we can,
    # for 2.5 s at least and until we have read 50 times and killed some (however slow the machine).
    before = children_cpu_s()
    sampler = Sampler(run_collector(backend))
    stop = os.path.join(os.fspath(tmp_path), "stop")
    spawner = subprocess.Popen([sys.executable, "-c", SPAWNER, stop])
    rng = random.Random(7)
    killed = 0
    at_least = time.monotonic() + 2.5
    while not reap(sampler.c, spawner.pid, os.WNOHANG):
        now = time.monotonic()
        enough = now > at_least and len(sampler.ticks) > 50 and killed
        if (enough or now > at_least + 120) and not os.path.exists(stop):  # 120 s: give up, assert below
            open(stop, "w").close()
        sampler.read()
        victims = [p for p in sampler.c.pids() if p != spawner.pid]
        if victims and rng.random() < 0.3:
            killed += kill_own(rng.choice(victims), spawner.pid)
        time.sleep(rng.choice([0, 0.001, 0.01]))
    forget_popen(spawner)
    sampler.read()
    assert killed > 0 and len(sampler.ticks) > 50
    assert_close(sampler.cpu_s(), children_cpu_s() - before)


def kill_own(pid: int, parent: int) -> int:
    """SIGKILL ``pid`` only if it is still a child of our spawner (psutil refuses a reused pid)."""
    try:
        proc = psutil.Process(pid)
        if proc.ppid() != parent:
            return 0
        proc.send_signal(signal.SIGKILL)
    except psutil.Error:
        return 0
    return 1


CHAIN = (
    "import subprocess, sys\n"
    "depth = int(sys.argv[1])\n"
    "if depth:\n"
    "    subprocess.run([sys.executable, '-c', sys.argv[2], str(depth - 1), sys.argv[2]])\n"
    "else:\n"
    "    print('bottom', flush=True)\n"
    "    sys.stdin.read()\n"
)


@pytest.mark.usefixtures("subreaper")
def test_a_chain_born_between_two_reads_is_found_at_once(backend: str) -> None:
    # Scans between whole scans only read the processes born since the last one, parents first.
    sampler = Sampler(run_collector(backend, rescan_every=1))
    top = subprocess.Popen([sys.executable, "-c", CHAIN, "4", CHAIN], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert top.stdout is not None and top.stdin is not None
    assert top.stdout.readline() == b"bottom\n"
    sampler.read()
    chain = {top.pid} | {p.pid for p in psutil.Process(top.pid).children(recursive=True)}
    assert len(chain) == 5 and sampler.c.pids() == chain
    top.stdin.close()
    sampler.until(lambda: reap(sampler.c, top.pid, os.WNOHANG))
    forget_popen(top)
    assert sampler.c.pids() == set()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the /proc fast path is Linux only")
def test_born_since_window_wraps_around_pid_max() -> None:
    from gpuledger.collect.procfs import ProcfsReader as _ProcfsReader

    child = py("import sys; sys.stdin.read()", stdin=subprocess.PIPE)
    try:
        reader = _ProcfsReader()
        last = reader.last_pid()
        assert last is not None and last >= child.pid
        plain = reader.scan_born(child.pid - 1, last)
        wrapped = reader.scan_born(2**23, last)  # (2**23, pid_max] and [1, last]: all we have
        assert plain[0] == (child.pid, os.getpid(), plain[0][2])
        assert {p for p, _, _ in plain} <= {p for p, _, _ in wrapped}
        assert [p for p, _, _ in wrapped] == sorted(p for p, _, _ in wrapped)
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait()


def test_vanished_root_and_dead_pids_do_not_raise(backend: str) -> None:
    proc = py("pass")
    proc.wait()
    collector = ProcessTreeCollector(proc.pid, include_root=True, backend=backend)
    assert collector.read() is None
    tick = collector.read()
    assert tick is not None and tick.procs == 0 and tick.cpu_s == 0
    collector.credit_reaped(proc.pid, 1.0)  # the root is never credited
    collector.credit_reaped(2**22 + 12345, 0.25)  # unknown pid: its usage is the run's
    assert collector.read().cpu_s == pytest.approx(0.25)  # type: ignore[union-attr]
    assert collector.totals() == Usage(0.25, 0, 0)


def test_system_fields(backend: str) -> None:
    collector = ProcessTreeCollector(os.getpid(), backend=backend)
    collector.read()
    time.sleep(0.2)
    tick = collector.read()
    assert tick is not None
    assert tick.sys_cpu_util_pct is not None and 0 <= tick.sys_cpu_util_pct <= 100
    assert tick.sys_mem_used_b is not None and tick.sys_mem_used_b > 0
    if sys.platform.startswith("linux"):
        assert tick.iowait_s is not None and tick.iowait_s >= 0
    for value in (tick.disk_read_b, tick.disk_write_b, tick.net_rx_b, tick.net_tx_b):
        assert value is None or value >= 0
    assert (tick.disk_read_b is None) == (psutil.disk_io_counters() is None)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the /proc fast path is Linux only")
def test_procfs_and_psutil_readers_agree() -> None:
    from gpuledger.collect.procfs import ProcfsReader as _ProcfsReader
    from gpuledger.collect.procfs import PsutilReader as _PsutilReader
    from gpuledger.collect.system import SystemReader as _SystemReader

    fast, slow = _SystemReader(procfs=True).read(), _SystemReader(procfs=False).read()
    assert fast.mem_used_b == pytest.approx(slow.mem_used_b, rel=0.02)
    assert fast.cpu is not None and slow.cpu is not None
    assert fast.cpu[1] == pytest.approx(slow.cpu[1], rel=0.01)
    if slow.disks is None:
        assert fast.disks is None
    else:
        assert fast.disks is not None
        fast_r = sum(r for r, _ in fast.disks.values())
        assert fast_r == pytest.approx(slow.disks["all"][0], rel=0.01, abs=4 * MB)
    assert fast.nets is not None and slow.nets is not None and fast.nets.keys() == slow.nets.keys()
    pid = os.getpid()
    a, b = _ProcfsReader().sample(pid), _PsutilReader().sample(pid)
    assert (a.ppid, a.threads) == (b.ppid, b.threads)
    assert a.rss_b == pytest.approx(b.rss_b, rel=0.05)
    assert a.usage.cpu_s == pytest.approx(b.usage.cpu_s, abs=0.05)


def test_host_wide_counters_are_read_every_nth_tick_only() -> None:
    collector = ProcessTreeCollector(os.getpid(), system_every=3)
    assert collector.read(0.0) is None
    ticks = [collector.read(float(i)) for i in range(1, 10)]
    with_system = [i for i, tick in enumerate(ticks, start=1) if tick.sys_mem_used_b is not None]
    assert with_system == [3, 6, 9]  # cumulative counters: their sums stay exact, the cost drops
    assert [tick.sys_t0 for tick in ticks if tick.sys_t0 is not None] == [0.0, 3.0, 6.0]  # what each covers
    collector.close()


# -- host-wide counters: every delta stays inside the span it is stored for -----------------------


class ManualClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def assert_host_wide_over(item: HostTick | HostInterval, t0: float, t1: float, system: ScriptedSystem) -> None:
    """The host-wide figures of ``item`` are exactly the scripted counters' growth over (t0, t1]."""
    span = t1 - t0
    assert (item.disk_read_b, item.disk_write_b) == (DISK_READ_B_PER_S * span, DISK_WRITE_B_PER_S * span)
    assert (item.net_rx_b, item.net_tx_b) == (NET_RX_B_PER_S * span, NET_TX_B_PER_S * span)
    assert item.iowait_s == pytest.approx(IOWAIT_FRACTION * CPUS * span, abs=1e-9)
    util = item.sys_cpu_util_pct if isinstance(item, HostTick) else item.sys_cpu_util_avg_pct
    if span > 0:
        assert util == pytest.approx(expected_util_pct(system, t0, t1), abs=1e-6)


def test_a_read_that_closes_an_interval_reads_the_host_wide_counters_too(backend: str) -> None:
    clock = ManualClock()
    system = ScriptedSystem(clock)
    collector = ProcessTreeCollector(os.getpid(), backend=backend, system_every=5, system=system)
    assert collector.read(clock.t) is None
    ticks = []
    for i in range(1, 13):
        clock.t = float(i)
        tick = collector.read(clock.t, closes_interval=i in (3, 7))
        assert tick is not None
        ticks.append(tick)
    # The two closes, then the cheap cadence again: every 5th read since the last host-wide one.
    assert system.reads == [0.0, 3.0, 7.0, 12.0]
    assert [(t.sys_t0, t.t1) for t in ticks if t.sys_t0 is not None] == [(0.0, 3.0), (3.0, 7.0), (7.0, 12.0)]
    for tick in ticks:
        if tick.sys_t0 is None:
            assert (tick.iowait_s, tick.disk_write_b, tick.net_rx_b, tick.sys_cpu_util_pct) == (None,) * 4
        else:
            assert_host_wide_over(tick, tick.sys_t0, tick.t1, system)
    collector.close()


def test_a_read_that_raises_moves_no_cursor(backend: str) -> None:
    clock = ManualClock()
    system = ScriptedSystem(clock)
    collector = ProcessTreeCollector(os.getpid(), backend=backend, system=system)
    assert collector.read(clock.t) is None
    clock.t = 1.0
    first = collector.read(clock.t, closes_interval=True)
    # Tree usage the failed read sees and must not drop: several clock ticks' worth, so /proc's
    # tick-rounded figures cannot hide it on a loaded machine.
    burn_until = time.process_time() + 0.2
    while time.process_time() < burn_until:
        pass
    clock.t, system.fail_next = 2.0, True
    with pytest.raises(OSError):
        collector.read(clock.t, closes_interval=True)
    clock.t = 3.0
    after = collector.read(clock.t, closes_interval=True)
    assert first is not None and after is not None
    # The failed read left everything to the next one: its tick covers (1, 3], tree and host alike.
    assert (after.t0, after.sys_t0, after.t1) == (1.0, 1.0, 3.0)
    assert_host_wide_over(after, 1.0, 3.0, system)
    assert after.cpu_s >= 0.15  # the failed read's tree usage came with the next one, not lost
    assert first.cpu_s + after.cpu_s == pytest.approx(collector.totals().cpu_s)
    collector.close()


def test_with_either_reader_the_real_host_wide_counters_come_at_every_close(backend: str) -> None:
    collector = ProcessTreeCollector(os.getpid(), backend=backend, system_every=1000)
    start = time.time()
    assert collector.read(start) is None
    middle = collector.read(start + 0.1)
    time.sleep(0.1)
    closing = collector.read(start + 0.2, closes_interval=True)
    assert middle is not None and closing is not None
    assert middle.sys_t0 is None and middle.sys_mem_used_b is None  # between closes: the cheap cadence
    assert closing.sys_t0 == start and closing.sys_mem_used_b is not None and closing.sys_cpu_util_pct is not None
    collector.close()


_gaps = st.lists(st.integers(1, 2048), min_size=1, max_size=25)  # 1/1024 s up to 2 s between reads
_phases = st.lists(st.tuples(st.integers(1, 40 * 1024), st.sampled_from([0.0, 0.25, 0.5, 0.75])), max_size=6)


@settings(max_examples=150, deadline=None)
@given(gaps=_gaps, closes=st.lists(st.booleans(), min_size=25, max_size=25), system_every=st.integers(1, 6),
       first=st.sampled_from([0.25, 0.5]), phases=_phases)  # fmt: skip
def test_any_cadence_gives_each_interval_the_host_figures_of_its_own_span(
    gaps: list[int], closes: list[bool], system_every: int, first: float, phases: list[tuple[int, float]]
) -> None:
    clock = ManualClock()
    script = [(0.0, first), *sorted((k / 1024, fraction) for k, fraction in phases)]
    system = ScriptedSystem(clock, script)
    collector = ProcessTreeCollector(os.getpid(), system_every=system_every, system=system)
    assert collector.read(clock.t) is None
    intervals, ticks = [], []
    for n, gap in enumerate(gaps):
        clock.t += gap / 1024
        last = n == len(gaps) - 1
        tick = collector.read(clock.t, closes_interval=closes[n] or last)
        assert tick is not None
        ticks.append(tick)
        if closes[n] or last:  # the recorder ends an interval at this read
            intervals.append(merge_host_ticks(len(intervals), ticks))
            ticks = []
    for iv in intervals:  # host CPU % weighted by the span each reading covers, not by its tick
        assert_host_wide_over(iv, iv.t0, iv.t1, system)
    collector.close()


def test_a_collector_dropped_without_close_gives_its_descriptors_back() -> None:
    """track() inside a notebook, or a caller that forgets close(): the /proc files a collector
    keeps open are closed when it is collected, even from a reference cycle, not at process exit."""
    import gc

    def open_fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    gc.collect()
    before = open_fds()
    for _ in range(20):
        collector = ProcessTreeCollector(os.getpid(), include_root=True)
        collector.read()
        collector.read()
        collector.cycle = collector  # type: ignore[attr-defined]  # only the cycle collector frees it
        assert open_fds() > before
        del collector
    gc.collect()
    assert open_fds() == before


def test_process_io_is_read_at_its_cadence_and_every_interval_keeps_its_own(backend: str) -> None:
    # A writer that writes (and syncs) 2 MB when told, with two collectors on the same tree: one
    # reading I/O counters every read, one every 4th read and at closes (as gpuledger run does).
    # Between its I/O reads the second sees no new bytes, the next I/O read brings them all, and
    # the intervals both store are the same.
    code = (
        "import os, sys\n"
        "f = open(sys.argv[1], 'wb')\n"
        "for line in sys.stdin:\n"
        "    f.write(os.urandom(2_000_000)); f.flush(); os.fsync(f.fileno())\n"
        "    print('ok', flush=True)\n"
    )
    exclude = frozenset(p.pid for p in psutil.Process().children())
    every, sparse = (
        ProcessTreeCollector(os.getpid(), exclude, include_root=False, backend=backend, io_every=n) for n in (1, 4)
    )
    target = os.path.join(os.environ.get("TMPDIR", "/var/tmp"), f"gpuledger-io-{os.getpid()}")
    proc = subprocess.Popen([sys.executable, "-c", code, target], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        assert every.read(0.0) is None and sparse.read(0.0) is None
        closes = {3, 7}
        ticks: dict[int, list[HostTick]] = {1: [], 4: []}
        for i in range(1, 11):
            proc.stdin.write(b"w\n")
            proc.stdin.flush()
            assert proc.stdout.readline() == b"ok\n"
            for n, c in ((1, every), (4, sparse)):
                tick = c.read(float(i), closes_interval=i in closes)
                assert tick is not None
                ticks[n].append(tick)
        if sum(t.write_b for t in ticks[1]) == 0:
            pytest.skip("the kernel reports no storage writes here (tmpfs, or no task I/O accounting)")
        assert all(t.write_b >= 2_000_000 for t in ticks[1])  # every read saw that tick's write
        # I/O read at the closes (3, 7) and every 4th read since the last I/O read (7 + 4 = 11: none).
        assert [i for i, t in enumerate(ticks[4], start=1) if t.write_b] == [3, 7]
        cuts = [(0, 3), (3, 7)]  # the two intervals closed: the same bytes whichever the cadence
        for a, b in cuts:
            assert sum(t.write_b for t in ticks[4][a:b]) == sum(t.write_b for t in ticks[1][a:b])
        # CPU is still read at every read (the writer waits on its stdin while both read).
        assert [t.cpu_s for t in ticks[4]] == pytest.approx([t.cpu_s for t in ticks[1]])
    finally:
        proc.stdin.close()
        proc.wait()
        with contextlib.suppress(FileNotFoundError):
            os.remove(target)
        every.close()
        sparse.close()
