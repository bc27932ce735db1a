"""Which GPU processes are the run's: the pure rules (core/metering/gpu_procs.py) and the /proc facts (pid_owner.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuledger.collect.pid_owner import PidOwner, job_scope
from gpuledger.core.metering.gpu_procs import PROC_CGROUP, PROC_PID, PROC_PIDNS, ProcSample, attribute, sm_share

GiB = 2**30


# -- the rules ----------------------------------------------------------------------------------


def test_verified_pids_are_the_runs_and_others_are_not() -> None:
    m = attribute({10: GiB, 99: 5 * GiB}, {10: PROC_PID}, foreign_ns=False, holders=None)
    assert (m.mem_b, m.pids, m.method, m.all_ours) == (GiB, frozenset({10}), PROC_PID, False)


def test_unknown_memory_stays_unknown() -> None:
    m = attribute({10: None, 11: GiB}, {10: PROC_PID, 11: PROC_PID}, foreign_ns=False, holders=None)
    assert m.mem_b is None and m.method == PROC_PID  # MIG: usedGpuMemory None is not a measured 0


def test_a_gpu_with_no_process_holds_nothing_of_the_run() -> None:
    assert attribute({}, {}, foreign_ns=True, holders=0).mem_b == 0


def test_same_namespace_and_no_match_means_others_only() -> None:
    m = attribute({99: 5 * GiB}, {}, foreign_ns=False, holders=None)
    assert (m.mem_b, m.method) == (0, PROC_PID)


def test_foreign_namespace_attributes_by_device_node_holders() -> None:
    # a container: NVML lists host pid 401234 for the run's process, which holds /dev/nvidia0
    m = attribute({401234: 20 * GiB}, {}, foreign_ns=True, holders=1)
    assert (m.mem_b, m.method, m.all_ours) == (20 * GiB, PROC_PIDNS, True)


def test_foreign_namespace_with_more_processes_than_the_run_holds_is_unknown() -> None:
    m = attribute({401234: 20 * GiB, 401300: GiB}, {}, foreign_ns=True, holders=1)
    assert m.mem_b is None and m.method is None and "host pid" in (m.reason or "")
    assert attribute({401234: GiB}, {}, foreign_ns=True, holders=0).mem_b is None


def test_sm_share_drops_stale_and_impossible_samples() -> None:
    m = attribute({10: GiB, 99: GiB}, {10: PROC_PID}, foreign_ns=False, holders=None)
    rows = [
        ProcSample(*r)
        for r in ((10, 900, 40.0), (10, 1_100, 60.0), (10, 1_200, 250.0), (99, 1_150, 30.0), (10, 1_300, 80.0))
    ]
    share, newest = sm_share(rows, m, cursor_us=1_000)
    assert share == pytest.approx(70.0)  # (60 + 80) / 2; 900 is stale, 250 % impossible, 99 is not ours
    assert newest == 1_300


def test_sm_share_in_a_foreign_namespace() -> None:
    # the driver translated the process list (pid 10 is ours) but not the samples (host pid 401234)
    listed = frozenset({10})
    only_ours = attribute({10: GiB}, {10: PROC_PID}, foreign_ns=True, holders=1)
    assert sm_share([ProcSample(401234, 2_000, 50.0)], only_ours, 1_000, listed=listed, foreign_ns=True)[0] == 50.0
    shared = attribute({10: GiB, 11: GiB}, {10: PROC_PID}, foreign_ns=True, holders=1)
    assert (
        sm_share([ProcSample(401234, 2_000, 50.0)], shared, 1_000, listed=frozenset({10, 11}), foreign_ns=True)[0]
        is None
    )
    unknown = attribute({7: GiB, 8: GiB}, {}, foreign_ns=True, holders=1)
    assert sm_share([ProcSample(7, 2_000, 50.0)], unknown, 1_000)[0] is None


# -- the /proc facts ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("lines", "scope"),
    [
        (["0::/system.slice/docker-" + "a" * 64 + ".scope"], "/system.slice/docker-" + "a" * 64 + ".scope"),
        (["12:memory:/docker/" + "b" * 64, "1:name=systemd:/docker/" + "b" * 64], "/docker/" + "b" * 64),
        (["0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice/cri-containerd-" + "c" * 64
          + ".scope"], "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice/cri-containerd-"
         + "c" * 64 + ".scope"),
        (["0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0"], "/system.slice/slurmstepd.scope/job_4242"),
        (["4:cpuset:/slurm/uid_1000/job_77/step_batch"], "/slurm/uid_1000/job_77"),
        (["0::/user.slice/user-1000.slice/session-3.scope"], None),  # a shared login session is no scope
        (["0::/"], None),
    ],
)  # fmt: skip
def test_job_scope_of_cgroup_paths(lines, scope) -> None:
    assert job_scope(lines) == scope


def make_proc(root: Path, pid: int, *, comm: str = "python", ppid: int = 1, cgroup: str = "0::/",
              fds: dict[str, str] | None = None) -> None:  # fmt: skip
    d = root / str(pid)
    (d / "fd").mkdir(parents=True)
    (d / "stat").write_text(f"{pid} ({comm}) S {ppid} {pid} {pid} 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 100\n")
    (d / "cgroup").write_text(cgroup + "\n")
    for fd, target in (fds or {}).items():
        os.symlink(target, d / "fd" / fd)


def test_namespace_detection_and_device_node_holders(tmp_path: Path) -> None:
    host = tmp_path / "host"
    make_proc(host, 2, comm="kthreadd", ppid=0)
    assert not PidOwner(str(host)).foreign_ns
    container = tmp_path / "container"
    make_proc(container, 1, comm="sh", ppid=0)
    make_proc(container, 7, fds={"0": "/dev/null", "5": "/dev/nvidiactl", "6": "/dev/nvidia3", "7": "/dev/nvidia-uvm"})
    make_proc(container, 8, fds={"3": "/dev/nvidia1"})
    owner = PidOwner(str(container))
    assert owner.foreign_ns
    assert owner.minors(7) == frozenset({3}) and owner.minors(99) is None
    assert owner.holders({7, 8}, 3) == 1 and owner.holders({7, 8}, 1) == 1 and owner.holders({7}, None) is None
    # in a container a listed pid equal to ours counts only if that process holds an NVIDIA device
    assert owner.verified([7, 8, 1], {7, 1}) == {7: PROC_PID}


def test_processes_of_the_runs_container_or_job_are_the_runs_by_cgroup(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    make_proc(proc, 2, comm="kthreadd", ppid=0)
    job = "0::/system.slice/slurmstepd.scope/job_9/step_"
    make_proc(proc, 100, cgroup=job + "batch/user/task_0")  # the run (gpuledger's command)
    make_proc(proc, 200, cgroup=job + "0/user/task_0")  # an srun step of the same job: not in the tree
    make_proc(proc, 300, cgroup="0::/system.slice/slurmstepd.scope/job_10/step_0/user/task_0")
    owner = PidOwner(str(proc))
    assert owner.verified([100, 200, 300], {100}) == {100: PROC_PID, 200: PROC_CGROUP}
