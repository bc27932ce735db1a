"""The node agent's loop: every tick, every GPU process on the node read, attributed and recorded.

A tick (``interval / 5``, 2 s at the default 10 s interval) reads every GPU and its processes
(node/gpus.py), looks each process up in /proc (node/procfacts.py), takes the platforms' latest
claims (node/sources.py, never waiting for them) and attributes it (core/metering/owners.py). Processes a
``gpuledger run`` wraps are left to their own run; the others are grouped into discovered runs
(node/track.py), which record the GPUs they hold and their host figures; at each interval boundary
(the same instant for every run) the ticks become intervals, handed to the ledger thread
(node/sink.py) so a slow ledger never delays a reading. docs/AGENT.md states the rules; in brief:

* a run starts when its first process is seen on a GPU — at that reading, or at the process's
  start when it was born since the previous one; its GPU figures start at the next reading;
* it ends (``ended_at`` = that reading) when every process it had on a GPU has exited, when the
  platform reports its container finished, or when none of its processes has been on a GPU for
  ``release_after_s``; a container's exit code is awaited up to ``exit_wait_s``;
* stopping the agent (SIGTERM) closes the open intervals and leaves the runs open: the next agent
  on this host resumes them (node/sink.py).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gpuledger.collect.base import GpuCollector, GpuProcess, GpuRead
from gpuledger.collect.host import ProcessTreeCollector
from gpuledger.core.capacity.meter import CapacityMeter, GpuFacts, physical_gpus
from gpuledger.core.metering.busy import unmeasured_seconds
from gpuledger.core.metering.owners import DEFAULT_COPY_LABELS, Owner, allocation_problem, attribute
from gpuledger.core.model import Event, GpuIdentity, GpuTick
from gpuledger.core.redaction.redact import Redactor
from gpuledger.node import discovered_eval, discovered_lineage
from gpuledger.node.cgroup_stats import CgroupCollector, locate
from gpuledger.node.claims import Claims, ProcFacts
from gpuledger.node.container_mounts import ContainerFs
from gpuledger.node.metrics import NodeMetrics, OwnerLabels
from gpuledger.node.procfacts import ProcReader
from gpuledger.node.sink import LedgerSink
from gpuledger.node.sources import Sources
from gpuledger.node.track import META_KEY, Closed, RunTrack, discovered_record, gpu_share
from gpuledger.runs.liveness import PID_START_SLACK_S

GPU_RETRY_S = 60.0  # without NVML, how often the agent tries again
_PGRP = "pgrp:"  # the weakest grouping (core/metering/owners.py): a platform may later place the process


@dataclass(frozen=True)
class AgentConfig:
    host: str
    interval_s: float = 10.0
    tick_s: float | None = None  # None: interval / 5, at most 2 s
    copy_labels: tuple[str, ...] = DEFAULT_COPY_LABELS
    cgroup_root: str = "/sys/fs/cgroup"
    release_after_s: float = 60.0
    exit_wait_s: float = 15.0
    replayed: bool = False
    # The node's cloud instance type, recorded with its GPUs in the fleet (docs/CAPACITY.md)
    instance_type: str | None = field(default_factory=lambda: os.environ.get("GPULEDGER_INSTANCE_TYPE") or None)

    @property
    def tick(self) -> float:
        return self.tick_s if self.tick_s is not None else min(2.0, self.interval_s / 5)


class NodeAgent:
    def __init__(
        self,
        config: AgentConfig,
        *,
        gpu: GpuCollector | None,
        procs: ProcReader,
        sources: Sources,
        sink: LedgerSink,
        metrics: NodeMetrics | None = None,
        boot_id: str | None = None,
        boot_time: float | None = None,
        gpu_opener: Callable[[], tuple[GpuCollector | None, str | None]] | None = None,
        warn: Callable[[str], None] = lambda line: None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self._gpu = gpu
        self._procs = procs
        self._sources = sources
        self._sink = sink
        self._metrics = metrics
        self._boot_id = boot_id
        self._boot_time = boot_time
        self._gpu_opener = gpu_opener
        self._warn = warn
        # The wall clock itself, not the recorder's SteadyClock: that one follows the monotonic
        # clock, which does not count a suspend, so a suspended host would look observed and its
        # readings stay dated behind for hours. A step back is the capacity meter's to absorb.
        self._clock = clock
        self._tck = os.sysconf("SC_CLK_TCK")
        self._redactor = Redactor.default()
        self.tracks: dict[str, RunTrack] = {}  # by owner key
        self._created: set[str] = set()  # local ids handed to the sink
        self._owners: dict[tuple[int, int], tuple[object, Owner]] = {}  # (pid, start) -> (inputs, owner)
        self._checked: set[tuple[int, int, str]] = set()  # (pid, start, gpu) checked against allocations
        self._said: set[str] = set()
        self._devices: dict[str, GpuIdentity] = {d.uuid: d for d in (gpu.devices() if gpu else [])}
        self._started = clock()
        self._last_read = self._started
        self._interval_start = self._started
        self._settled = False
        self._gpu_reads = 0  # readings that listed GPU processes (the first only primes NVML's cursors)
        self._health: dict[str, str] = {}  # adapter -> working / degraded / silent (said on change)
        self._gpu_retry_at = time.monotonic() + GPU_RETRY_S
        self._capacity = CapacityMeter(config.host, config.instance_type)  # every GPU-second in one state

    # -- the loop -----------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        """Tick until ``stop`` is set; a tick that raises is reported and the loop goes on."""
        tick_s = self.config.tick
        next_tick = time.monotonic()
        while not stop.wait(max(0.0, next_tick - time.monotonic())):
            next_tick += tick_s
            if next_tick < time.monotonic():  # suspended or overloaded: skip, don't burst
                next_tick = time.monotonic() + tick_s
            try:
                self.tick()
            except Exception as exc:  # one bad tick must not stop the metering of a node
                self._say("tick", f"gpuledger agent: a reading failed ({exc!r}); carrying on")

    def tick(self, now: float | None = None, *, closing: bool | None = None) -> None:
        """One reading of every GPU; ``closing`` forces the interval to end here (shutdown)."""
        now = self._clock() if now is None else now
        if closing is None:
            closing = now - self._interval_start >= self.config.interval_s - self.config.tick / 2
        read = self._read_gpus(now)
        claims, versions = self._sources.claims()
        generation = (versions, id(self._sink.recorders))
        by_gpu: dict[str, list[tuple[GpuProcess, Owner]]] = {}
        unattributed: dict[str, int] = {}
        live: set[int] = set()
        for p in read.processes:
            facts = self._procs.facts(p.pid)
            if facts is None:
                unattributed[p.uuid] = unattributed.get(p.uuid, 0) + 1
                continue
            live.add(p.pid)
            owner = self._owner(facts, claims, generation)
            by_gpu.setdefault(p.uuid, []).append((p, owner))
            if not owner.wrapped:
                self._place(p, facts, owner, claims, now)
        self._decide_ends(claims, now)
        self._record_ticks(read, by_gpu, now)
        self._meter_capacity(read, by_gpu, unattributed, claims, now)
        self._last_read = now  # metered up to here, even if a later step of this reading fails
        for ev in read.events:
            self._gpu_event(ev.t, ev.kind, ev.message, ev.payload)
        for track in self.tracks.values():
            if track.ending_at is None or track.ending_at == now:
                track.read_host(now, closing or track.ending_at == now)
        self._finish_ended(claims, now)
        if closing:
            self._close_intervals(now)
        self._publish_metrics(read, by_gpu, unattributed)
        self._watch_sources()
        if self._procs.environ_denied:
            self._say("environ", f"gpuledger agent: the environment of {self._procs.environ_denied} GPU process(es) "
                      "could not be read: they are taken as unwrapped unless a `gpuledger run` ancestor or a recorder "
                      "in this ledger says otherwise (docs/AGENT.md)")  # fmt: skip
        self._procs.forget_except(live | {pid for t in self.tracks.values() for pid in t.members})

    def shutdown(self) -> None:
        """SIGTERM: a last reading closes the open intervals; the runs stay open to be resumed."""
        try:
            self.tick(closing=True)
        except Exception as exc:  # still release what is held
            self._warn(f"gpuledger agent: the last reading failed ({exc!r})")
        for track in self.tracks.values():
            self._archive_log(track)  # left open: its log so far, until the next agent ends it
            track.close()
        if self._gpu is not None:
            self._gpu.close()
        self._procs.close()

    # -- reading and attributing --------------------------------------------------------------
    def _read_gpus(self, now: float) -> GpuRead:
        if self._gpu is None and self._gpu_opener is not None and time.monotonic() >= self._gpu_retry_at:
            self._gpu_retry_at = time.monotonic() + GPU_RETRY_S
            self._gpu, _ = self._gpu_opener()
            if self._gpu is not None:
                self._devices = {d.uuid: d for d in self._gpu.devices()}
                self._warn(f"gpuledger agent: NVML answers now: {len(self._devices)} GPU(s)")
        if self._gpu is None:
            return GpuRead()
        self._gpu_reads += 1
        return self._gpu.read(set(), now)

    def _owner(self, facts: ProcFacts, claims: Claims, generation: object) -> Owner:
        """``attribute`` again only when the claims, the recorders or the process changed."""
        key = (facts.pid, facts.start_ticks)
        hit = self._owners.get(key)
        if hit is not None and hit[0] == (generation, facts):
            return hit[1]
        owner = attribute(facts, claims, recorders=self._sink.recorders, copy_labels=self.config.copy_labels)
        self._owners[key] = ((generation, facts), owner)
        if len(self._owners) > 4 * max(64, len(self.tracks) * 8):
            self._owners = {k: v for k, v in self._owners.items() if self._procs.alive(*k)}
        return owner

    def _place(self, p: GpuProcess, facts: ProcFacts, owner: Owner, claims: Claims, now: float) -> None:
        """Put an unwrapped process into its discovered run (opened here when new)."""
        track = self.tracks.get(owner.key)
        if track is None:
            track = self._regroup(facts, owner, now) or self._open(owner, facts, now)
        elif track.ending_at is not None:
            return  # its end is decided; a newcomer will open a new run once it is closed
        track.owner = owner
        track.see(p.pid, facts.start_ticks, now)
        ident = self._devices.get(p.uuid)
        if ident is not None and track.add_device(ident) and track.run.id in self._created:
            self._sink.add_devices(track.run.id, [ident])
        self._refresh_labels(track, owner)
        check = (p.pid, facts.start_ticks, p.uuid)
        if check not in self._checked:
            self._checked.add(check)
            parents = {u: d.mig_parent_uuid for u, d in self._devices.items() if d.mig_parent_uuid}
            problem = allocation_problem(owner, p.uuid, claims.allocations, parents)
            if problem is not None:
                track.event(now, "unallocated_gpu", f"process {p.pid} {problem}", pid=p.pid, gpu=p.uuid)
                if self._metrics is not None:
                    self._metrics.unallocated_use(p.uuid, self._labels(track))

    def _regroup(self, facts: ProcFacts, owner: Owner, now: float) -> RunTrack | None:
        """A process first grouped by its process group, then placed by a platform (Slurm confirms
        a job with ``listpids`` seconds after the process appeared): the same run, re-keyed, never
        a second run holding the same GPUs."""
        if owner.key.startswith(_PGRP):
            return None
        for old_key, track in self.tracks.items():
            if (old_key.startswith(_PGRP) and track.ending_at is None
                    and track.members.get(facts.pid) == facts.start_ticks):  # fmt: skip
                del self.tracks[old_key]
                track.key, track.owner = owner.key, owner
                self.tracks[owner.key] = track
                track.event(now, "note", f"regrouped: {old_key} is {owner.key}, as its platform now says")
                return track
        return None

    def _open(self, owner: Owner, facts: ProcFacts, now: float) -> RunTrack:
        born = None if self._boot_time is None else self._boot_time + facts.start_ticks / self._tck
        started = born if born is not None and self._last_read < born <= now else now
        versions = {k: v for d in self._devices.values() for k, v in
                    (("nvidia_driver", d.driver_version), ("cuda_driver", d.cuda_version)) if v}  # fmt: skip
        run = discovered_record(owner, facts, now=now, started_at=started, host=self.config.host,
                                interval_s=self.config.interval_s, versions=versions,
                                replayed=self.config.replayed)  # fmt: skip
        host, how, why = self._host_collector(owner, facts)
        track = RunTrack(run, owner, host, how)
        track.last_on_gpu = now
        if why:
            track.event(now, "note", why)
        if born is not None:
            run.meta[META_KEY] = {"process_started_at": born}
        self.tracks[owner.key] = track
        self._follow_log(track)
        return track

    # -- training output of containers nobody wrapped -----------------------------------------
    def _follow_log(self, track: RunTrack) -> None:
        """A container's log, followed from its first line by the Docker adapter when there is one."""
        cid = track.owner.container_id
        follow = getattr(self._sources.source("docker"), "follow", None) if cid else None
        if follow is not None:
            track.log = follow(cid)

    def _take_log(self, track: RunTrack, now: float, final: bool = False) -> None:
        """The epochs shown since the last look (node/discovered_epochs.py): from results.csv when
        the run directory is on a mount, else from the log as the log parser gives them for a
        wrapped run without callbacks; metrics, ``epoch_end`` events and the run's metadata."""
        if track.log is None:
            return
        view = track.log.view()  # type: ignore[attr-defined]
        taken = track.epochs.take(view, self._container_fs(track), now, final)
        track.add_metrics(taken.metrics)
        for t, kind, message, payload in taken.events:
            track.event(t, kind, message, **payload)
        if taken.meta:
            track.run.meta.update(taken.meta)
            if track.run.id in self._created:
                self._sink.update(track.run.id, meta=dict(taken.meta))
        parsed, ended = view.parsed, track.epochs.ended
        if ended:  # a training: no evaluation window to keep intervals for
            track.gpu_intervals.clear()
        if final and ended:
            source = track.run.meta.get("epochs_source")
            track.event(now, "log_parsed", f"{len(ended)} epochs read from the container's {parsed.format} "
                        f"training output ({source})", format=parsed.format, epochs=len(ended),
                        total_epochs=parsed.total_epochs, final=parsed.final, source=source)  # fmt: skip
        if view.error:
            track.event(now, "note", f"the container's log could not be read: {view.error}", once=("log", view.error))

    def _note_evaluation(self, track: RunTrack, closed: Closed, claims: Claims, now: float) -> None:
        """A container that evaluated a model (``yolo val|predict|benchmark``) ends as an evaluation
        run (node/discovered_eval.py); a training stays a training."""
        capped = getattr(track.log, "capped", None)
        kept = capped() if capped is not None else None
        view = track.log.view() if kept is not None else None  # type: ignore[attr-defined]
        if view is None or track.epochs.ended or view.training.train_started_at is not None:
            return  # no log kept, or a training (its epochs' validations print the same lines)
        container = claims.containers.get(track.owner.container_id or "")
        span, span_from = (track.run.started_at, track.ending_at or now), "run"
        if container is not None and container.started_at and container.finished_at:
            span, span_from = (container.started_at, container.finished_at), "container"
        printed = view.evaluation.span()
        if printed is not None:
            span, span_from = printed, "console"
        try:
            record = discovered_eval.evaluation(
                kept.data, truncated=kept.truncated, command=track.run.command, fs=self._container_fs(track),
                span=span, span_from=span_from, intervals=list(track.gpu_intervals),
                devices=list(track.devices.values()),
            )  # fmt: skip
        except Exception as exc:  # a parsing bug must cost the evaluation, not the run's end
            closed.events.append(
                Event(t=now, kind="note", message=f"the container's evaluation could not be read: {exc!r}")
            )
            return
        if record is None:
            return
        meta = discovered_eval.evaluation_meta(record)
        track.run.meta.update(meta)
        self._sink.update(track.run.id, meta=meta)
        payload = {k: v for k, v in record.items() if k != "benchmark"}
        closed.events.append(Event(t=now, kind="evaluation", message=discovered_eval.summary(record), payload=payload))

    def _note_lineage(self, track: RunTrack) -> None:
        """A discovered training's place in its model's line (node/discovered_lineage.py)."""
        if not track.epochs.ended:
            return
        lineage = discovered_lineage.training_lineage(track.run.meta, track.run.labels, self._container_fs(track))
        if lineage is not None:
            track.run.meta["lineage"] = lineage
            self._sink.update(track.run.id, meta={"lineage": lineage})

    def _container_fs(self, track: RunTrack) -> ContainerFs | None:
        cid = track.owner.container_id
        fs = getattr(self._sources.source("docker"), "fs", None) if cid else None
        return fs(cid) if fs is not None else None

    def _archive_log(self, track: RunTrack) -> None:
        """Store the container's log, capped and redacted, as a wrapped run's is stored at its end
        (a run still open gets what was logged so far; its end replaces it)."""
        capped = getattr(track.log, "capped", None)
        kept = capped() if capped is not None and track.run.id in self._created else None
        if kept is not None:
            self._sink.log(track.run.id, kept.data, kept.truncated)

    def _log_settled(self, track: RunTrack) -> bool:
        settled = getattr(track.log, "settled", None)
        return settled is None or bool(settled())

    def _host_collector(self, owner: Owner, facts: ProcFacts) -> tuple[object | None, str | None, str | None]:
        files = locate(self.config.cgroup_root, owner.cgroup) if owner.cgroup.scope else None
        if files is not None and not files.missing:
            return CgroupCollector(files), "cgroup", None  # its first reading primes its counters
        why = None
        if files is not None:  # e.g. a v2 cgroup without the memory controller: n/a there, never 0
            why = (f"the cgroup {owner.cgroup.scope} has no {' or '.join(files.missing)} counter under "
                   f"{self.config.cgroup_root}: host figures come from the process tree in /proc")  # fmt: skip
        elif owner.cgroup.scope:
            why = (f"the cgroup {owner.cgroup.scope} is not readable under {self.config.cgroup_root}"
                   + (" (outside this agent's cgroup namespace)" if owner.cgroup.outside_ns else "")
                   + ": host figures come from the process tree in /proc")  # fmt: skip
        leader = self._procs.stat(facts.pgid) if facts.pgid > 1 else None  # the group's leader, when alive
        root = facts.pgid if leader is not None and not leader.exited else facts.pid
        backend = "auto" if self._procs.root == "/proc" else "psutil"
        try:
            # No host-wide counters (they are the node's, not the job's); I/O at every read: nothing
            # credits a job's processes when they end, so the last reading is their final figure.
            collector = ProcessTreeCollector(
                root, include_root=True, backend=backend, system_every=1_000_000, io_every=1
            )
        except Exception as exc:
            return None, None, f"no host figures: the process tree of pid {root} cannot be read ({exc})"
        return collector, "processes", why

    def _refresh_labels(self, track: RunTrack, owner: Owner) -> None:
        new = self._redactor.redact_mapping(dict(owner.labels))
        if all(track.run.labels.get(k) == v for k, v in new.items()):
            return
        track.run.labels.update(new)
        if track.run.id in self._created:
            self._sink.update(track.run.id, labels=dict(track.run.labels))

    # -- recording ----------------------------------------------------------------------------
    def _record_ticks(self, read: GpuRead, by_gpu: dict[str, list[tuple[GpuProcess, Owner]]], now: float) -> None:
        ticks: dict[str, GpuTick] = {t.uuid: t for t in read.ticks}
        for track in self.tracks.values():
            if track.ending_at is not None and track.ending_at < now:
                continue  # its last interval is closed: only its end record is awaited
            if track.run.id not in self._created:  # first sight: its figures start at the next reading
                self._sink.create(self._with_meta(track), list(track.devices.values()), track.members)
                self._created.add(track.run.id)
                track.written_meta = track.meta(self._boot_id)
                continue
            for uuid in track.devices:
                tick = ticks.get(uuid)
                if tick is None:
                    continue
                procs = by_gpu.get(uuid, [])
                mine = [(p.mem_b, p.sm_pct) for p, o in procs if o.key == track.key and not o.wrapped]
                samples_seen = any(p.sm_pct is not None for p, _ in procs)
                track.add_gpu_tick(gpu_share(tick, mine, samples_seen or not procs))

    def _meter_capacity(self, read: GpuRead, by_gpu: dict[str, list[tuple[GpuProcess, Owner]]],
                        unattributed: dict[str, int], claims: Claims, now: float) -> None:  # fmt: skip
        """This reading's span of every physical GPU in one capacity state (core/capacity/model.py): held
        by a discovered run, an open run of this host's ledger or a platform allocation; in use and
        attributed by the processes found on it or its MIG slices. The first reading only primes
        NVML's cursors (no busy time, no process yet): its span is left unobserved, not guessed, and
        so is a reading after a pause longer than an interval (the host suspended, the agent stopped):
        what it found at its end says nothing about the time before."""
        if self._gpu_reads < 2 or now - self._last_read > max(self.config.interval_s, 3 * self.config.tick):
            return
        physical = {u: d.mig_parent_uuid or u for u, d in self._devices.items()}
        held = {physical.get(a.gpu, a.gpu) for a in claims.allocations}
        for hold in self._sink.holds:  # a run whose recorder died (kill -9) is lost: it holds nothing
            if self._recorder_alive(hold.recorder_pid, hold.started_at):
                held |= hold.gpus
        for track in self.tracks.values():
            if track.ending_at is None or track.ending_at >= now:
                held.update(physical.get(u, u) for u in track.devices)
        attributed = {physical.get(u, u) for u, procs in by_gpu.items() if procs}
        in_use = attributed | {physical.get(u, u) for u, n in unattributed.items() if n}
        ticks = {t.uuid: t for t in read.ticks}  # a MIG-mode GPU has none: busy when a slice is in use
        facts = {}
        for uuid in physical_gpus(self._devices.values()):
            tick = ticks.get(uuid)
            energy = tick.energy_j if tick else read.parent_energy.get(uuid)  # MIG mode: the GPU's own
            facts[uuid] = GpuFacts(tick.busy_s if tick else None, energy,
                                   uuid in held, uuid in in_use, uuid in attributed,
                                   0.0 if tick is None else unmeasured_seconds(tick))  # fmt: skip
        self._capacity.add(self._last_read, now, facts)

    def _recorder_alive(self, pid: int | None, started_at: float) -> bool:
        """The run's recorder still runs in this host's /proc (not a later process that reused its
        pid); True when there is no pid to check. As runs/liveness.py, but through the agent's /proc."""
        if pid is None:
            return True
        st = self._procs.stat(pid)
        if st is None or st.exited:
            return False
        if self._boot_time is None:
            return True
        return self._boot_time + st.start_ticks / self._tck <= started_at + PID_START_SLACK_S

    def _with_meta(self, track: RunTrack):  # type: ignore[no-untyped-def]
        node = {**(track.run.meta.get(META_KEY) or {}), **track.meta(self._boot_id)}
        track.run.meta[META_KEY] = node
        return track.run

    def _gpu_event(self, t: float, kind: str, message: str, payload: dict) -> None:
        uuid = payload.get("uuid")
        for track in self.tracks.values():
            if uuid is None or uuid in track.devices:
                track.event(t, kind, message or kind, once=(kind, message), **payload)
        self._say(f"gpu:{kind}", f"gpuledger agent: {message or kind}")

    def _decide_ends(self, claims: Claims, now: float) -> None:
        """A run not on a GPU at this reading may have ended (module doc): its end is this reading."""
        for track in self.tracks.values():
            if track.ending_at is not None or track.last_on_gpu >= now:
                continue
            why = self._why_ended(track, claims, now)
            if why is not None:
                track.ending_at, track.end_reason = now, why

    def _why_ended(self, track: RunTrack, claims: Claims, now: float) -> str | None:
        container = claims.containers.get(track.owner.container_id or "")
        if container is not None and container.finished_at is not None:
            code = "" if container.exit_code is None else f" with code {container.exit_code}"
            return f"its container exited{code}"
        if not any(self._procs.alive(pid, start) for pid, start in track.members.items()):
            return "its processes exited"
        if now - track.last_on_gpu >= self.config.release_after_s:
            return f"its processes left the GPUs {self.config.release_after_s:.0f} s ago"
        return None

    def _finish_ended(self, claims: Claims, now: float) -> None:
        """Close the last interval of runs ended at this reading; write the end once the exit code
        is known (a container's, awaited up to ``exit_wait_s``)."""
        for key, track in list(self.tracks.items()):
            if track.ending_at is None:
                continue
            if track.ending_at == now and track.run.id in self._created:
                self._take_log(track, now)
                self._sink.append(track.run.id, track.close_interval())
            container = claims.containers.get(track.owner.container_id or "")
            if container is not None and container.exit_code is not None:
                track.exit_code = container.exit_code
            waiting = container is not None and container.finished_at is None and track.exit_code is None
            # The log's last lines (and results.csv's last row) come a moment after the exit.
            if (waiting or not self._log_settled(track)) and now - track.ending_at < self.config.exit_wait_s:
                continue
            if track.run.id in self._created:
                self._take_log(track, now, final=True)
                closed = track.close_interval()
                self._note_evaluation(track, closed, claims, now)
                self._note_lineage(track)
                self._sink.append(track.run.id, closed)
                self._archive_log(track)
                self._sink.update(track.run.id, ended_at=track.ending_at, exit_code=track.exit_code,
                                  status_reason=track.end_reason)  # fmt: skip
            track.close()
            del self.tracks[key]

    def _close_intervals(self, now: float) -> None:
        for track in self.tracks.values():
            if track.ending_at is not None or track.run.id not in self._created:
                continue
            self._take_log(track, now)
            self._sink.append(track.run.id, track.close_interval())
            meta = track.meta(self._boot_id)
            if meta != track.written_meta:  # new members, new owner facts: kept for resuming
                track.written_meta = meta
                track.run.meta[META_KEY] = {**(track.run.meta.get(META_KEY) or {}), **meta}
                self._sink.update(track.run.id, meta={META_KEY: track.run.meta[META_KEY]})
        self._sink.capacity(*self._capacity.close(physical_gpus(self._devices.values()).values()))
        self._interval_start = now
        if not self._settled and self._gpu_reads >= 2:  # every GPU process has been seen once
            self._settled = True
            self._sink.settle()

    # -- metrics and messages -----------------------------------------------------------------
    def _labels(self, track: RunTrack) -> OwnerLabels:
        o = track.owner
        return OwnerLabels(
            run_id=self._sink.run_id(track.run.id), team=track.run.labels.get("team", ""),
            project=track.run.labels.get("project", ""), user=track.run.user,
            container=o.container_name or (o.container_id or "")[:12], pod=o.pod_name or "",
            namespace=o.pod_namespace or "", slurm_job=o.slurm_job or "",
        )  # fmt: skip

    def _publish_metrics(self, read: GpuRead, by_gpu: dict[str, list[tuple[GpuProcess, Owner]]],
                         unattributed: dict[str, int]) -> None:  # fmt: skip
        if self._metrics is None:
            return
        ticks = {t.uuid: t for t in read.ticks}
        for uuid, ident in self._devices.items():
            owners: dict[OwnerLabels, int | None] = {}
            for p, o in by_gpu.get(uuid, []):
                track = self.tracks.get(o.key) if not o.wrapped else None
                labels = self._labels(track) if track is not None else OwnerLabels(
                    run_id=o.run_id or "", container=o.container_name or (o.container_id or "")[:12],
                    pod=o.pod_name or "", namespace=o.pod_namespace or "", slurm_job=o.slurm_job or "")  # fmt: skip
                mem = owners.get(labels, 0)
                owners[labels] = None if mem is None or p.mem_b is None else mem + p.mem_b
            self._metrics.observe(ident, ticks.get(uuid), list(owners.items()), unattributed.get(uuid, 0))
        self._metrics.set_sources({s.name: s.sees for s in self._sources.states()}, len(self.tracks))

    def _watch_sources(self) -> None:
        """Say when an adapter stops answering or degrades, and when it is back (the start report
        said how each began)."""
        for s in self._sources.states():
            health = "silent" if s.answered_at is not None and not s.up else "degraded" if s.status else "working"
            if s.answered_at is None and s.status == "no answer yet":
                health = "starting"
            before = self._health.get(s.name)
            self._health[s.name] = health
            if before is None or before == health or health == "starting":
                continue
            if health == "working":
                self._warn(f"gpuledger agent: {s.name} answers again")
            else:
                self._warn(f"gpuledger agent: {s.name}: {s.status}")

    def _say(self, key: str, line: str) -> None:
        if key not in self._said:
            self._said.add(key)
            self._warn(line)
