"""Slurm: the jobs on this node, who submitted them, their GPUs and their processes (``ClaimSource`` "slurm").

What it reads, cheapest first (formats and their sources: ``slurm_files.py``, ``slurm_parse.py``):

1. **The prolog's files**, every 2 s, no Slurm call at all: the GPU → job mapping files
   (``/run/gpustat/<gpu>``, the jobstats / dcgm-exporter convention) and gpuledger's job facts
   files (``/run/gpuledger/slurm/<jobid>.job``: user, account, partition, comment, GPUs), both
   written by ``deploy/slurm/gpuledger-prolog.sh`` and removed by its epilog. When they are there
   they take precedence: they are what the prolog was told by slurmd, and they cost no RPC.
2. **``scontrol listpids``** (every step of every job on this node, in one call; it asks the local
   ``slurmstepd`` daemons, not slurmctld) every 10 s, and at once when the files show a new job:
   which processes belong to which job and step. This is what confirms a process's job when its
   cgroup path does not name it (Slurm 26.05 may hide job ids there).
3. **``scontrol show job -d <id>``** (an RPC to slurmctld), once per job and again every 10 minutes
   while it runs, only for a job the files do not describe: user, account, partition, comment, and
   the GRES indices of its GPUs on this node (``GRES=gpu:a100:2(IDX:0-1)``). At most 8 per round.
4. **``scontrol show node -d <node>``** (an RPC), every minute, only without a mapping directory
   (no prolog installed): the indices in use on the node (``GresUsed=gpu:a100:3(IDX:0-1,3)``), to
   say which GPUs Slurm gave to jobs this agent cannot see.

Every call runs in this adapter's own thread with a 5 s limit (``slurm_scontrol.py``); a call to
slurmctld that times out or fails backs off (30 s doubling to 5 min) and ``status()`` says so.
``claims(now)`` only reads memory: it never waits for Slurm.

**GPU indices.** Slurm's GRES indices, and the numbers in ``SLURM_JOB_GPUS`` and in the prolog's
``CUDA_VISIBLE_DEVICES``, are the node's device indices (the order of gres.conf; with
``AutoDetect=nvml``, NVML's order). They are taken to be NVML indices and resolved to UUIDs
through the agent's GPU list. Inside the job, ``CUDA_VISIBLE_DEVICES`` is renumbered from 0 when
``ConstrainDevices=yes`` confines it to its devices, so a job's own environment is never read for
this. On a node with MIG slices GRES indices do not name NVML GPUs: only the mapping files (which
name MIG UUIDs) are used there, and ``status()`` says when a job had only indices.

**Configuration** (the agent's environment): ``GPULEDGER_SLURM_NODE`` (this node's Slurm NodeName;
default: ``scontrol show aliases``, else the short host name), ``GPULEDGER_GPUSTAT_DIR`` (default
``/run/gpustat``), ``GPULEDGER_SLURM_JOB_DIR`` (default ``/run/gpuledger/slurm``).
"""

from __future__ import annotations

import os
import pwd
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gpuledger.node.claims import Allocation, Claims, JobClaim, SourceOptions
from gpuledger.node.slurm_files import GpuMapping, JobFacts, gpu_uuid, read_job_facts, read_mapping
from gpuledger.node.slurm_parse import (
    JobDetails,
    NodeDetails,
    SlurmFormatError,
    StepPids,
    comment_labels,
    hostlist_has,
    parse_job,
    parse_listpids,
    parse_node,
)
from gpuledger.node.slurm_scontrol import CallResult, Scontrol

DEFAULT_GPUSTAT_DIR = "/run/gpustat"
DEFAULT_JOB_DIR = "/run/gpuledger/slurm"
TICK_S = 2.0  # the prolog's files are read this often
LISTPIDS_EVERY_S = 10.0
NODE_EVERY_S = 60.0
JOB_TTL_S = 600.0  # a job's details (its comment may be updated) are asked again this often
CALL_TIMEOUT_S = 5.0
MAX_JOB_QUERIES = 8  # `show job` calls per round: a node full of new jobs does not flood slurmctld
BACKOFF_FIRST_S, BACKOFF_MAX_S = 30.0, 300.0
OPEN_WAIT_S = 4.0
MAX_PROBLEMS_SHOWN = 3
_NO_STEPS = "No job steps exist on this node"
_JOB_GONE = "Invalid job id"
_NODE_GONE = "not found"


