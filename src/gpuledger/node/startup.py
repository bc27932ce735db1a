"""What the agent can and cannot see, said once at start (and what each gap costs)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from gpuledger.core.model import GpuIdentity
from gpuledger.node.sources import SourceState


@dataclass(frozen=True)
class Seen:
    """The facts the start report is made of (gathered by the CLI, so this stays testable)."""

    gpus: Sequence[GpuIdentity]
    gpu_note: str | None  # why there are none
    host_pids: bool  # /proc shows the host's PID namespace
    environ_others: bool  # other users' /proc/<pid>/environ is readable
    uid: int
    cgroup_root: str
    cgroup_version: int | None  # 2, 1, or None (no hierarchy found)
    sources: Sequence[SourceState]
    disabled: Sequence[str]  # adapters switched off on the command line
    ledger: str
    server: str | None
    metrics: str | None  # "127.0.0.1:9400", or None
    gpu_retry: bool = False  # without GPUs, NVML is tried again every minute


def cgroup_version(root: str) -> int | None:
    if os.path.isfile(os.path.join(root, "cgroup.controllers")):
        return 2
    if os.path.isdir(os.path.join(root, "memory")) or os.path.isdir(os.path.join(root, "cpuacct")):
        return 1
    return None


def report(seen: Seen) -> list[str]:
    """One line per fact, ``ok``/``--`` first: what works and what does not, with its cost."""
    out = []
    if seen.gpus:
        names = sorted({g.name for g in seen.gpus})
        driver = next((g.driver_version for g in seen.gpus if g.driver_version), None)
        source = seen.gpus[0].source
        out.append(f"ok  GPUs: {len(seen.gpus)} ({', '.join(names)}; {source}"
                   + (f", driver {driver}" if driver else "") + ")")  # fmt: skip
    else:
        again = "until NVML answers (tried again every minute)" if seen.gpu_retry else "(no GPU to read)"
        out.append(f"--  no GPU readable: {seen.gpu_note}; nothing is metered {again}")
    if seen.host_pids:
        out.append("ok  host PID namespace: GPU processes are looked up by the pids NVML reports")
    else:
        out.append(
            "--  not in the host's PID namespace: NVML reports host pids this agent cannot look up, so "
            "no process can be attributed (run it with --pid=host, or hostPID: true in Kubernetes)"
        )
    if seen.environ_others:
        out.append("ok  process environments readable: GPULEDGER_RUN_ID marks wrapped runs")
    else:
        out.append(f"--  other users' process environments are not readable (uid {seen.uid}, no CAP_SYS_PTRACE): a "
                   "wrapped process is recognised by its `gpuledger run` ancestor or its recorder in this ledger; "
                   "their storage bytes read 0 without a cgroup")  # fmt: skip
    if seen.cgroup_version is not None:
        out.append(f"ok  cgroup v{seen.cgroup_version} at {seen.cgroup_root}: CPU, memory and I/O of containers, "
                   "pods and Slurm steps from their cgroups")  # fmt: skip
    else:
        out.append(f"--  no cgroup hierarchy under {seen.cgroup_root}: host figures come from each run's "
                   "process tree in /proc")  # fmt: skip
    for s in seen.sources:
        status = s.status.removeprefix(f"{s.name}: ") if s.status else None  # some adapters name themselves
        if not s.sees:  # /metrics says the same: gpuledger_agent_source_up 0
            out.append(f"--  {s.name}: {status or 'no answer'}")
        else:  # it sees its platform; a status is then a partial problem (a log refused, an unknown GPU id)
            out.append(f"ok  {s.name}" + (f" (but: {status})" if status else ""))
    for name in seen.disabled:
        out.append(f"--  {name}: switched off")
    out.append(f"ok  ledger: {seen.ledger}")
    if seen.server:
        out.append(f"ok  pushing to {seen.server} (through the local ledger's outbox)")
    else:
        out.append("--  no --server: runs stay in the local ledger (push later with gpuledger sync --all)")
    out.append(f"ok  /metrics on http://{seen.metrics}/metrics" if seen.metrics else "--  no /metrics (--metrics-port)")
    return out
