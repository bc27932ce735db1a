"""What a process's cgroup lines say about who runs it: container, pod, Slurm job (pure).

``/proc/<pid>/cgroup`` has one line per hierarchy, ``hierarchy-ID:controllers:path``: cgroup v2 is
the single line ``0::/path``; cgroup v1 has a line per controller (``4:memory:/docker/<id>``) and
hybrid hosts have both. The shapes runtimes and schedulers give those paths:

==========================  ==========================================================================
Docker, cgroupfs driver     ``/docker/<64 hex>``
Docker, systemd driver      ``/system.slice/docker-<64 hex>.scope``
containerd (CRI, systemd)   ``.../cri-containerd-<64 hex>.scope``; nerdctl ``nerdctl-<id>.scope``
CRI-O                       ``.../crio-<64 hex>.scope`` (``crio-conmon-<id>.scope`` is its monitor)
podman                      ``/machine.slice/libpod-<64 hex>.scope[/container]``; rootless under
                            ``user@<uid>.service``; ``libpod-conmon-<id>.scope`` is its monitor
Kubernetes, systemd         ``/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid
                            with _>.slice/<runtime>-<id>.scope``; Guaranteed pods sit directly in
                            ``kubepods.slice`` (``kubepods-pod<uid>.slice``)
Kubernetes, cgroupfs        ``/kubepods/burstable/pod<uid>/<64 hex>``, ``/kubepods/besteffort/...``,
                            Guaranteed ``/kubepods/pod<uid>/<64 hex>``
Slurm, cgroup v1            ``/slurm/uid_<uid>/job_<id>/step_<step>/task_<n>`` (``slurm_<node>`` with
                            several slurmd per host)
Slurm, cgroup v2            ``/system.slice/slurmstepd.scope/job_<id>/step_<step>/user/task_<n>``
==========================  ==========================================================================

A reader inside a cgroup namespace sees paths relative to its own root; a cgroup outside it
starts with ``/..`` components. The ids after them are still the process's, but the directory is
not under the reader's cgroup mount (``outside_ns``): its counters cannot be read from there.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

_HEX64 = r"[0-9a-f]{64}"
# "<runtime>-<id>.scope" (systemd drivers) or a bare id component (cgroupfs drivers).
_SCOPED_ID = re.compile(rf"^(?P<runtime>[a-z][a-z0-9-]*?)-(?P<id>{_HEX64})\.scope$")
_BARE_ID = re.compile(rf"^(?P<id>{_HEX64})$")
_MONITORS = ("crio-conmon", "libpod-conmon")  # a runtime's monitor process, not the container
_RUNTIMES = {"docker": "docker", "cri-containerd": "containerd", "crio": "cri-o", "libpod": "podman",
             "nerdctl": "containerd", "cri-dockerd": "docker"}  # fmt: skip
_POD = re.compile(r"^(?:kubepods-(?:(?P<qos>burstable|besteffort)-)?)?pod(?P<uid>[0-9a-f]{8}[-_][0-9a-f]{4}[-_]"
                  r"[0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})(?:\.slice)?$")  # fmt: skip
_QOS_DIR = {"burstable": "Burstable", "besteffort": "BestEffort",
            "kubepods-burstable.slice": "Burstable", "kubepods-besteffort.slice": "BestEffort"}  # fmt: skip
_JOB = re.compile(r"^job_(?P<id>\d+)$")
_STEP = re.compile(r"^step_(?P<step>[A-Za-z0-9_]+)$")
_SLURM_UID = re.compile(r"^uid_(?P<uid>\d+)$")


@dataclass(frozen=True)
class CgroupPath:
    """One hierarchy's line: ``controllers`` is ``()`` for cgroup v2's unified line."""

    hierarchy: str
    controllers: tuple[str, ...]
    path: str  # as written, "/.." prefixes included

    @property
    def unified(self) -> bool:
        return self.hierarchy == "0" and not self.controllers


@dataclass(frozen=True)
class CgroupFacts:
    """What the cgroup lines tell about a process (None: the paths do not say)."""

    container_id: str | None = None
    runtime: str | None = None  # docker, containerd, cri-o, podman; None when the path does not say
    pod_uid: str | None = None  # with dashes, as the API server writes it
    pod_qos: str | None = None  # Guaranteed, Burstable, BestEffort
    slurm_job: str | None = None
    slurm_step: str | None = None
    slurm_uid: int | None = None
    scope: str | None = None  # the container's, else pod's, else job step's (else job's) cgroup, path form
    job_scope: str | None = None  # the container's, else the whole Slurm job's cgroup (all its steps)
    outside_ns: bool = False  # the paths climb out of the reader's cgroup namespace ("/..")
    paths: tuple[CgroupPath, ...] = ()

    def path_for(self, controller: str | None) -> CgroupPath | None:
        """The line of a v1 ``controller`` (e.g. "memory"), or the v2 unified line for None."""
        for p in self.paths:
            if (controller is None and p.unified) or (controller is not None and controller in p.controllers):
                return p
        return None


def parse_lines(lines: Iterable[str]) -> tuple[CgroupPath, ...]:
    """The lines of /proc/<pid>/cgroup; malformed ones are skipped."""
    out = []
    for line in lines:
        parts = line.strip().split(":", 2)
        if len(parts) != 3 or not parts[2].startswith("/"):
            continue
        hierarchy, controllers, path = parts
        out.append(CgroupPath(hierarchy, tuple(c for c in controllers.split(",") if c), path))
    return tuple(out)


def _components(path: str) -> tuple[list[str], bool]:
    parts = [p for p in path.split("/") if p]
    climbed = False
    while parts and parts[0] == "..":
        parts.pop(0)
        climbed = True
    return parts, climbed


def _scope(parts: list[str], end: int | None) -> str | None:
    return None if end is None else "/" + "/".join(parts[: end + 1])


def _read_path(path: str) -> CgroupFacts:
    parts, climbed = _components(path)
    container = runtime = pod = qos = job = step = None
    slurm_uid: int | None = None
    ends: dict[str, int] = {}  # where the container's, pod's, job's and step's directories end
    kube = False
    for i, part in enumerate(parts):
        if part in ("kubepods", "kubepods.slice"):
            kube, qos = True, "Guaranteed"  # unless a QoS level follows
        elif kube and part in _QOS_DIR:
            qos = _QOS_DIR[part]
        elif (m := _POD.match(part)) is not None:
            pod, ends["pod"] = m.group("uid").replace("_", "-"), i
            qos = _QOS_DIR[m.group("qos")] if m.group("qos") else (qos or "Guaranteed")
        elif (m := _SCOPED_ID.match(part)) is not None and m.group("runtime") not in _MONITORS:
            container, runtime = m.group("id"), _RUNTIMES.get(m.group("runtime"), m.group("runtime"))
            ends["container"] = i
            break
        elif (m := _BARE_ID.match(part)) is not None:
            container, ends["container"] = m.group("id"), i
            runtime = "docker" if i > 0 and parts[i - 1] == "docker" else None
            break
        elif (m := _SLURM_UID.match(part)) is not None:
            slurm_uid = int(m.group("uid"))
        elif (m := _JOB.match(part)) is not None:
            job, ends["job"] = m.group("id"), i
        elif job is not None and (m := _STEP.match(part)) is not None:
            step, ends["step"] = m.group("step"), i
            break
    first = next((ends[k] for k in ("container", "pod", "step", "job") if k in ends), None)
    job_end = ends.get("container", ends.get("job"))
    return CgroupFacts(container, runtime, pod, qos if pod else None, job, step, slurm_uid,
                       _scope(parts, first), _scope(parts, job_end), climbed)  # fmt: skip


_MERGED = ("container_id", "runtime", "pod_uid", "pod_qos", "slurm_job", "slurm_step", "slurm_uid", "scope",
           "job_scope")  # fmt: skip


def read_cgroup(lines: Iterable[str]) -> CgroupFacts:
    """Everything the lines tell, merged: the unified (v2) line first, then each v1 line.

    On a hybrid host the v1 controllers (where runtimes put containers) may say more than the v2
    line; facts found on any line count, the first line to name a scope sets it.
    """
    paths = parse_lines(lines)
    ordered = sorted(paths, key=lambda p: (not p.unified, p.hierarchy))
    merged: dict[str, object] = {}
    climbed = False
    for p in ordered:
        facts = _read_path(p.path)
        climbed = climbed or facts.outside_ns
        for name in _MERGED:
            value = getattr(facts, name)
            if value is not None and merged.get(name) is None:
                merged[name] = value
    return CgroupFacts(**merged, outside_ns=climbed, paths=paths)  # type: ignore[arg-type]
