"""What /proc says about the GPU processes of a node (the node agent's ``ProcFacts``).

``ProcReader(root)`` reads under a configurable proc root (``/proc``; ``/host/proc`` in a
container that mounts the host's; a crafted tree in tests). Per GPU process it reads:

* ``stat``: start time (clock ticks since boot: with the pid, the process's identity across pid
  reuse), parent, process group, session, CPU times, resident pages, threads; kept open and
  re-read with pread (``collect/procfs.OpenFiles``): a kept file of a reaped process answers ESRCH,
  so an exit is seen even when the pid is reused at once;
* ``status`` (the real uid), ``cgroup``, ``cmdline``;
* ``environ`` for ``GPULEDGER_RUN_ID``, and the labels ``gpuledger run`` would take from it
  (``GPULEDGER_TEAM``, ``GPULEDGER_PROJECT``, ``GPULEDGER_LABELS=k=v,...``; nothing else is kept):
  readable as root or as the process's own user (and only while the process is dumpable);
  unreadable → ``run_id`` None and ``environ_readable`` False;
* its ancestors (parent chain) and the nearest one whose command line is ``gpuledger run``.

Everything but ``stat`` is read on first sight of a (pid, start) and again every ``REFRESH_S``
(a process's cgroup and parent rarely change; its environment never does).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from gpuledger.collect.procfs import OpenFiles
from gpuledger.node.claims import ProcFacts

REFRESH_S = 60.0
RUN_ID_VAR = "GPULEDGER_RUN_ID"
LABEL_VARS = {"GPULEDGER_TEAM": "team", "GPULEDGER_PROJECT": "project"}
LABELS_VAR = "GPULEDGER_LABELS"
_MAX_ANCESTORS = 64
_CAP_SYS_PTRACE = 19  # capability(7) bit number


@dataclass(frozen=True, slots=True)
class ProcStat:
    """The fields of /proc/<pid>/stat the agent uses."""

    pid: int
    state: str
    ppid: int
    pgid: int
    sid: int
    cpu_ticks: int  # utime + stime + cutime + cstime (own and reaped children)
    threads: int
    start_ticks: int
    rss_pages: int

    @property
    def exited(self) -> bool:
        return self.state in ("Z", "X")  # a zombie has ended; only its parent has not reaped it yet


def parse_stat(pid: int, data: bytes) -> ProcStat:
    """ValueError/IndexError for a file that is not a stat line."""
    end = data.rfind(b")")
    if end < 0:
        raise ValueError("no command name in stat")
    f = data[end + 2 :].split(None, 22)  # man 5 proc numbering minus 3
    cpu = int(f[11]) + int(f[12]) + int(f[13]) + int(f[14])
    return ProcStat(pid, f[0].decode(), int(f[1]), int(f[2]), int(f[3]), cpu, int(f[17]), int(f[19]), int(f[21]))


def env_labels(env: dict[str, str]) -> dict[str, str]:
    """The labels ``gpuledger run`` takes from these variables; a malformed GPULEDGER_LABELS item is skipped."""
    labels = {label: env[var] for var, label in LABEL_VARS.items() if env.get(var)}
    for item in filter(None, (s.strip() for s in env.get(LABELS_VAR, "").split(","))):
        key, sep, value = item.partition("=")
        if sep and key.strip() and value.strip():
            labels.setdefault(key.strip(), value.strip())
    return labels


def is_wrapper(argv: Iterable[str]) -> bool:
    """``gpuledger run ...`` or ``python [options] -m gpuledger run ...``: a wrapper's command line."""
    args = list(argv)[:8]
    if not args:
        return False
    program = os.path.basename(args[0])
    if program == "gpuledger":
        return args[1:2] == ["run"]
    if not program.startswith("python"):
        return False
    for i, arg in enumerate(args[1:], start=1):
        if arg == "-m":
            return args[i + 1 : i + 3] == ["gpuledger", "run"]
        if not arg.startswith("-"):
            return False  # a script: not the gpuledger module
    return False


