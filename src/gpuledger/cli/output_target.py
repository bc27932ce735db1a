"""What an ``-o FILE`` path names, and so how it must be written (cli/output.py writes it).

* ``-``: stdout.
* A path that names one of this process's open descriptors (``/dev/fd/N``, ``/proc/self/fd/N``):
  that descriptor, as the shell set it up (a pipe, a terminal, a file opened for appending), never
  a file made in ``/proc``; ``/dev/stdout`` (descriptor 1) is stdout, as ``-``.
* An existing FIFO, character or block device or socket: opened and written in place, so a
  reader gets the output and a full disk (``/dev/full``) is an error, never a regular file made
  in its place.
* A regular file or a new name: written beside it and renamed over it (whole or not at all).

Symbolic links are followed one hop at a time, so the file a link points at is written and the
link stays a link, and a link to ``/proc/self/fd/1`` is seen as stdout before ``/proc`` would
turn it into a name like ``pipe:[1234]``.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

STDOUT = "-"
_MAX_HOPS = 40  # as the kernel's own limit on links followed in one lookup
_OWN_FD = re.compile(r"/(?:proc/(?:self|thread-self|(?P<pid>\d+))|dev)/fd/(?P<fd>\d+)")


class Kind(Enum):
    STDOUT = "stdout"
    DESCRIPTOR = "descriptor"  # one of our open descriptors, named through /proc or /dev/fd
    IN_PLACE = "in place"  # an existing FIFO, device or socket
    REPLACE = "replace"  # a regular file or a new name


@dataclass(frozen=True)
class Target:
    kind: Kind
    path: Path | None = None  # the file to write or replace, links followed (IN_PLACE, REPLACE)
    fd: int | None = None  # DESCRIPTOR
    mode: int | None = None  # REPLACE over an existing file: its permission bits, kept


def resolve(name: str) -> Target:
    """What ``name`` names now. Raises OSError for a loop of links or an unreadable folder."""
    if name == STDOUT:
        return Target(Kind.STDOUT)
    path = _parent_resolved(Path(name).expanduser())
    for _ in range(_MAX_HOPS):
        fd = own_descriptor(path)
        if fd is not None:  # /dev/stdout is stdout, so it acts as ``-`` does
            return Target(Kind.STDOUT) if fd == 1 else Target(Kind.DESCRIPTOR, fd=fd)
        if not path.is_symlink():
            return _by_type(path)
        link = os.readlink(path)
        path = _parent_resolved(path.parent / link)  # a relative link is relative to its own folder
    raise OSError(40, "Too many levels of symbolic links", name)


def own_descriptor(path: Path) -> int | None:
    """N when ``path`` is ``/proc/self/fd/N`` (or our pid's, or ``/dev/fd/N``) and N is open."""
    match = _OWN_FD.fullmatch(str(path))
    if match is None or (match["pid"] is not None and int(match["pid"]) != os.getpid()):
        return None
    fd = int(match["fd"])
    try:
        os.fstat(fd)
    except OSError:
        return None
    return fd


def _by_type(path: Path) -> Target:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return Target(Kind.REPLACE, path=path)
    if stat.S_ISREG(st.st_mode):
        return Target(Kind.REPLACE, path=path, mode=stat.S_IMODE(st.st_mode))
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(21, "Is a directory", str(path))
    return Target(Kind.IN_PLACE, path=path)


def _parent_resolved(path: Path) -> Path:
    """``path`` with the links in its folders followed, the last part as it is (maybe a link)."""
    return Path(os.path.realpath(path.parent)) / path.name
