#!/usr/bin/env python3
"""Record one real cgroup's files as a test fixture (tests/data/cgroup/<name>/).

    sudo python tools/record_cgroup_tree.py hybrid-v1            # a fresh cgroup with a process in it
    python tools/record_cgroup_tree.py mine --pid $$              # the cgroups a running process is in

With no ``--pid`` it makes ``/gpuledger-fixture/<64 hex>`` (a container-shaped path, as Docker's
cgroupfs driver names one) in every mounted hierarchy it records (memory, cpuacct, blkio, pids,
and the v2 one), moves a child process into it that allocates memory and writes a file, records,
then ends the child and removes the cgroups. Needs root.

What is copied: for each hierarchy, the cgroup's directory listing (every file is created) and the
contents of each readable file under 64 KiB; a file the kernel makes write-only (``cgroup.kill``,
``memory.force_empty``) or that refuses a read is left empty and listed in PROVENANCE.md. Not the
whole tree: only the one cgroup, under its path, so ``locate()`` finds it as on the host. Also
``proc-cgroup`` (the process's /proc/<pid>/cgroup) and PROVENANCE.md (kernel, mount lines, date,
command).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import secrets
import shlex
import signal
import subprocess
import sys
from pathlib import Path

RECORDED = ("memory", "cpuacct", "blkio", "pids")  # the v1 controllers the agent reads
MAX_BYTES = 65536
# The child: waits to be moved into the cgroup, then allocates and touches 32 MiB and writes
# 4 MiB with fsync, so the counters are not all zero, then waits to be ended.
CHILD = (
    "import os, sys, time\n"
    "sys.stdin.readline()\n"
    "buf = bytearray(32 << 20)\n"
    "for i in range(0, len(buf), 4096): buf[i] = 1\n"
    "with open(sys.argv[1], 'wb') as fh:\n"
    "    fh.write(os.urandom(4 << 20)); fh.flush(); os.fsync(fh.fileno())\n"
    "print('ready', flush=True)\n"
    "time.sleep(3600)\n"
)


def mounts(root: str) -> list[tuple[str, str, str]]:
    """(mount point, fs type, options) of the cgroup mounts under ``root``."""
    out = []
    with open("/proc/self/mounts", encoding="utf-8") as fh:
        for line in fh:
            _dev, point, fstype, opts, *_ = line.split()
            if fstype in ("cgroup", "cgroup2") and (point == root or point.startswith(root + "/")):
                out.append((point, fstype, opts))
    return out


def hierarchies(root: str) -> dict[str, str]:
    """Recorded name -> mount point: each v1 controller the agent reads, and ``v2`` for cgroup2."""
    out: dict[str, str] = {}
    for point, fstype, opts in mounts(root):
        if fstype == "cgroup2":
            out["v2"] = point
            continue
        for ctl in RECORDED:
            if ctl in opts.split(","):
                out[ctl] = point
    return out


def copy_dir(src: Path, dst: Path, unreadable: list[str], rel: str) -> None:
    dst.mkdir(parents=True, exist_ok=True)
    for entry in sorted(os.scandir(src), key=lambda e: e.name):
        if not entry.is_file(follow_symlinks=False):
            continue  # child cgroups are not part of the record
        try:
            with open(entry.path, "rb") as fh:
                data = fh.read(MAX_BYTES)
        except OSError as exc:
            data = b""
            unreadable.append(f"{rel}/{entry.name} ({exc.strerror})")
        (dst / entry.name).write_bytes(data)


def record(name: str, root: str, out: Path, pid: int, command: str) -> Path:
    dest = out / name
    lines = Path(f"/proc/{pid}/cgroup").read_text(encoding="utf-8").splitlines()
    paths: dict[str, str] = {}
    for line in lines:
        _h, ctls, path = line.split(":", 2)
        for ctl in ctls.split(",") if ctls else ["v2"]:
            paths[ctl] = path
    unreadable: list[str] = []
    for ctl, point in sorted(hierarchies(root).items()):
        path = paths.get(ctl)
        if path is None:
            continue
        rel = os.path.relpath(point, root)
        target = dest / "tree" / rel / path.lstrip("/")
        copy_dir(Path(point + path), target, unreadable, f"{rel}{path}")
    (dest / "proc-cgroup").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (dest / "PROVENANCE.md").write_text(provenance(name, root, command, unreadable), encoding="utf-8")
    return dest


def provenance(name: str, root: str, command: str, unreadable: list[str]) -> str:
    mount_lines = "\n".join(f"{p} type {t} ({o})" for p, t, o in mounts(root))
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    empty = "\n".join(f"- `{u}`" for u in unreadable) or "- none"
    return f"""# cgroup fixture `{name}`: recorded from a real host

Recorded by `tools/record_cgroup_tree.py` on {now}.

- command: `{command}`
- kernel (`uname -r`): `{os.uname().release}`
- cgroup mounts under `{root}` (`/proc/self/mounts`):

```
{mount_lines}
```

`tree/` mirrors `{root}`: for each hierarchy the agent reads, the one cgroup the process was in,
with every file of its directory and the contents the kernel gave (up to {MAX_BYTES} bytes each).
`proc-cgroup` is that process's `/proc/<pid>/cgroup`. Files left empty because the kernel refused
a read (write-only control files):

{empty}
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    ap.add_argument("name", help="fixture name: the folder under --out")
    ap.add_argument("--root", default="/sys/fs/cgroup", help="where the cgroup hierarchies are mounted")
    ap.add_argument("--out", default="tests/data/cgroup", help="fixtures folder")
    ap.add_argument("--pid", type=int, help="record this process's cgroups instead of making one")
    args = ap.parse_args(argv)
    command = "python tools/record_cgroup_tree.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    out = Path(args.out)
    if args.pid is not None:
        print(record(args.name, args.root, out, args.pid, command))
        return 0
    if os.geteuid() != 0:
        print("making a cgroup needs root (or give --pid)", file=sys.stderr)
        return 2
    found = hierarchies(args.root)
    if not found:
        print(f"no cgroup hierarchy mounted under {args.root}", file=sys.stderr)
        return 2
    scope = f"/gpuledger-fixture/{secrets.token_hex(32)}"
    made = [Path(point + scope) for point in found.values()]
    out.mkdir(parents=True, exist_ok=True)
    scratch = out / f".{args.name}.scratch"
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(scratch)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        for d in made:
            d.mkdir(parents=True)
            (d / "cgroup.procs").write_text(str(child.pid))
        assert child.stdin is not None and child.stdout is not None
        child.stdin.write("go\n")
        child.stdin.flush()
        if child.stdout.readline().strip() != "ready":
            raise SystemExit("the child process did not start")
        print(record(args.name, args.root, out, child.pid, command))
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
        scratch.unlink(missing_ok=True)
        for d in made:
            for p in (d, d.parent):
                with contextlib.suppress(OSError):
                    p.rmdir()  # an emptied cgroup is removed with rmdir
    return 0


if __name__ == "__main__":
    sys.exit(main())
