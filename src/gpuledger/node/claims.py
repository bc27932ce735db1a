"""What the node's platforms claim: the contract between platform adapters and attribution.

Attribution (``core/metering/owners.py``) is a pure function of two kinds of facts:

* ``ProcFacts`` — what /proc says about one GPU process (who, when, which cgroup, whether a
  ``gpuledger run`` wraps it: its environment's run id, its ancestors); ``node/procfacts.py``
  reads them;
* ``Claims`` — what the platforms say: containers (Docker Engine API), pods and their device
  allocations (kubelet pod-resources, API server labels), Slurm jobs and their allocated GPUs.

Each platform adapter is a ``ClaimSource``: it keeps its own connection, refreshes what it knows
at most as often as it needs, never raises from ``claims()`` (a platform that went away answers
with what it last knew and says so in ``status()``), and is closed at exit. Allocation ("who may
use a GPU") is kept apart from use ("who does": NVML's process lists): a process using a GPU its
owner was not allocated is an event, not a silent guess. Only ``Claims.allocations`` is compared
with use, so an adapter that knows a container's or job's GPUs resolves them to NVML UUIDs there.

How the agent finds an adapter: the module ``gpuledger.node.docker`` / ``.kubelet`` / ``.slurm``
offers ``open_source(options: SourceOptions) -> ClaimSource``. It may block (connecting) but
should not raise for a platform that is absent: it returns a source whose ``status()`` says so.
The agent (``node/sources.py``) opens and polls each source in its own thread: a source that is
slow or hangs delays only its own claims (the agent keeps using the last ones it got), and one that
raises despite the contract is caught, reported as its status and polled again later.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class ProcFacts:
    """One process as /proc shows it. ``(pid, start_ticks)`` identifies it across pid reuse."""

    pid: int
    start_ticks: int  # /proc/<pid>/stat field 22: start time in clock ticks since boot
    ppid: int
    pgid: int  # process group: a training and its workers (DataLoader, torchrun children)
    sid: int
    uid: int
    cgroup: tuple[str, ...]  # the lines of /proc/<pid>/cgroup, as read
    run_id: str | None = None  # GPULEDGER_RUN_ID from its environment: a wrapped run owns it
    cmdline: tuple[str, ...] = ()
    # Added for attribution (core/metering/owners.py); defaults keep older callers valid.
    ancestors: tuple[int, ...] = ()  # parent, grandparent ... up to (not including) pid 1
    wrapper_pid: int | None = None  # nearest ancestor whose command line is ``gpuledger run``
    environ_readable: bool = True  # False: /proc/<pid>/environ could not be read (run_id unknown)
    # Labels its environment sets the way `gpuledger run` reads them (GPULEDGER_TEAM, _PROJECT, _LABELS)
    env_labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ContainerClaim:
    """A container as its runtime describes it."""

    id: str  # the full container id (64 hex for Docker)
    runtime: str = "docker"
    name: str | None = None
    image: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    # GPUs it was given (NVIDIA_VISIBLE_DEVICES / device requests): UUIDs or indices; ("all",); None: unknown
    gpus: tuple[str, ...] | None = None
    pid: int | None = None  # its init process, host pid
    started_at: float | None = None
    finished_at: float | None = None
    exit_code: int | None = None


@dataclass(frozen=True)
class PodClaim:
    """A Kubernetes pod on this node (pod-resources + API server)."""

    uid: str
    namespace: str
    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    # container name -> GPU device ids allocated (UUID, MIG UUID; time-sliced "<id>::<n>" normalised to <id>)
    devices: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    qos: str | None = None  # Guaranteed, Burstable, BestEffort


@dataclass(frozen=True)
class JobClaim:
    """A Slurm job (or step) on this node."""

    job_id: str
    step: str | None = None
    user: str | None = None
    account: str | None = None
    partition: str | None = None
    gpus: tuple[str, ...] | None = None  # allocated GPUs: indices or UUIDs; None: unknown
    pids: frozenset[int] | None = None  # confirmed by `scontrol listpids`; None: not asked
    # Labels its submitter gave it (the job's comment, e.g. ``team=vision,project=x``), as a container's
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Allocation:
    """Who *may* use a GPU: ``kind`` "container" / "pod" / "job", ``owner`` its id."""

    gpu: str  # GPU or MIG UUID as NVML names it (adapters resolve indices)
    kind: str
    owner: str


@dataclass
class Claims:
    """Everything the platforms claim at one moment."""

    containers: dict[str, ContainerClaim] = field(default_factory=dict)
    pods: dict[str, PodClaim] = field(default_factory=dict)
    jobs: dict[str, JobClaim] = field(default_factory=dict)
    allocations: list[Allocation] = field(default_factory=list)

    def merge(self, other: Claims) -> Claims:
        return Claims(
            {**self.containers, **other.containers},
            {**self.pods, **other.pods},
            {**self.jobs, **other.jobs},
            [*self.allocations, *other.allocations],
        )


@dataclass(frozen=True)
class SourceOptions:
    """What ``gpuledger agent`` hands every adapter's ``open_source`` (its command-line options)."""

    docker_socket: str = "/var/run/docker.sock"
    kubelet_socket: str = "/var/lib/kubelet/pod-resources/kubelet.sock"
    proc_root: str = "/proc"
    # The node's GPUs as NVML lists them, (index, uuid), MIG slices included: resolve indices with it
    gpus: tuple[tuple[int, str], ...] = ()


class ClaimSource(Protocol):
    """A platform adapter (Docker, kubelet, Slurm)."""

    name: str

    def claims(self, now: float) -> Claims:
        """What the platform claims now (or last knew); never raises."""

    def status(self) -> str | None:
        """None when fully working, else one line saying what it cannot see and why."""

    def close(self) -> None: ...
