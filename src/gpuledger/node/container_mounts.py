"""A path inside a container, found on the host through the container's mounts, read safely.

``docker inspect`` lists a container's mounts (``Mounts``: ``Type``, ``Source``, ``Destination``):
a bind mount's ``Source`` is the host directory given to ``-v``; a named or anonymous volume's
(a Dockerfile's ``VOLUME ["/workspace/runs"]`` makes one) is a folder under the volume's
``Mountpoint`` (``/var/lib/docker/volumes/<name>/_data``). A container path maps to the host
through the mount with the longest ``Destination`` that contains it (nested mounts: a volume at
``/workspace/runs`` inside a bind of ``/workspace``); a path on no mount (the container's own
writable layer, a tmpfs) is not mapped.

Reading is refused rather than guessed wherever the host path could leave the mount's source:
a container path with a ``..`` component is not mapped, and below the source every component is
opened with ``O_NOFOLLOW`` relative to its parent (``openat``), so a symbolic link anywhere on the
way, which the container may have planted to point at any host file, is not followed. Only
regular files are read, and only up to a size limit.
"""

from __future__ import annotations

import os
import posixpath
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK  # a FIFO must not block the agent


@dataclass(frozen=True)
class Mount:
    source: str  # on the host
    destination: str  # in the container
    kind: str = "bind"  # "bind", "volume", "tmpfs", ...


@dataclass(frozen=True)
class ContainerFs:
    """What the agent needs to find a container's files: its mounts and working directory."""

    mounts: tuple[Mount, ...] = ()
    working_dir: str = "/"


@dataclass(frozen=True)
class HostPath:
    """A container path on the host: ``root`` (a mount's source) and the components below it."""

    root: str
    parts: tuple[str, ...]
    mount: Mount

    def __str__(self) -> str:
        return posixpath.join(self.root, *self.parts)


def fs_from_inspect(doc: Mapping[str, Any]) -> ContainerFs:
    """The mounts and working directory of an inspected container (``Mounts``, ``Config.WorkingDir``)."""
    mounts = []
    for m in doc.get("Mounts") or ():
        if not isinstance(m, Mapping):
            continue
        source, dest = m.get("Source"), m.get("Destination") or m.get("Target")
        if isinstance(source, str) and source.startswith("/") and isinstance(dest, str) and dest.startswith("/"):
            mounts.append(Mount(source, dest, str(m.get("Type") or "bind")))
    wd = (doc.get("Config") or {}).get("WorkingDir")
    return ContainerFs(tuple(mounts), wd if isinstance(wd, str) and wd.startswith("/") else "/")


def _parts(path: str) -> tuple[str, ...] | None:
    """The components of an absolute path; None when one is ``..`` (it could climb out of a mount)."""
    parts = tuple(p for p in path.split("/") if p and p != ".")
    return None if ".." in parts else parts


def to_host(path: str, fs: ContainerFs) -> HostPath | None:
    """Where ``path`` (the container's, absolute or relative to its working directory) lies on
    the host; None when it is on no mount with a host source or names ``..``."""
    if not path.startswith("/"):
        path = posixpath.join(fs.working_dir or "/", path)
    wanted = _parts(path)
    if wanted is None:
        return None
    best: tuple[int, Mount] | None = None
    for mount in fs.mounts:
        if mount.kind == "tmpfs":
            continue  # memory only: nothing on the host to read
        dest = _parts(mount.destination)
        if dest is None or wanted[: len(dest)] != dest:
            continue
        if best is None or len(dest) > best[0]:
            best = (len(dest), mount)
    if best is None:
        return None
    depth, mount = best
    return HostPath(mount.source, wanted[depth:], mount)


def open_file(where: HostPath, name: str | None = None, *, max_b: int) -> int | None:
    """A descriptor (the caller closes it) of the regular file at ``where`` (or of ``name`` in
    that directory); None when it is missing, not a regular file, larger than ``max_b``, or the
    way to it holds a symbolic link."""
    parts = (*where.parts, name) if name else where.parts
    if any(p in ("", ".", "..") or "/" in p for p in parts):
        return None
    try:
        # The source itself is the administrator's (docker run -v): it may be a link they made.
        fd = os.open(where.root, os.O_RDONLY | os.O_CLOEXEC | (os.O_DIRECTORY if parts else os.O_NONBLOCK))
    except OSError:
        return None
    try:
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            try:
                nfd = os.open(part, _FILE_FLAGS if last else _DIR_FLAGS, dir_fd=fd)
            except OSError:  # missing, or a symbolic link (ELOOP / ENOTDIR with O_NOFOLLOW)
                return None
            os.close(fd)
            fd = nfd
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > max_b:
            return None
        out, fd = fd, -1
        return out
    finally:
        if fd >= 0:
            os.close(fd)


def read_file(where: HostPath, name: str | None = None, *, max_b: int) -> bytes | None:
    """The bytes of the regular file at ``where`` (or of ``name`` in that directory), at most
    ``max_b`` of them; None where ``open_file`` refuses it."""
    fd = open_file(where, name, max_b=max_b)
    if fd is None:
        return None
    try:
        chunks, left = [], max_b + 1
        while left > 0 and (piece := os.read(fd, min(left, 1 << 20))):
            chunks.append(piece)
            left -= len(piece)
        data = b"".join(chunks)
        return data if len(data) <= max_b else None
    finally:
        os.close(fd)
