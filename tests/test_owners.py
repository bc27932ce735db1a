"""Attribution of GPU processes (core/metering/owners.py, core/metering/cgroup_path.py): a table of every path shape."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuledger.collect.pid_owner import job_scope
from gpuledger.core.metering.cgroup_path import read_cgroup
from gpuledger.core.metering.owners import (
    WRAPPED_ANCESTOR,
    WRAPPED_ENVIRON,
    WRAPPED_RECORDER,
    allocation_problem,
    attribute,
    copied_labels,
    parse_label_patterns,
)
from gpuledger.node.claims import Allocation, Claims, ContainerClaim, JobClaim, PodClaim, ProcFacts

CID = "3f9c" + "a" * 60  # a Docker/containerd container id: 64 hex
POD = "7d1b1c1e-9f0a-4c2e-8e5f-0123456789ab"
POD_ = POD.replace("-", "_")  # the systemd driver writes the pod UID with underscores


def facts(cgroup: list[str], *, pid: int = 4242, start: int = 1000, uid: int = 1000, pgid: int = 4240,
          **kw: object) -> ProcFacts:  # fmt: skip
    return ProcFacts(pid=pid, start_ticks=start, ppid=1, pgid=pgid, sid=4200, uid=uid, cgroup=tuple(cgroup), **kw)


# (cgroup lines, container id, runtime, pod uid, QoS, slurm job, step, group key)
SHAPES = [
    # Docker, cgroup v1, cgroupfs driver: one line per controller
    (["12:memory:/docker/" + CID, "4:cpu,cpuacct:/docker/" + CID, "1:name=systemd:/docker/" + CID],
     CID, "docker", None, None, None, None, f"container:{CID}"),
    # Docker, cgroup v2, systemd driver
    (["0::/system.slice/docker-" + CID + ".scope"], CID, "docker", None, None, None, None, f"container:{CID}"),
    # Docker, cgroup v2, cgroupfs driver
    (["0::/docker/" + CID], CID, "docker", None, None, None, None, f"container:{CID}"),
    # hybrid host: v1 controllers name the container, the unified line does not
    (["0::/", "11:devices:/docker/" + CID], CID, "docker", None, None, None, None, f"container:{CID}"),
    # containerd outside Kubernetes (nerdctl, systemd)
    (["0::/system.slice/nerdctl-" + CID + ".scope"], CID, "containerd", None, None, None, None, f"container:{CID}"),
    # podman, rootful and rootless
    (["0::/machine.slice/libpod-" + CID + ".scope/container"], CID, "podman", None, None, None, None,
     f"container:{CID}"),
    (["0::/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-" + CID + ".scope"], CID, "podman",
     None, None, None, None, f"container:{CID}"),
    # Kubernetes, systemd driver: Burstable, BestEffort, Guaranteed (directly in kubepods.slice)
    (["0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + POD_ + ".slice/cri-containerd-" + CID
      + ".scope"], CID, "containerd", POD, "Burstable", None, None, f"container:{CID}"),
    (["0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + POD_ + ".slice/crio-" + CID
      + ".scope"], CID, "cri-o", POD, "BestEffort", None, None, f"container:{CID}"),
    (["0::/kubepods.slice/kubepods-pod" + POD_ + ".slice/cri-containerd-" + CID + ".scope"], CID, "containerd",
     POD, "Guaranteed", None, None, f"container:{CID}"),
    # Kubernetes, cgroupfs driver, cgroup v1 and v2
    (["0::/kubepods/burstable/pod" + POD + "/" + CID], CID, None, POD, "Burstable", None, None, f"container:{CID}"),
    (["5:memory:/kubepods/besteffort/pod" + POD + "/" + CID], CID, None, POD, "BestEffort", None, None,
     f"container:{CID}"),
    (["0::/kubepods/pod" + POD + "/" + CID], CID, None, POD, "Guaranteed", None, None, f"container:{CID}"),
    # a pod whose container's directory is hidden: the pod is the group
    (["0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + POD_ + ".slice"], None, None, POD,
     "Burstable", None, None, f"pod:{POD}"),
    # Slurm, cgroup v1 and v2
    (["4:memory:/slurm/uid_1000/job_4242/step_0/task_0", "3:cpuset:/slurm/uid_1000/job_4242/step_0"], None, None,
     None, None, "4242", "0", "slurm:4242.0"),
    (["0::/system.slice/slurmstepd.scope/job_4242/step_batch/user/task_0"], None, None, None, None, "4242", "batch",
     "slurm:4242.batch"),
    (["0::/slurm_node07/uid_1000/job_77"], None, None, None, None, "77", None, "slurm:77"),
    # cgroup namespace: the reader's root is below the process's cgroup
    (["0::/../../system.slice/docker-" + CID + ".scope"], CID, "docker", None, None, None, None, f"container:{CID}"),
    (["0::/../../kubepods.slice/kubepods-pod" + POD_ + ".slice/cri-containerd-" + CID + ".scope"], CID,
     "containerd", POD, "Guaranteed", None, None, f"container:{CID}"),
    (["0::/../slurmstepd.scope/job_9/step_1/user/task_0"], None, None, None, None, "9", "1", "slurm:9.1"),
    # a bare process in a login session: its process group
    (["0::/user.slice/user-1000.slice/session-3.scope"], None, None, None, None, None, None, "pgrp:1000:4240"),
    (["0::/"], None, None, None, None, None, None, "pgrp:1000:4240"),
    # a runtime's monitor (conmon) is not the container
    (["0::/machine.slice/libpod-conmon-" + CID + ".scope"], None, None, None, None, None, None, "pgrp:1000:4240"),
]  # fmt: skip


@pytest.mark.parametrize(("lines", "cid", "runtime", "pod", "qos", "job", "step", "key"), SHAPES)
def test_owner_of_every_cgroup_path_shape(lines, cid, runtime, pod, qos, job, step, key) -> None:
    owner = attribute(facts(lines), Claims())
    assert (owner.container_id, owner.runtime, owner.pod_uid, owner.pod_qos) == (cid, runtime, pod, qos)
    assert (owner.slurm_job, owner.slurm_step, owner.key) == (job, step, key)
    assert owner.uid == 1000 and not owner.wrapped


@pytest.mark.parametrize(("lines", "outside"), [
    (["0::/../../system.slice/docker-" + CID + ".scope"], True),
    (["0::/system.slice/docker-" + CID + ".scope"], False),
])  # fmt: skip
def test_paths_outside_the_cgroup_namespace_are_marked(lines, outside) -> None:
    # their directory is not under the reader's mount: the agent must not read counters there
    cg = read_cgroup(lines)
    assert cg.outside_ns is outside
    assert cg.scope == "/system.slice/docker-" + CID + ".scope"


def test_job_scope_covers_every_step_of_a_job_and_the_whole_container() -> None:
    # the wrapper's rule: an srun step of the same job is the run's, whatever the step
    assert job_scope(["0::/system.slice/slurmstepd.scope/job_4242/step_1/user/task_0"]) == (
        "/system.slice/slurmstepd.scope/job_4242"
    )
    assert read_cgroup(["0::/system.slice/slurmstepd.scope/job_4242/step_1/user/task_0"]).scope == (
        "/system.slice/slurmstepd.scope/job_4242/step_1"
    )
    k8s = "0::/kubepods/burstable/pod" + POD + "/" + CID
    assert job_scope([k8s]) == "/kubepods/burstable/pod" + POD + "/" + CID


def test_claims_name_the_container_and_pod_and_give_their_labels() -> None:
    lines = ["0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + POD_
             + ".slice/cri-containerd-" + CID + ".scope"]  # fmt: skip
    claims = Claims(
        containers={CID: ContainerClaim(CID, runtime="containerd", name="trainer", image="ultralytics:8",
                                        labels={"project": "defect-detection", "io.kubernetes.pod.name": "x"})},
        pods={POD: PodClaim(POD, "vision", "yolo-train-0", labels={"team": "vision", "project": "old",
                                                                   "model_version": "yolov10s"})},
    )  # fmt: skip
    owner = attribute(facts(lines), claims)
    assert (owner.pod_namespace, owner.pod_name, owner.container_name, owner.image) == (
        "vision",
        "yolo-train-0",
        "trainer",
        "ultralytics:8",
    )
    # the container's label wins over the pod's; keys outside the patterns stay behind
    assert owner.labels == {"team": "vision", "project": "defect-detection", "model_version": "yolov10s"}
    assert owner.display_name() == "vision/yolo-train-0:trainer"


def test_labels_from_the_environment_give_way_to_the_platforms() -> None:
    lines = ["0::/docker/" + CID]
    env = {"team": "env-team", "project": "env-project"}
    claims = Claims(containers={CID: ContainerClaim(CID, labels={"team": "vision"})})
    assert attribute(facts(lines, env_labels=env), claims).labels == {"team": "vision", "project": "env-project"}
    assert attribute(facts(["0::/"], env_labels=env), Claims()).labels == env


def test_namespaced_labels_win_and_lose_their_prefix() -> None:
    labels = {"team": "a", "gpuledger.team": "b", "gpuledger.cost_center": "42", "other": "x"}
    assert copied_labels(("team", "gpuledger.*"), labels) == {"team": "b", "cost_center": "42"}
    assert copied_labels(("team",), labels) == {"team": "a"}
    assert parse_label_patterns(" team, project ,gpuledger.*") == ("team", "project", "gpuledger.*")
    for bad in ("", "team=x", "a b"):
        with pytest.raises(ValueError):
            parse_label_patterns(bad)


def test_slurm_job_hidden_from_the_path_is_confirmed_by_the_job_claims_pids() -> None:
    # Slurm 26.05 may run steps in cgroups whose path names no job: scontrol listpids says whose it is
    hidden = ["0::/system.slice/slurmstepd.scope/user/task_0"]
    claims = Claims(jobs={
        "900": JobClaim("900", user="ana", account="vision", pids=frozenset({1, 2})),
        "901": JobClaim("901", step="0", user="bo", account="nlp", pids=frozenset({4242})),
        "901.all": JobClaim("901", user="bo", account="nlp", pids=frozenset({4242, 4243})),
    })  # fmt: skip
    owner = attribute(facts(hidden), claims)
    assert (owner.slurm_job, owner.slurm_step, owner.slurm_from, owner.key) == ("901", "0", "claim", "slurm:901.0")
    assert (owner.slurm_user, owner.slurm_account) == ("bo", "nlp")
    # a job named by the path is the path's, whatever the claims list
    in_path = attribute(facts(["0::/system.slice/slurmstepd.scope/job_77/step_0"]), claims)
    assert (in_path.slurm_job, in_path.slurm_from) == ("77", "cgroup")
    # claims that list no pids cannot place a process
    assert attribute(facts(hidden), Claims(jobs={"5": JobClaim("5")})).key == "pgrp:1000:4240"


def test_pid_reuse_is_another_process_with_another_owner() -> None:
    first = attribute(facts(["0::/docker/" + CID], pid=500, start=1000), Claims())
    reused = attribute(facts(["0::/user.slice/user-1000.slice/session-2.scope"], pid=500, start=98000, pgid=500),
                       Claims())  # fmt: skip
    assert (first.pid, first.start_ticks) == (500, 1000)
    assert (reused.pid, reused.start_ticks) == (500, 98000)
    assert first.key == f"container:{CID}" and reused.key == "pgrp:1000:500"


def test_one_rule_decides_whether_a_process_is_wrapped() -> None:
    bare = ["0::/user.slice/user-1000.slice/session-3.scope"]
    by_env = attribute(facts(bare, run_id="0190abcd-run"), Claims())
    assert (by_env.wrapped_by, by_env.run_id) == (WRAPPED_ENVIRON, "0190abcd-run")
    # gpuledger.track(): the recorder is the process itself (its id is not in /proc/<pid>/environ)
    own = attribute(facts(bare, pid=77), Claims(), recorders={77: "track-run"})
    assert (own.wrapped_by, own.run_id) == (WRAPPED_RECORDER, "track-run")
    # a child of a recorder whose environment could not be read
    child = attribute(facts(bare, ancestors=(60, 1), environ_readable=False), Claims(), recorders={60: "r60"})
    assert (child.wrapped_by, child.run_id) == (WRAPPED_RECORDER, "r60")
    # under `gpuledger run` recorded in another ledger: wrapped, run unknown
    foreign = attribute(facts(bare, ancestors=(61, 1), wrapper_pid=61, environ_readable=False), Claims())
    assert (foreign.wrapped_by, foreign.run_id) == (WRAPPED_ANCESTOR, None)
    assert attribute(facts(bare, environ_readable=False), Claims()).wrapped_by is None


def test_allocation_against_use() -> None:
    owner = attribute(facts(["0::/kubepods/pod" + POD + "/" + CID]), Claims())
    allocs = [Allocation("GPU-a", "pod", POD), Allocation("GPU-b", "job", "12")]
    assert allocation_problem(owner, "GPU-a", allocs) is None
    assert "not allocated (allocated: GPU-a)" in (allocation_problem(owner, "GPU-b", allocs) or "")
    # a MIG slice of an allocated GPU is allocated with it
    assert allocation_problem(owner, "MIG-1", allocs, parents={"MIG-1": "GPU-a"}) is None
    # an owner with no allocation on a GPU allocated to someone else
    bare = attribute(facts(["0::/"]), Claims())
    assert allocation_problem(bare, "GPU-b", allocs) == "uses GPU GPU-b, which is allocated to job 12"
    assert allocation_problem(bare, "GPU-c", allocs) is None  # nobody claims it: nothing to say


@given(st.lists(st.text(max_size=120), max_size=6))
def test_any_cgroup_text_parses_without_error_and_finds_ids_only_where_written(lines: list[str]) -> None:
    cg = read_cgroup(lines)
    if cg.container_id is not None:
        assert any(cg.container_id in line for line in lines)
    if cg.pod_uid is not None:
        assert any(cg.pod_uid in line or cg.pod_uid.replace("-", "_") in line for line in lines)
