"""The agent's /proc facts (node/procfacts.py) read from crafted /proc trees, and from the real one."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuledger.node.procfacts import ProcReader, is_wrapper, parse_stat

CID = "c" * 64


def stat_line(pid: int, comm: str, *, state: str = "S", ppid: int = 1, pgid: int | None = None, sid: int = 1,
              utime: int = 0, start: int = 5000, threads: int = 1, rss: int = 100) -> str:  # fmt: skip
    # man 5 proc: pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt
    # utime stime cutime cstime priority nice num_threads itrealvalue starttime vsize rss ...
    pg = pid if pgid is None else pgid
    return (f"{pid} ({comm}) {state} {ppid} {pg} {sid} 0 -1 4194560 0 0 0 0 {utime} 0 0 0 20 0 {threads} 0 "
            f"{start} 1000000 {rss} 0 0 0\n")  # fmt: skip


def make_proc(root: Path, pid: int, comm: str = "python", *, uid: int = 1000, cgroup: str = "0::/",
              cmdline: list[str] | None = None, environ: dict[str, str] | None = None,
              environ_denied: bool = False, **stat: object) -> None:  # fmt: skip
    d = root / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    (d / "stat").write_text(stat_line(pid, comm, **stat))  # type: ignore[arg-type]
    (d / "status").write_text(f"Name:\t{comm}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
    (d / "cgroup").write_text(cgroup + "\n")
    (d / "cmdline").write_bytes(b"\0".join(a.encode() for a in (cmdline or [comm])) + b"\0")
    env = d / "environ"
    if env.is_dir():
        env.rmdir()
    if environ_denied:
        env.mkdir()  # reading it fails as a refused read would (the tests run as root, who reads any file)
    else:
        env.write_bytes(b"".join(f"{k}={v}\0".encode() for k, v in (environ or {"HOME": "/root"}).items()))


def test_stat_lines_with_odd_command_names() -> None:
    st = parse_stat(42, stat_line(42, "my (odd) name ) x", ppid=7, pgid=40, sid=3, utime=250, start=777).encode())
    assert (st.ppid, st.pgid, st.sid, st.start_ticks, st.cpu_ticks, st.state) == (7, 40, 3, 777, 250, "S")
    with pytest.raises(ValueError):
        parse_stat(1, b"garbage without a name")


@pytest.mark.parametrize(("argv", "wrapped"), [
    (["gpuledger", "run", "--", "python", "train.py"], True),
    (["/usr/local/bin/gpuledger", "run", "--name", "x", "--", "yolo"], True),
    (["/usr/bin/python3", "-m", "gpuledger", "run", "--", "python"], True),
    (["gpuledger", "agent"], False),
    (["python", "train.py", "gpuledger", "run"], False),  # an argument, not the program
    ([], False),
])  # fmt: skip
def test_a_wrapper_is_known_by_its_command_line(argv: list[str], wrapped: bool) -> None:
    assert is_wrapper(argv) is wrapped


def test_facts_of_a_wrapped_and_an_unwrapped_process(tmp_path: Path) -> None:
    make_proc(tmp_path, 100, "bash", uid=1000)
    make_proc(tmp_path, 200, "gpuledger", ppid=100, cmdline=["/usr/bin/python3", "-m", "gpuledger", "run", "--",
                                                               "python", "train.py"])  # fmt: skip
    make_proc(
        tmp_path,
        300,
        "python",
        ppid=200,
        pgid=300,
        uid=1000,
        cgroup="0::/system.slice/docker-" + CID + ".scope",
        cmdline=["python", "train.py", "--epochs", "3"],
        environ={
            "GPULEDGER_RUN_ID": "0190-run",
            "A": "b",
            "AWS_SECRET_ACCESS_KEY": "x",
            "GPULEDGER_TEAM": "vision",
            "GPULEDGER_LABELS": "model_version=yolov10s,bad,=x",
        },
    )
    make_proc(tmp_path, 400, "python", ppid=100, uid=1001, environ_denied=True)
    reader = ProcReader(str(tmp_path))
    f = reader.facts(300)
    assert f is not None
    assert (f.pid, f.ppid, f.pgid, f.uid, f.start_ticks) == (300, 200, 300, 1000, 5000)
    assert f.cgroup == ("0::/system.slice/docker-" + CID + ".scope",)
    assert f.cmdline == ("python", "train.py", "--epochs", "3")
    assert (f.run_id, f.environ_readable) == ("0190-run", True)
    assert f.env_labels == {"team": "vision", "model_version": "yolov10s"}  # nothing else of the environment
    assert f.ancestors == (200, 100) and f.wrapper_pid == 200
    other = reader.facts(400)
    assert other is not None and (other.run_id, other.environ_readable, other.uid) == (None, False, 1001)
    assert other.wrapper_pid is None and reader.environ_denied == 1
    assert reader.facts(999) is None  # not there (exited, or another PID namespace)


def test_pid_reuse_gives_a_new_process_its_own_facts(tmp_path: Path) -> None:
    make_proc(tmp_path, 500, cgroup="0::/docker/" + CID, start=1000, environ={"GPULEDGER_RUN_ID": "old"})
    reader = ProcReader(str(tmp_path))
    first = reader.facts(500)
    assert first is not None and first.run_id == "old" and reader.alive(500, 1000)
    make_proc(tmp_path, 500, cgroup="0::/user.slice/session-2.scope", start=98000)  # reaped, pid handed out again
    second = reader.facts(500)
    assert second is not None and (second.start_ticks, second.run_id) == (98000, None)
    assert second.cgroup == ("0::/user.slice/session-2.scope",)
    assert not reader.alive(500, 1000) and reader.alive(500, 98000)


def test_zombies_and_vanished_processes_are_not_alive(tmp_path: Path) -> None:
    make_proc(tmp_path, 600, state="Z", start=10)
    reader = ProcReader(str(tmp_path))
    assert not reader.alive(600, 10)
    assert not reader.alive(601, 10)


def test_namespace_boot_and_capabilities_from_the_tree(tmp_path: Path) -> None:
    reader = ProcReader(str(tmp_path))
    assert not reader.host_pid_namespace()  # no kthreadd: a container's /proc
    make_proc(tmp_path, 2, "kthreadd", ppid=0)
    (tmp_path / "2" / "comm").write_text("kthreadd\n")
    assert reader.host_pid_namespace()
    (tmp_path / "sys" / "kernel" / "random").mkdir(parents=True)
    (tmp_path / "sys" / "kernel" / "random" / "boot_id").write_text("b0b-1\n")
    (tmp_path / "stat").write_text("cpu  1 2 3\nbtime 1700000000\n")
    assert (reader.boot_id(), reader.boot_time()) == ("b0b-1", 1700000000.0)
    (tmp_path / "self").mkdir()
    (tmp_path / "self" / "status").write_text("CapEff:\t0000000000080000\n")  # CAP_SYS_PTRACE only
    assert reader.environ_readable_for_others()
    (tmp_path / "self" / "status").write_text("CapEff:\t0000000000000000\n")
    assert not reader.environ_readable_for_others()


def test_the_real_proc_for_a_child_we_start(tmp_path: Path) -> None:
    env = {**os.environ, "GPULEDGER_RUN_ID": "0190-real"}
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env=env)
    try:
        deadline = time.monotonic() + 10
        while b"sleep(30)" not in Path(f"/proc/{child.pid}/cmdline").read_bytes() and time.monotonic() < deadline:
            time.sleep(0.01)  # Popen may return before the child's exec shows in /proc
        f = ProcReader().facts(child.pid)
        assert f is not None and f.run_id == "0190-real" and f.uid == os.getuid()
        assert f.ppid == os.getpid() and os.getpid() in (f.ppid, *f.ancestors)
        assert f.cmdline[1:] == ("-c", "import time; time.sleep(30)")
    finally:
        child.kill()
        child.wait()
    assert not ProcReader().alive(child.pid, f.start_ticks)
