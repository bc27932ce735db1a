"""One discovered run while the agent records it: its record, GPUs, ticks, intervals and members.

A track is fed by the agent's loop: each tick adds, per GPU it holds, the GPU's figures with its
own processes' memory and SM share (``GpuTick.proc_*``, exactly as a wrapped run on a shared GPU
records them, so the cost code's shared-GPU split works unchanged), and a reading of its host
collector (its cgroup, or its process tree). At every interval boundary of the agent the ticks
merge into intervals (core/metering/intervals.py), numbered per device from the seqs the ledger already
holds for a resumed run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pwd
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from gpuledger.collect.base import HostCollector
from gpuledger.core.ids import uuid7
from gpuledger.core.metering.intervals import merge_gpu_ticks, merge_host_ticks
from gpuledger.core.metering.owners import Owner
from gpuledger.core.model import (
    DISCOVERED,
    Event,
    GpuIdentity,
    GpuInterval,
    GpuTick,
    HostInterval,
    Metric,
    RunRecord,
)
from gpuledger.core.redaction.records import redact_run_fields
from gpuledger.core.redaction.redact import Redactor
from gpuledger.node.claims import ProcFacts
from gpuledger.node.discovered_epochs import EpochTaker

META_KEY = "node"  # RunRecord.meta["node"]: the agent's own facts about a discovered run
MAX_MEMBERS_KEPT = 16  # members written to the run's metadata (resuming a process-group run checks them)
KEPT_INTERVALS = 4096  # GPU intervals kept for an evaluation's window (node/discovered_eval.py); older ones drop


@dataclass
class Closed:
    """What one interval boundary hands the ledger for one track."""

    gpu: list[GpuInterval] = field(default_factory=list)
    host: HostInterval | None = None
    events: list[Event] = field(default_factory=list)
    metrics: list[Metric] = field(default_factory=list)  # training metrics read from its log


class RunTrack:
    """A discovered run being recorded (module doc)."""

    def __init__(self, run: RunRecord, owner: Owner, host: HostCollector | None, host_how: str | None) -> None:
        self.run = run
        self.owner = owner
        self.key = owner.key
        self.host = host
        self.host_how = host_how  # "cgroup", "processes" or None (why in an event)
        self.members: dict[int, int] = {}  # pid -> start ticks of every process it had on a GPU
        self.devices: dict[str, GpuIdentity] = {}
        self.gpu_seq: dict[str, int] = {}
        self.host_seq = 0
        self.last_on_gpu: float = run.started_at
        self.ending_at: float | None = None  # its end was decided: no more ticks
        self.exit_code: int | None = None
        self.end_reason: str | None = None
        self.written_meta: dict[str, object] | None = None  # the metadata the ledger holds
        self._gpu_ticks: dict[str, list[GpuTick]] = {}
        self._host_ticks = []  # type: list
        self._events: list[Event] = []
        self._metrics: list[Metric] = []
        self._said: set[object] = set()
        self.log: object | None = None  # its container's followed log (node/docker_logs.ContainerLog)
        self.epochs = EpochTaker()  # its epochs, from results.csv or that log (node/discovered_epochs.py)
        self.gpu_intervals: deque[GpuInterval] = deque(maxlen=KEPT_INTERVALS)  # closed, newest last

    # -- feeding ------------------------------------------------------------------------------
    def see(self, pid: int, start_ticks: int, now: float) -> bool:
        """A process of this run is on a GPU now; True when it is a new member."""
        self.last_on_gpu = now
        new = self.members.get(pid) != start_ticks
        self.members[pid] = start_ticks
        return new

    def add_device(self, ident: GpuIdentity) -> bool:
        if ident.uuid in self.devices:
            return False
        self.devices[ident.uuid] = ident
        return True

    def add_gpu_tick(self, tick: GpuTick) -> None:
        self._gpu_ticks.setdefault(tick.uuid, []).append(tick)

    def read_host(self, now: float, closing: bool) -> None:
        if self.host is None:
            return
        try:
            tick = self.host.read(now, closes_interval=closing)
        except Exception as exc:  # a collector bug must cost one reading, not the agent
            self.event(now, "sampler_error", f"host reading failed: {exc!r}", once=("host_error", type(exc).__name__))
            return
        if tick is not None:
            self._host_ticks.append(tick)

    def event(self, t: float, kind: str, message: str, *, once: object = None, **payload: object) -> None:
        """Record an event on the run; with ``once``, only the first time that key is seen."""
        if once is not None:
            if once in self._said:
                return
            self._said.add(once)
        self._events.append(Event(t=t, kind=kind, message=message, payload=dict(payload)))

    # -- intervals ----------------------------------------------------------------------------
    def close_interval(self) -> Closed:
        out = Closed()
        for uuid, ticks in self._gpu_ticks.items():
            if ticks:
                seq = self.gpu_seq.get(uuid, 0)
                out.gpu.append(merge_gpu_ticks(uuid, seq, ticks))
                self.gpu_seq[uuid] = seq + 1
        self._gpu_ticks = {}
        self.gpu_intervals.extend(out.gpu)
        if self._host_ticks:
            out.host = merge_host_ticks(self.host_seq, self._host_ticks)
            self.host_seq += 1
            self._host_ticks = []
        out.events, self._events = self._events, []
        out.metrics, self._metrics = self._metrics, []
        return out

    def add_metrics(self, metrics: Sequence[Metric]) -> None:
        self._metrics.extend(metrics)

    def continue_from(self, gpu_counts: dict[str, int], host_count: int) -> None:
        """A resumed run: its intervals continue after those the ledger holds (seqs are 0, 1, 2 ...)."""
        for uuid, n in gpu_counts.items():
            self.gpu_seq[uuid] = max(self.gpu_seq.get(uuid, 0), n)
        self.host_seq = max(self.host_seq, host_count)

    def close(self) -> None:
        if self.host is not None:
            with contextlib.suppress(Exception):  # the files may be gone with the container
                self.host.close()

    # -- metadata -----------------------------------------------------------------------------
    def meta(self, boot_id: str | None) -> dict[str, object]:
        members = sorted(self.members.items())[:MAX_MEMBERS_KEPT]
        return {"key": self.key, "owner": self.owner.chain(), "boot_id": boot_id,
                "members": [[p, s] for p, s in members], "host_figures": self.host_how}  # fmt: skip


def gpu_share(tick: GpuTick, mine: Sequence[tuple[int | None, float | None]], samples_seen: bool) -> GpuTick:
    """The GPU's tick with this run's processes' memory and SM share (``mine``: (mem_b, sm_pct)).

    Memory NVML cannot tell (MIG) makes the sum unknown. SM share: the run's processes' mean SM
    utilisation summed (at most 100); a process with no sample ran no kernel when the GPU returned
    samples for others (``samples_seen``); when it returned none at all the share is unknown.
    """
    mem: int | None = 0
    for m, _ in mine:
        mem = None if m is None or mem is None else mem + m
    sm = min(100.0, sum(s or 0.0 for _, s in mine)) if samples_seen else None
    return dataclasses.replace(tick, proc_mem_b=mem, proc_sm_util_pct=sm, proc_method="pid")


def user_name(uid: int, slurm_user: str | None = None) -> str:
    if slurm_user:
        return slurm_user
    try:
        return pwd.getpwuid(uid).pw_name
    except (KeyError, OverflowError):
        return f"uid{uid}"


def discovered_record(
    owner: Owner,
    facts: ProcFacts,
    *,
    now: float,
    started_at: float,
    host: str,
    interval_s: float,
    versions: dict[str, str],
    replayed: bool,
) -> RunRecord:
    """A new discovered run for ``owner``, first seen now in the process ``facts``; every text
    field redacted (a container name or a job name may hold a token), as the server does."""
    argv = list(facts.cmdline) or [f"pid {facts.pid}"]
    name = owner.display_name() or os.path.basename(argv[0])
    run = RunRecord(
        id=uuid7(int(now * 1000)),
        command=argv,
        user=user_name(owner.uid, owner.slurm_user),
        host=host,
        cwd="",
        started_at=started_at,
        name=name,
        status=DISCOVERED,
        labels=dict(owner.labels),
        versions=dict(versions),
        replayed=replayed,
        interval_s=interval_s,
    )
    fields = {f.name: getattr(run, f.name) for f in dataclasses.fields(run)}
    return dataclasses.replace(run, **redact_run_fields(Redactor.default(), fields))