class ProcReader:
    """Reads ProcFacts and stat lines under ``root``; never raises for a process that went away."""

    def __init__(self, root: str = "/proc", clock: Callable[[], float] = time.monotonic) -> None:
        self.root = root.rstrip("/") or "/"
        self._clock = clock
        self._files = OpenFiles()
        self._facts: dict[int, tuple[float, ProcFacts]] = {}  # pid -> (read at, facts)
        self.environ_denied = 0  # processes whose environment could not be read (start report)

    # -- per tick -----------------------------------------------------------------------------
    def stat(self, pid: int) -> ProcStat | None:
        """The process's stat line now; None when it is gone (or the file is not a stat line)."""
        path = f"{self.root}/{pid}/stat"
        try:
            return parse_stat(pid, self._files.read(path))
        except OSError:
            self._files.close(path)
            return None
        except (ValueError, IndexError):
            return None

    def alive(self, pid: int, start_ticks: int) -> bool:
        """The process (pid, start) still runs: not reaped, not reused, not a zombie."""
        st = self.stat(pid)
        return st is not None and st.start_ticks == start_ticks and not st.exited

    def io(self, pid: int) -> tuple[int, int] | None:
        """(read_bytes, write_bytes) from /proc/<pid>/io; None when not ours to read."""
        try:
            f = self._files.read(f"{self.root}/{pid}/io").split()
        except OSError:
            return None
        if len(f) < 12 or f[8] != b"read_bytes:" or f[10] != b"write_bytes:":
            return None
        return int(f[9]), int(f[11])

    def facts(self, pid: int) -> ProcFacts | None:
        """The process's facts (cached per pid and start time); None when it is gone."""
        st = self.stat(pid)
        if st is None:
            self.forget(pid)
            return None
        now = self._clock()
        hit = self._facts.get(pid)
        same = hit is not None and hit[1].start_ticks == st.start_ticks
        if hit is not None and same and now - hit[0] < REFRESH_S:
            known = hit[1]
            if (known.ppid, known.pgid, known.sid) == (st.ppid, st.pgid, st.sid):
                return known
            moved = replace(known, ppid=st.ppid, pgid=st.pgid, sid=st.sid)  # setpgid / re-parented
            self._facts[pid] = (hit[0], moved)
            return moved
        made = self._read_facts(st, hit[1] if hit is not None and same else None)
        self._facts[pid] = (now, made)
        return made

    def forget(self, pid: int) -> None:
        self._facts.pop(pid, None)
        self._files.close(f"{self.root}/{pid}/stat")
        self._files.close(f"{self.root}/{pid}/io")

    def forget_except(self, keep: set[int]) -> None:
        for pid in [p for p in self._facts if p not in keep]:
            self.forget(pid)

    def close(self) -> None:
        self._files.close_all()
        self._facts.clear()

    # -- reading ------------------------------------------------------------------------------
    def _read_facts(self, st: ProcStat, before: ProcFacts | None) -> ProcFacts:
        base = f"{self.root}/{st.pid}"
        if before is not None:  # an environment does not change: read once
            run_id, readable, labels = before.run_id, before.environ_readable, dict(before.env_labels)
        else:
            run_id, readable, labels = self._environ(base)
        ancestors = self._ancestors(st.ppid)
        wrapper = next((a for a in ancestors if is_wrapper(self._cmdline(a))), None)
        return ProcFacts(
            pid=st.pid,
            start_ticks=st.start_ticks,
            ppid=st.ppid,
            pgid=st.pgid,
            sid=st.sid,
            uid=self._uid(base),
            cgroup=tuple(_text(f"{base}/cgroup").splitlines()),
            run_id=run_id,
            cmdline=tuple(self._cmdline(st.pid)),
            ancestors=ancestors,
            wrapper_pid=wrapper,
            environ_readable=readable,
            env_labels=labels,
        )

    def _environ(self, base: str) -> tuple[str | None, bool, dict[str, str]]:
        """(GPULEDGER_RUN_ID, whether the environment was readable, the labels it sets)."""
        try:
            with open(f"{base}/environ", "rb") as fh:
                data = fh.read()
        except FileNotFoundError:
            return None, True, {}  # gone meanwhile: nothing unread
        except OSError:
            self.environ_denied += 1
            return None, False, {}
        found: dict[str, str] = {}
        for item in data.split(b"\0"):
            name, sep, value = item.partition(b"=")
            key = name.decode("utf-8", "replace")
            if sep and (key in (RUN_ID_VAR, LABELS_VAR) or key in LABEL_VARS):
                found[key] = value.decode("utf-8", "replace").strip()
        return found.get(RUN_ID_VAR) or None, True, env_labels(found)

    def _uid(self, base: str) -> int:
        for line in _text(f"{base}/status").splitlines():
            if line.startswith("Uid:"):
                parts = line.split()
                if len(parts) > 1 and parts[1].isdigit():
                    return int(parts[1])  # the real uid
        try:
            return os.stat(base).st_uid
        except OSError:
            return -1

    def _cmdline(self, pid: int) -> list[str]:
        try:
            with open(f"{self.root}/{pid}/cmdline", "rb") as fh:
                raw = fh.read(8192)
        except OSError:
            return []
        return [a.decode("utf-8", "replace") for a in raw.rstrip(b"\0").split(b"\0") if a]

    def _ancestors(self, ppid: int) -> tuple[int, ...]:
        out: list[int] = []
        pid = ppid
        while pid > 1 and len(out) < _MAX_ANCESTORS and pid not in out:
            out.append(pid)
            try:
                with open(f"{self.root}/{pid}/stat", "rb") as fh:
                    pid = parse_stat(pid, fh.read()).ppid
            except (OSError, ValueError, IndexError):
                break
        return tuple(out)

    # -- node-wide ----------------------------------------------------------------------------
    def host_pid_namespace(self) -> bool:
        """True when this /proc shows the initial PID namespace (the kernel thread kthreadd is pid 2
        with parent 0 there only): NVML's pids are then ours to look up."""
        try:
            with open(f"{self.root}/2/stat", "rb") as fh:
                st = parse_stat(2, fh.read())
        except (OSError, ValueError, IndexError):
            return False
        return st.ppid == 0 and _text(f"{self.root}/2/comm").strip() == "kthreadd"

    def environ_readable_for_others(self) -> bool:
        """Whether other users' environments can be read: this process has CAP_SYS_PTRACE (root
        normally has; proc(5): environ needs ptrace read access). A security module may still
        refuse single processes: those are counted in ``environ_denied``."""
        for line in _text(f"{self.root}/self/status").splitlines():
            if line.startswith("CapEff:"):
                try:
                    return bool(int(line.split()[1], 16) >> _CAP_SYS_PTRACE & 1)
                except (IndexError, ValueError):
                    break
        return os.geteuid() == 0

    def boot_id(self) -> str | None:
        text = _text(f"{self.root}/sys/kernel/random/boot_id").strip()
        return text or None

    def boot_time(self) -> float | None:
        """Epoch seconds of the boot (``btime`` in /proc/stat): start ticks become times with it."""
        for line in _text(f"{self.root}/stat").splitlines():
            if line.startswith("btime "):
                return float(line.split()[1])
        return None


def _text(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return ""
