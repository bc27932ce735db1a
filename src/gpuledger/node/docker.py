"""Docker: the node agent's view of the containers on this node (a ``ClaimSource``, name "docker").

A background thread follows the daemon's ``/events`` (container start, die, destroy), so a start
or a death is seen when it happens and the exit code of a container that lived between two agent
ticks is kept (from the die event when ``--rm`` removed it before anyone could inspect it). Each
(re)connection first re-lists the containers, so what happened while the daemon was restarting
(or the agent was not listening) is caught up; the thread reconnects with backoff for ever and
``status()`` says while it cannot see. ``claims(now)`` only reads memory: it never blocks on the
daemon and never raises.

Logs (see ``docker_logs.py``): the log of each container given a GPU is followed from its first
line (``follow_logs="gpu"``; ``"all"`` or ``"none"``), and the agent can ask for any other:

* ``follow(container_id) -> ContainerLog | None`` starts following (idempotent) — e.g. when a
  GPU process turns up in a container that claimed no GPU;
* ``log(container_id) -> ContainerLog | None`` the one already followed;
* ``ContainerLog.view() -> LogView``: the parsed YOLO epochs and metrics so far
  (``view().parsed``, a ``core.training.logparse.ParsedLog``), when each epoch was seen finished
  (``epoch_times``), where the training writes (``training``), whether the log has ended
  (``done``) or cannot be read (``error``), and the path of the redacted copy when ``log_dir`` is
  given (``docker-<id>.log``, kept as head and tail under ``log_cap_b``: ``capped()`` is the log to
  archive). ``gpuledger agent`` keeps the copies in ``<data dir>/agent-logs``;
* ``fs(container_id) -> ContainerFs | None``: its mounts and working directory, to find the files
  a training writes on a mount (node/container_mounts.py).

Everything stored — labels, log bytes, parsed figures — has been through ``core/redaction/redact.py``.
Only GET endpoints are used (``docker_api.py``), so a read-only socket proxy suffices.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from gpuledger.core.redaction.redact import Redactor
from gpuledger.core.training.logcap import DEFAULT_MAX_B
from gpuledger.node.claims import Allocation, Claims, ContainerClaim, SourceOptions
from gpuledger.node.container_mounts import ContainerFs, fs_from_inspect
from gpuledger.node.docker_api import DockerApiError, DockerClient, DockerConfigError, DockerUnavailable
from gpuledger.node.docker_inspect import (
    allocations,
    claim_from_event,
    claim_from_inspect,
    event_exit_code,
    event_time,
)
from gpuledger.node.docker_logs import ContainerLog, decoder_for

EVENT_FILTERS = {"type": ["container"], "event": ["start", "die", "destroy"]}
FOLLOW_POLICIES = ("gpu", "all", "none")
_RUNNING_STATES = frozenset({"running", "paused", "restarting"})

# The node's GPUs: UUIDs in NVML index order, or NVML index -> UUID; or a callable giving either.
GpuList = Sequence[str] | Mapping[int, str]
DEFAULT_HOST = "unix:///var/run/docker.sock"
LOG_DIR_NAME = "agent-logs"
OPEN_WAIT_S = 5.0


def open_source(options: SourceOptions, env: Mapping[str, str] | None = None) -> DockerSource:
    """The agent's way in (node/claims.py). ``options.docker_socket`` is a socket path or a
    ``unix://`` / ``tcp://`` address; left at its default, ``DOCKER_HOST`` from the environment wins,
    as for the docker CLI. GPU indices resolve against ``options.gpus`` (NVML index, UUID)."""
    env = dict(os.environ if env is None else env)
    where = options.docker_socket.strip()
    address = where if "://" in where else f"unix://{where}" if where else DEFAULT_HOST
    if address != DEFAULT_HOST or not env.get("DOCKER_HOST"):
        env["DOCKER_HOST"] = address
    gpus = {i: u for i, u in options.gpus if u.upper().startswith("GPU-")}  # MIG slices are not indexed
    from gpuledger.paths import data_dir
    from gpuledger.runs.logfile import cap_or_default

    # The logs are archived with the runs as a wrapped run's are: the same cap, the same data dir.
    source = DockerSource(env, gpu_uuids=gpus or None, log_dir=data_dir(env) / LOG_DIR_NAME,
                          log_cap_b=cap_or_default(env))  # fmt: skip
    source.wait_synced(OPEN_WAIT_S)  # the agent's first tick sees the containers already running
    return source


class DockerSource:
    """Containers, their GPUs and their logs from one Docker daemon."""

    name = "docker"

    def __init__(
        self,
        env: Mapping[str, str] | None = None,
        *,
        gpu_uuids: GpuList | Callable[[], GpuList] | None = None,
        follow_logs: str = "gpu",
        log_dir: Path | None = None,
        log_cap_b: int = DEFAULT_MAX_B,
        keep_finished_s: float = 3600.0,
        max_backoff_s: float = 30.0,
        redactor: Redactor | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        if follow_logs not in FOLLOW_POLICIES:
            raise ValueError(f"follow_logs must be one of {', '.join(FOLLOW_POLICIES)}, not {follow_logs!r}")
        self._gpu_uuids = gpu_uuids
        self._follow_policy = follow_logs
        self._log_dir = log_dir
        self._log_cap_b = log_cap_b
        self._fs: dict[str, ContainerFs] = {}  # container id -> its mounts and working directory
        self._keep_finished_s = keep_finished_s
        self._max_backoff_s = max_backoff_s
        self._redactor = redactor or Redactor.default()
        self._wall = wall
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._synced = threading.Event()
        self._claims: dict[str, ContainerClaim] = {}
        self._logs: dict[str, ContainerLog] = {}
        self._followers: dict[str, threading.Thread] = {}
        self._event_since: str | None = None
        self._connected = False
        self._down_since: float | None = None
        self._down_why: str | None = None
        self._last_sync: float | None = None
        self._unresolved: dict[str, list[str]] = {}
        self.reconnects = 0  # times the daemon came back after being unreachable
        self._config_error: str | None = None
        self._client: DockerClient | None = None
        try:
            self._client = DockerClient(env)
        except DockerConfigError as exc:
            self._config_error = str(exc)
            return
        self._clear_old_copies()
        self._thread = threading.Thread(target=self._run, name="gpuledger-docker-events", daemon=True)
        self._thread.start()

    # -- the ClaimSource contract -------------------------------------------------------------------
    def claims(self, now: float) -> Claims:
        with self._lock:
            self._prune(now)
            containers = dict(self._claims)
        uuids = self._uuids()
        allocs: list[Allocation] = []
        unresolved: dict[str, list[str]] = {}
        for claim in containers.values():
            if claim.finished_at is not None or not claim.gpus:
                continue  # a stopped container may use nothing
            found, missing = allocations(claim, uuids)
            allocs += found
            if missing:
                unresolved[claim.name or claim.id[:12]] = missing
        with self._lock:
            self._unresolved = unresolved
        return Claims(containers=containers, allocations=allocs)

    def status(self) -> str | None:
        if self._config_error:
            return f"docker: {self._config_error}"
        with self._lock:
            parts: list[str] = []
            if not self._connected:
                where = self._client.where if self._client else "?"
                if self._last_sync is None:
                    parts.append(f"cannot see containers yet: {self._down_why or 'connecting to ' + where}")
                else:
                    age = self._wall() - (self._down_since or self._wall())
                    parts.append(
                        f"daemon unreachable for {age:.0f} s ({self._down_why}); reconnecting, "
                        f"containers as last seen ({len(self._claims)})"
                    )
            for name, missing in sorted(self._unresolved.items()):
                parts.append(f"GPU ids {','.join(missing)} of container {name} not resolved to UUIDs")
            for cid, clog in sorted(self._logs.items()):
                claim = self._claims.get(cid)
                if claim is None or claim.finished_at is not None:
                    continue  # a stopped container's log error stays in its LogView
                if clog.error:
                    parts.append(f"log of {claim.name or cid[:12]} unreadable: {clog.error}")
        return "docker: " + "; ".join(parts) if parts else None

    def blind(self) -> bool:
        """True while it cannot see the containers at all (node/sources.py: the adapter is down)."""
        with self._lock:
            return self._config_error is not None or not self._connected

    def close(self) -> None:
        self._stop.set()
        if self._client is not None:
            self._client.close()
        with self._lock:
            threads = [self._thread] if self._client is not None else []
            threads += list(self._followers.values())
        for thread in threads:
            thread.join(timeout=5)

    # -- for the agent and tests --------------------------------------------------------------------
    def wait_synced(self, timeout_s: float) -> bool:
        """Wait until the containers have been listed once; False if not within ``timeout_s``."""
        return self._synced.wait(timeout_s)

    def follow(self, container_id: str) -> ContainerLog | None:
        """Follow a container's log (from its first line); None when there is no daemon to ask."""
        if self._client is None or self._stop.is_set():
            return None
        with self._lock:
            clog = self._logs.get(container_id)
            if clog is None:
                path = self._log_dir / f"docker-{container_id}.log" if self._log_dir else None
                clog = self._logs[container_id] = ContainerLog(
                    container_id, redactor=self._redactor, path=path, cap_b=self._log_cap_b, wall=self._wall
                )
            thread = self._followers.get(container_id)
            if thread is None or not thread.is_alive():
                thread = threading.Thread(
                    target=self._follow, args=(clog,), name=f"gpuledger-docker-log-{container_id[:12]}", daemon=True
                )
                self._followers[container_id] = thread
                thread.start()
        return clog

    def log(self, container_id: str) -> ContainerLog | None:
        with self._lock:
            return self._logs.get(container_id)

    def fs(self, container_id: str) -> ContainerFs | None:
        """The container's mounts and working directory, as last inspected."""
        with self._lock:
            return self._fs.get(container_id)

    def lookup(self, container_id: str) -> ContainerClaim | None:
        """Ask the daemon about one container now (e.g. one a resumed discovered run names that
        stopped while the agent was down); None when it is gone or the daemon cannot be asked."""
        if self._client is None:
            return None
        try:
            doc = self._client.inspect(container_id)
        except DockerApiError:
            return None
        return claim_from_inspect(doc, self._redactor) if doc else None

    # -- the events thread --------------------------------------------------------------------------
    def _run(self) -> None:
        assert self._client is not None
        backoff = 0.5
        while not self._stop.is_set():
            try:
                self._client.negotiate()  # at every (re)connection: the daemon may have been upgraded
                with self._client.events(EVENT_FILTERS, since=self._event_since) as events:
                    self._resync()  # after the stream is open, so nothing between the two is missed
                    self._up()
                    backoff = 0.5
                    for event in events:
                        self._on_event(event)
                # A clean end: a proxy closed an idle stream. Reconnect at once, from the last event.
            except Exception as exc:  # unreachable, refused, or a malformed answer: say it, retry
                if self._stop.is_set():
                    return
                self._down(str(exc) if isinstance(exc, DockerApiError) else f"unexpected {type(exc).__name__}: {exc}")
                self._stop.wait(backoff)
                backoff = min(backoff * 2, self._max_backoff_s)
                continue
            self._stop.wait(0.5)  # after a clean end too, never a tight loop against a flapping proxy

    def _up(self) -> None:
        with self._lock:
            if self._down_since is not None and self._last_sync is not None:
                self.reconnects += 1
            self._connected, self._down_since, self._down_why = True, None, None
            self._last_sync = self._wall()
        self._synced.set()

    def _down(self, why: str) -> None:
        with self._lock:
            self._connected = False
            self._down_why = why
            if self._down_since is None:
                self._down_since = self._wall()

    def _resync(self) -> None:
        """List every container; inspect the running ones and those we last saw running."""
        assert self._client is not None
        listing = self._client.containers(all=True)
        present: set[str] = set()
        for summary in listing:
            cid = summary.get("Id")
            if not isinstance(cid, str):
                continue
            present.add(cid)
            with self._lock:
                known = self._claims.get(cid)
            if summary.get("State") in _RUNNING_STATES or (known is not None and known.finished_at is None):
                self._refresh(cid)
        now = self._wall()
        with self._lock:
            for cid, claim in list(self._claims.items()):
                if cid not in present and claim.finished_at is None:
                    self._claims[cid] = replace(claim, finished_at=now)  # removed unseen: exit code unknown

    def _refresh(self, cid: str, event: Mapping[str, Any] | None = None) -> ContainerClaim | None:
        assert self._client is not None
        doc = self._client.inspect(cid)
        claim = claim_from_inspect(doc, self._redactor) if doc else None
        with self._lock:
            known = self._claims.get(cid)
            if doc:
                self._fs[cid] = fs_from_inspect(doc)
        if claim is not None and claim.pid is None and known is not None and known.started_at == claim.started_at:
            claim = replace(claim, pid=known.pid)  # a stopped container's State.Pid is 0: keep the one it ran as
        if event is not None and event.get("Action") == "die" and (claim is None or claim.finished_at is not None):
            claim = self._died(claim or known, event)
        elif claim is None and event is not None and event.get("Action") == "start":
            claim = claim_from_event(event, self._redactor)  # gone before it could be inspected
        if claim is None:
            return None
        with self._lock:
            self._claims[cid] = claim
            followed = cid in self._logs
        # A fast container may be dead by the time it is inspected: its log is still there to read.
        if self._wants_log(claim) and (not followed or claim.finished_at is None):
            self.follow(cid)
        return claim

    def _died(self, claim: ContainerClaim | None, event: Mapping[str, Any]) -> ContainerClaim | None:
        """The claim of a container that died: the event's time and exit code are the daemon's own."""
        dead = claim_from_event(event, self._redactor)
        if claim is None:
            return dead
        if dead is None:
            return claim
        code = dead.exit_code if dead.exit_code is not None else claim.exit_code
        finished = dead.finished_at or claim.finished_at
        if finished is not None and claim.started_at is not None:
            finished = max(finished, claim.started_at)
        return replace(claim, finished_at=finished, exit_code=code)

    def _on_event(self, event: Mapping[str, Any]) -> None:
        nano = event.get("timeNano")
        if isinstance(nano, int) and nano > 0:
            self._event_since = f"{nano // 1_000_000_000}.{nano % 1_000_000_000:09d}"
        cid = (event.get("Actor") or {}).get("ID") or event.get("id")
        if event.get("Type", "container") != "container" or not isinstance(cid, str):
            return
        action = event.get("Action") or event.get("status")
        if action in ("start", "die"):
            self._refresh(cid, event)
        elif action == "destroy":
            with self._lock:
                claim = self._claims.get(cid)
                if claim is not None and claim.finished_at is None:
                    t = event_time(event) or self._wall()
                    self._claims[cid] = replace(claim, finished_at=t, exit_code=event_exit_code(event))

    def _wants_log(self, claim: ContainerClaim) -> bool:
        return self._follow_policy == "all" or (self._follow_policy == "gpu" and bool(claim.gpus))

    # -- log followers --------------------------------------------------------------------------------
    def _follow(self, clog: ContainerLog) -> None:
        assert self._client is not None
        cid = clog.container_id
        backoff = 0.5
        while not self._stop.is_set():
            try:
                doc = self._client.inspect(cid)
                if doc is None:
                    clog.finish(None if clog.last_t_ns is not None else "the container was removed before it was read")
                    return
                tty = bool((doc.get("Config") or {}).get("Tty"))
                with self._client.logs(cid, since=clog.resume()) as stream:
                    decoder = decoder_for(stream.content_type, stream.api_version, tty)
                    for chunk in stream.chunks:
                        clog.add(decoder.feed(chunk))
                # The stream ended: the container stopped, or a proxy closed an idle stream.
                doc = self._client.inspect(cid)
                if doc is None or not (doc.get("State") or {}).get("Running"):
                    if doc is not None:
                        # A follow of a container that exits at once can end before the daemon
                        # has handed out its last lines: read once more, without follow, from
                        # where this one stopped (what was read already is skipped).
                        with self._client.logs(cid, since=clog.resume(), follow=False) as stream:
                            decoder = decoder_for(stream.content_type, stream.api_version, tty)
                            for chunk in stream.chunks:
                                clog.add(decoder.feed(chunk))
                    clog.finish()
                    return
                backoff = 0.5
            except DockerUnavailable:
                if self._stop.is_set():
                    return
                self._stop.wait(backoff)  # the daemon is restarting: the events thread says so
                backoff = min(backoff * 2, self._max_backoff_s)
            except DockerApiError as exc:  # refused (a proxy), or a log driver that cannot be read
                clog.finish(str(exc))
                return
            except Exception as exc:  # a bug must not leave the log looking alive
                clog.finish(f"unexpected {type(exc).__name__}: {exc}")
                return

    # -- helpers --------------------------------------------------------------------------------------
    def _uuids(self) -> dict[int, str] | None:
        source = self._gpu_uuids
        if source is None:
            return None
        try:
            gpus = source() if callable(source) else source
            return dict(gpus) if isinstance(gpus, Mapping) else dict(enumerate(gpus))
        except Exception:
            return None  # NVML hiccup: indices stay unresolved this tick and status() says so

    def _prune(self, now: float) -> None:
        """Forget containers stopped longer than ``keep_finished_s`` ago (and their finished logs)."""
        for cid, claim in list(self._claims.items()):
            if claim.finished_at is not None and now - claim.finished_at > self._keep_finished_s:
                del self._claims[cid]
                self._fs.pop(cid, None)
                thread = self._followers.get(cid)
                if thread is None or not thread.is_alive():
                    self._followers.pop(cid, None)
                    clog = self._logs.pop(cid, None)
                    if clog is not None:
                        clog.discard()

    def _clear_old_copies(self) -> None:
        """Copies an earlier agent left: every log followed again is read from its first line."""
        if self._log_dir is None:
            return
        for old in self._log_dir.glob("docker-*.log*"):
            with contextlib.suppress(OSError):
                old.unlink()
