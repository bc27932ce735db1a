"""Who owns a GPU process: a pure function of what /proc says and what the platforms claim.

The owner chain, most general first: user (uid) → container (its id from the cgroup path) →
Kubernetes pod (pod UID from the cgroup path; namespace, name and labels from the claims) → Slurm
job and step (from the cgroup path; where the path hides it — Slurm 26.05 may — from a job claim
whose ``scontrol listpids`` pids hold the process) → the ``gpuledger run`` that wraps it.

**Wrapped or not** — one rule, in this order (docs/AGENT.md):

1. the process's environment carries ``GPULEDGER_RUN_ID``: that run owns it;
2. the process, or one of its ancestors, is the recorder of a run the agent's ledger lists as
   running on this host (``recorders``: pid → run id): that run owns it (covers
   ``gpuledger.track()``, whose id is set after start and so is not in /proc/<pid>/environ);
3. one of its ancestors runs ``gpuledger run`` (``ProcFacts.wrapper_pid``; command lines are
   readable by everyone): a wrapped run owns it, its id unknown.

A wrapped process is metered by its own run and never becomes a discovered run, so no process is
counted twice. A process none of these recognise is discovered.

**Labels** (``Owner.labels``): those its environment sets as ``gpuledger run`` reads them
(``GPULEDGER_TEAM``, ``GPULEDGER_PROJECT``, ``GPULEDGER_LABELS``), then the configured keys of
its Slurm job's labels, then of its pod's, then of its container's (``copied_labels``): the most
specific wins.

**Grouping** (``Owner.key``): a discovered run is the processes of one container; else of one
pod; else of one Slurm job step; else of one process group of one user (a training, its
DataLoader workers and ``torchrun`` children share the process group; two trainings started from
one interactive shell do not).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from gpuledger.core.metering.cgroup_path import CgroupFacts, read_cgroup
from gpuledger.node.claims import Allocation, Claims, ContainerClaim, JobClaim, PodClaim, ProcFacts

DEFAULT_COPY_LABELS = ("team", "project", "model_version", "gpuledger.*")
NAMESPACED_PREFIX = "gpuledger."  # "gpuledger.team=x" on a container sets the run's "team" (and wins)

WRAPPED_ENVIRON = "environ"
WRAPPED_RECORDER = "recorder"
WRAPPED_ANCESTOR = "ancestor"


@dataclass(frozen=True)
class Owner:
    """The owner chain of one process (identified by pid and start time)."""

    pid: int
    start_ticks: int
    uid: int
    key: str  # the discovered run this process belongs to ("container:<id>", "pod:<uid>", ...)
    container_id: str | None = None
    runtime: str | None = None
    container_name: str | None = None
    image: str | None = None
    pod_uid: str | None = None
    pod_namespace: str | None = None
    pod_name: str | None = None
    pod_qos: str | None = None
    slurm_job: str | None = None
    slurm_step: str | None = None
    slurm_from: str | None = None  # "cgroup" or "claim": where the job id was read
    slurm_user: str | None = None
    slurm_account: str | None = None
    run_id: str | None = None  # the wrapped run (None: not wrapped, or wrapped by a run of unknown id)
    wrapped_by: str | None = None  # environ / recorder / ancestor; None: not wrapped
    labels: Mapping[str, str] = field(default_factory=dict)
    cgroup: CgroupFacts = field(default_factory=CgroupFacts)

    @property
    def wrapped(self) -> bool:
        return self.wrapped_by is not None

    def claim_ids(self) -> set[tuple[str, str]]:
        """(kind, id) under which platforms may allocate GPUs to this owner (Allocation.kind/owner)."""
        ids = set()
        if self.container_id:
            ids.add(("container", self.container_id))
        if self.pod_uid:
            ids.add(("pod", self.pod_uid))
        if self.slurm_job:
            ids.add(("job", self.slurm_job))
        return ids

    def chain(self) -> dict[str, object]:
        """The owner chain as plain data (kept in a discovered run's metadata)."""
        out: dict[str, object] = {"uid": self.uid}
        for name in ("container_id", "runtime", "container_name", "image", "pod_uid", "pod_namespace", "pod_name",
                     "pod_qos", "slurm_job", "slurm_step", "slurm_from", "slurm_account"):  # fmt: skip
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        if self.cgroup.scope is not None:
            out["cgroup"] = self.cgroup.scope
        return out

    def display_name(self) -> str | None:
        """A name for the discovered run: the container's, the pod's, the job's."""
        if self.pod_name:
            base = f"{self.pod_namespace}/{self.pod_name}" if self.pod_namespace else self.pod_name
            return f"{base}:{self.container_name}" if self.container_name else base
        if self.container_name:
            return self.container_name
        if self.container_id:
            return self.container_id[:12]
        if self.slurm_job:
            return f"slurm job {self.slurm_job}" + (f".{self.slurm_step}" if self.slurm_step else "")
        return None


def attribute(
    facts: ProcFacts,
    claims: Claims,
    *,
    recorders: Mapping[int, str] | None = None,
    copy_labels: Sequence[str] = DEFAULT_COPY_LABELS,
) -> Owner:
    """The owner of one process (module doc): pure, so every path shape is a table row in a test."""
    cg = read_cgroup(facts.cgroup)
    container: ContainerClaim | None = claims.containers.get(cg.container_id) if cg.container_id else None
    pod: PodClaim | None = claims.pods.get(cg.pod_uid) if cg.pod_uid else None
    job_id, step, slurm_from = cg.slurm_job, cg.slurm_step, "cgroup" if cg.slurm_job else None
    job: JobClaim | None = None
    if job_id is None:
        job = _job_by_pid(facts.pid, claims.jobs.values())
        if job is not None:
            job_id, step, slurm_from = job.job_id, job.step, "claim"
    else:
        job = claims.jobs.get(job_id)
    run_id, wrapped_by = _wrapped(facts, recorders or {})
    return Owner(
        pid=facts.pid,
        start_ticks=facts.start_ticks,
        uid=facts.uid,
        key=_key(facts, cg.container_id, cg.pod_uid, job_id, step),
        container_id=cg.container_id,
        runtime=(container.runtime if container is not None else None) or cg.runtime,
        container_name=container.name if container is not None else None,
        image=container.image if container is not None else None,
        pod_uid=cg.pod_uid,
        pod_namespace=pod.namespace if pod is not None else None,
        pod_name=pod.name if pod is not None else None,
        pod_qos=(pod.qos if pod is not None and pod.qos else None) or cg.pod_qos,
        slurm_job=job_id,
        slurm_step=step,
        slurm_from=slurm_from,
        slurm_user=job.user if job is not None else None,
        slurm_account=job.account if job is not None else None,
        run_id=run_id,
        wrapped_by=wrapped_by,
        labels={
            **facts.env_labels,  # what its environment says, as `gpuledger run` would read it
            **copied_labels(
                copy_labels,
                (job.labels if job is not None else {}),  # the least specific: a job may hold pods or containers
                (pod.labels if pod is not None else {}),
                (container.labels if container is not None else {}),
            ),
        },
        cgroup=cg,
    )


def _key(facts: ProcFacts, container: str | None, pod: str | None, job: str | None, step: str | None) -> str:
    if container:
        return f"container:{container}"
    if pod:
        return f"pod:{pod}"
    if job:
        return f"slurm:{job}" + (f".{step}" if step else "")
    return f"pgrp:{facts.uid}:{facts.pgid}"


def _job_by_pid(pid: int, jobs: Iterable[JobClaim]) -> JobClaim | None:
    """The job (most specific: a step over the whole job) whose listed pids hold ``pid``."""
    found = [j for j in jobs if j.pids is not None and pid in j.pids]
    found.sort(key=lambda j: (j.step is None, j.job_id, j.step or ""))
    return found[0] if found else None


def _wrapped(facts: ProcFacts, recorders: Mapping[int, str]) -> tuple[str | None, str | None]:
    if facts.run_id:
        return facts.run_id, WRAPPED_ENVIRON
    for pid in (facts.pid, *facts.ancestors):
        if pid in recorders:
            return recorders[pid], WRAPPED_RECORDER
    if facts.wrapper_pid is not None:
        return None, WRAPPED_ANCESTOR
    return None, None


def copied_labels(patterns: Sequence[str], *sources: Mapping[str, str]) -> dict[str, str]:
    """The labels a discovered run takes from its platforms, later ``sources`` winning (job,
    pod, then container). ``patterns`` are keys or shell-style globs (``gpuledger.*``); a key under the
    ``gpuledger.`` prefix is stored without it and wins over the bare key."""
    plain: dict[str, str] = {}
    namespaced: dict[str, str] = {}
    for source in sources:
        for key, value in source.items():
            if not any(fnmatch.fnmatchcase(key, p) for p in patterns):
                continue
            if key.startswith(NAMESPACED_PREFIX) and len(key) > len(NAMESPACED_PREFIX):
                namespaced[key[len(NAMESPACED_PREFIX) :]] = str(value)
            else:
                plain[key] = str(value)
    return {**plain, **namespaced}


def parse_label_patterns(text: str) -> tuple[str, ...]:
    """``"team,project,gpuledger.*"`` → the patterns; ValueError naming a bad one."""
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if any(c.isspace() for c in part) or "=" in part:
            raise ValueError(f"{part!r} is not a label key or a key pattern such as team or gpuledger.*")
        out.append(part)
    if not out:
        raise ValueError("give at least one label key, e.g. team,project,model_version")
    return tuple(out)


def allocation_problem(owner: Owner, gpu: str, allocations: Sequence[Allocation],
                       parents: Mapping[str, str] | None = None) -> str | None:  # fmt: skip
    """Why ``owner`` may not use ``gpu`` (None: allowed, or nothing claims it either way).

    The owner was allocated GPUs and ``gpu`` is not one of them; or it was allocated none and
    ``gpu`` is allocated to someone else. A MIG slice counts as allocated with its parent GPU.
    """
    held = {gpu, (parents or {}).get(gpu, gpu)}
    ids = owner.claim_ids()
    mine = [a for a in allocations if (a.kind, a.owner) in ids]
    if mine:
        if held & {a.gpu for a in mine}:
            return None
        granted = ", ".join(sorted({a.gpu for a in mine}))
        return f"uses GPU {gpu}, which it was not allocated (allocated: {granted})"
    others = sorted({f"{a.kind} {a.owner}" for a in allocations if a.gpu in held})
    if others:
        return f"uses GPU {gpu}, which is allocated to {', '.join(others)}"
    return None