def open_source(options: SourceOptions, env: Mapping[str, str] | None = None) -> SlurmSource:
    """The agent's way in (node/claims.py): the adapter, its first round done or under way."""
    env = dict(os.environ if env is None else env)
    source = SlurmSource(
        env,
        gpu_uuids={i: u for i, u in options.gpus if u.upper().startswith("GPU-")},  # MIG slices have no index
        mig=any(u.upper().startswith("MIG-") for _, u in options.gpus),
        node=env.get("GPULEDGER_SLURM_NODE", "").strip() or None,
        gpustat_dir=env.get("GPULEDGER_GPUSTAT_DIR", "").strip() or DEFAULT_GPUSTAT_DIR,
        job_dir=env.get("GPULEDGER_SLURM_JOB_DIR", "").strip() or DEFAULT_JOB_DIR,
    )
    source.start()
    source.wait_first(OPEN_WAIT_S)
    return source


@dataclass
class _Details:
    job: JobDetails | None  # None: slurmctld no longer knows the job
    at: float


class SlurmSource:
    """Slurm's jobs on this node, refreshed by a background thread (module doc)."""

    name = "slurm"

    def __init__(
        self,
        env: Mapping[str, str] | None = None,
        *,
        gpu_uuids: Mapping[int, str] | None = None,
        mig: bool = False,
        node: str | None = None,
        gpustat_dir: str = DEFAULT_GPUSTAT_DIR,
        job_dir: str = DEFAULT_JOB_DIR,
        call_timeout_s: float = CALL_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._scontrol = Scontrol(os.environ if env is None else env, call_timeout_s)
        self._by_index = dict(gpu_uuids or {})
        self._mig = mig
        self._node = node
        self._node_from = "GPULEDGER_SLURM_NODE" if node else None
        self._gpustat_dir = gpustat_dir
        self._job_dir = job_dir
        self._clock = clock
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._first = threading.Event()
        self._thread: threading.Thread | None = None
        self._claims = Claims()
        self._status: str | None = "no answer yet"
        # What the rounds learnt (touched by the refresher only; published through _claims/_status)
        self._mapping = GpuMapping(present=False)
        self._mapped: dict[str, set[str]] = {}
        self._facts: dict[str, JobFacts] = {}
        self._file_problems: list[str] = []
        self._steps: StepPids | None = None  # None: never listed
        self._listed_at: float | None = None  # last asked
        self._listed_ok_at: float | None = None  # last answered
        self._listed_jobs_files: set[str] = set()  # the files' jobs at the last listing
        self._listpids_error: str | None = None
        self._details: dict[str, _Details] = {}
        self._node_details: NodeDetails | None = None
        self._node_checked_at: float | None = None
        self._node_note: str | None = None
        self._ctld_error: str | None = None
        self._ctld_retry_at = 0.0
        self._ctld_backoff = BACKOFF_FIRST_S
        self._missing = False
        self._users: dict[int, str | None] = {}

    # -- the ClaimSource contract -------------------------------------------------------------------
    def claims(self, now: float) -> Claims:
        with self._lock:
            return self._claims

    def status(self) -> str | None:
        with self._lock:
            return self._status

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self._scontrol.timeout_s + 2.0)

    # -- running ------------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="gpuledger-slurm-refresh", daemon=True)
        self._thread.start()

    def wait_first(self, timeout_s: float) -> bool:
        """Wait for the first round's claims; False if it is still under way after ``timeout_s``."""
        return self._first.wait(timeout_s)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.refresh()
            self._stop.wait(TICK_S)

    def refresh(self) -> None:
        """One round (module doc). Never raises: a bug is said in ``status()`` and tried again."""
        try:
            self._round()
        except Exception as exc:  # one bad round must not end the thread
            with self._lock:
                self._status = f"slurm: unexpected {type(exc).__name__}: {exc}"
        finally:
            self._first.set()

    def _round(self) -> None:
        now = self._clock()
        self._mapping = read_mapping(self._gpustat_dir)
        self._mapped = self._mapping.jobs()  # job id -> the GPU names its mapping files give it
        self._facts, problems = read_job_facts(self._job_dir)
        self._file_problems = list(self._mapping.problems) + problems
        self._missing = self._scontrol.path() is None
        self._publish(now)  # the files alone already say a lot: claimed before any scontrol call
        if self._missing:
            return
        file_jobs = set(self._mapped) | set(self._facts)
        if self._node is None:
            self._resolve_node()
        new_in_files = file_jobs - self._listed_jobs_files
        if self._listed_at is None or now - self._listed_at >= LISTPIDS_EVERY_S or new_in_files:
            self._listpids(now, file_jobs)
        self._ask_jobs(self._active(), now)  # each call to slurmctld waits out its back-off
        if not self._mapping.present and now >= self._ctld_retry_at:
            self._ask_node(now)
        self._publish(now)

    # -- scontrol -----------------------------------------------------------------------------------
    def _call(self, *args: str) -> CallResult:
        return self._scontrol.run(*args)

    def _resolve_node(self) -> None:
        """``scontrol show aliases``: this host's NodeName(s) from slurm.conf; else the short host name."""
        result = self._call("show", "aliases")
        names = result.stdout.split() if result.ok else []
        if names:
            self._node, self._node_from = names[0], "scontrol show aliases"
        else:
            self._node, self._node_from = socket.gethostname().split(".", 1)[0], "the host name"

    def _listpids(self, now: float, file_jobs: set[str]) -> None:
        result = self._call("listpids")
        if result.ok or (result.rc == 1 and _NO_STEPS in result.stderr):
            self._steps = parse_listpids(result.stdout if result.ok else "")
            self._listed_at = self._listed_ok_at = now
            self._listpids_error = None
            self._listed_jobs_files = set(file_jobs)
        else:
            self._listpids_error = f"`scontrol listpids` {result.why}"
            self._listed_at = now  # tried: asked again on the usual cadence, not every tick
            self._listed_jobs_files = set(file_jobs)

    def _ask_jobs(self, active: set[str], now: float) -> None:
        for job_id in list(self._details):
            if job_id not in active:
                del self._details[job_id]
        asked = 0
        for job_id in sorted(active, key=int):
            if asked >= MAX_JOB_QUERIES or now < self._ctld_retry_at:
                return
            known = self._details.get(job_id)
            if not self._needs_details(job_id) or (known is not None and now - known.at < JOB_TTL_S):
                continue
            asked += 1
            result = self._call("show", "job", "-d", job_id)
            if result.ok:
                try:
                    self._details[job_id] = _Details(parse_job(result.stdout, self._node or ""), now)
                except SlurmFormatError as exc:
                    self._ctld_failed(f"`scontrol show job -d {job_id}` printed what it should not ({exc})", now)
                    return
                self._ctld_ok()
            elif _JOB_GONE in result.message():
                self._details[job_id] = _Details(None, now)
                self._ctld_ok()
            else:
                self._ctld_failed(f"`scontrol show job -d {job_id}` {result.why}", now)
                return

    def _needs_details(self, job_id: str) -> bool:
        """Only what the files do not say is asked of slurmctld."""
        facts = self._facts.get(job_id)
        has_gpus = job_id in self._mapped or (facts is not None and facts.gpus is not None)
        # the prolog was told who the job is (an empty account is Slurm's own: no accounting)
        has_who = facts is not None and (facts.user is not None or facts.uid is not None)
        return not (has_gpus and has_who)

    def _ask_node(self, now: float) -> None:
        if self._node_checked_at is not None and now - self._node_checked_at < NODE_EVERY_S:
            return
        self._node_checked_at = now
        result = self._call("show", "node", "-d", self._node or "")
        if result.ok:
            try:
                self._node_details, self._node_note = parse_node(result.stdout), None
            except SlurmFormatError as exc:
                self._ctld_failed(f"`scontrol show node -d {self._node}` printed what it should not ({exc})", now)
                return
            self._ctld_ok()
        elif _NODE_GONE in result.message():
            self._node_details = None
            self._node_note = (f"node {self._node} (from {self._node_from}) unknown to Slurm: set "
                               "GPULEDGER_SLURM_NODE to this node's NodeName")  # fmt: skip
            self._ctld_ok()
        else:
            self._ctld_failed(f"`scontrol show node -d {self._node}` {result.why}", now)

    def _ctld_ok(self) -> None:
        self._ctld_error, self._ctld_backoff = None, BACKOFF_FIRST_S

    def _ctld_failed(self, why: str, now: float) -> None:
        self._ctld_error = why
        self._ctld_retry_at = now + self._ctld_backoff
        self._ctld_backoff = min(self._ctld_backoff * 2, BACKOFF_MAX_S)

    # -- what is claimed ----------------------------------------------------------------------------
    def _active(self) -> set[str]:
        jobs = set(self._mapped) | set(self._facts)
        if self._steps is not None:
            jobs |= set(self._steps.steps)
        return jobs

    def _publish(self, now: float) -> None:
        jobs: dict[str, JobClaim] = {}
        allocations: list[Allocation] = []
        unresolved: dict[str, list[str]] = {}
        index_only: list[str] = []
        named_indices: set[int] = set()
        off_node: list[str] = []
        gres_bad: dict[str, tuple[str, ...]] = {}
        mapped = self._mapped
        for job_id in sorted(self._active(), key=int):
            facts = self._facts.get(job_id)
            known = self._details.get(job_id)
            details = known.job if known is not None else None
            if details is not None and details.nodes and self._node and not _names(details.nodes, self._node):
                off_node.append(job_id)
            if details is not None and details.gres_problems:
                gres_bad[job_id] = details.gres_problems
            gpus, from_indices = self._gpus(job_id, mapped, facts, details)
            if from_indices and self._mig:
                index_only.append(job_id)
                gpus = None
            named_indices |= {int(g) for g in gpus or () if g.isdigit()}
            claim = self._job_claim(job_id, facts, details, gpus)
            jobs[job_id] = claim
            for step, pids in sorted((self._steps.steps if self._steps else {}).get(job_id, {}).items()):
                jobs[f"{job_id}.{step}"] = JobClaim(
                    job_id, step, claim.user, claim.account, claim.partition, claim.gpus, frozenset(pids), claim.labels
                )
            seen: set[str] = set()
            for name in gpus or ():
                uuid = gpu_uuid(name, self._by_index)
                if uuid is None:
                    unresolved.setdefault(job_id, []).append(name)
                elif uuid not in seen:
                    seen.add(uuid)
                    allocations.append(Allocation(uuid, "job", job_id))
        status = self._status_line(now, unresolved, index_only, named_indices, off_node, gres_bad)
        with self._lock:
            self._claims = Claims(jobs=jobs, allocations=allocations)
            self._status = status

    def _gpus(
        self, job_id: str, mapped: Mapping[str, set[str]], facts: JobFacts | None, details: JobDetails | None
    ) -> tuple[tuple[str, ...] | None, bool]:
        """The job's GPUs here by name (mapping files, else the facts file, else GRES indices), and
        whether they came from GRES indices."""
        if job_id in mapped:
            return tuple(sorted(mapped[job_id], key=_gpu_order)), False
        if facts is not None and facts.gpus is not None:
            return facts.gpus, False
        if details is not None and details.gpus_here is not None:
            return tuple(str(i) for i in sorted(details.gpus_here)), bool(details.gpus_here)
        return None, False

    def _job_claim(
        self, job_id: str, facts: JobFacts | None, details: JobDetails | None, gpus: tuple[str, ...] | None
    ) -> JobClaim:
        uid = facts.uid if facts is not None else None
        if uid is None and details is not None:
            uid = details.uid
        if uid is None:
            holders = (h for hs in self._mapping.holders.values() for h in hs if h.job_id == job_id)
            uid = next((h.uid for h in holders if h.uid is not None), None)  # jobstats' "<jobid> <uid>"
        user = (facts.user if facts is not None else None) or (details.user if details is not None else None)
        comment = facts.comment if facts is not None and facts.comment is not None else None
        if comment is None and details is not None:
            comment = details.comment
        pids = self._steps.job_pids(job_id) if self._steps is not None else None
        return JobClaim(
            job_id=job_id,
            user=user or (self._user_name(uid) if uid is not None else None),
            account=(facts.account if facts is not None else None) or (details.account if details else None),
            partition=(facts.partition if facts is not None else None) or (details.partition if details else None),
            gpus=gpus,
            pids=pids,
            labels=comment_labels(comment),
        )

    def _user_name(self, uid: int) -> str | None:
        if uid not in self._users:
            try:
                self._users[uid] = pwd.getpwuid(uid).pw_name
            except KeyError:
                self._users[uid] = None  # not in this node's user database: the uid stays in the chain
        return self._users[uid]

    def _status_line(
        self,
        now: float,
        unresolved: Mapping[str, list[str]],
        index_only: list[str],
        named: set[int],
        off_node: list[str],
        gres_bad: Mapping[str, tuple[str, ...]],
    ) -> str | None:
        parts: list[str] = []
        if self._missing:
            parts.append(
                "scontrol not found on PATH: jobs from the prolog's files only, their processes unconfirmed"
                if self._mapping.present or self._facts
                else f"scontrol not found on PATH and no prolog files in {self._gpustat_dir}: no Slurm job is seen"
            )
        if self._listpids_error:
            ok_at = self._listed_ok_at
            age = f"as listed {now - ok_at:.0f} s ago" if ok_at is not None else "unconfirmed"
            parts.append(f"{self._listpids_error}; job processes {age}")
        if self._ctld_error:
            parts.append(f"{self._ctld_error}; asking slurmctld again in {max(0.0, self._ctld_retry_at - now):.0f} s")
        if self._node_note:
            parts.append(self._node_note)
        for job_id in off_node:
            parts.append(f"job {job_id}'s nodes do not include {self._node} (from {self._node_from}): set "
                         "GPULEDGER_SLURM_NODE to this node's NodeName")  # fmt: skip
        for job_id, names in sorted(unresolved.items()):
            parts.append(f"GPU ids {','.join(names)} of job {job_id} not resolved to UUIDs")
        for job_id in index_only:
            parts.append(f"job {job_id}'s GPUs are known by GRES index only, which names no GPU on a MIG node "
                         "(install the prolog: it writes their UUIDs)")  # fmt: skip
        for job_id, bad in sorted(gres_bad.items()):  # the job's other GRES items still name its GPUs
            parts.append(f"job {job_id}'s GRES not read in part: {'; '.join(bad)}")
        node = self._node_details
        if node is not None and node.gres_problems:
            parts.append(f"node {node.name}'s GresUsed not read in part: {'; '.join(node.gres_problems)}")
        if node is not None and node.gpus_in_use and not self._mig:
            unseen = sorted(node.gpus_in_use - named)
            if unseen:
                parts.append(f"GPU indices {','.join(map(str, unseen))} are allocated by Slurm to jobs not seen here "
                             "(no step of theirs in `scontrol listpids`, no prolog file)")  # fmt: skip
        shown = self._file_problems[:MAX_PROBLEMS_SHOWN]
        parts += shown
        if len(self._file_problems) > len(shown):
            parts.append(f"and {len(self._file_problems) - len(shown)} more file problems")
        return "slurm: " + "; ".join(parts) if parts else None


def _names(hosts: str, node: str) -> bool:
    try:
        return hostlist_has(hosts, node)
    except SlurmFormatError:
        return True  # a host list this parser cannot read is not a reason to doubt the node name


def _gpu_order(name: str) -> tuple[int, int | str]:
    return (0, int(name)) if name.isdigit() else (1, name)
