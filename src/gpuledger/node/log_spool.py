"""A followed container's log on disk, kept as the ledger will store it: head and tail, bounded.

The wrapped path writes a run's whole output to a file and caps it when the run ends
(runs/logfile.py: the first eighth of ``GPULEDGER_LOG_MAX_B`` and the rest from the end, around a
marker; core/training/logcap.py). A container may print for weeks, so the agent's copy cannot grow
with it: once the file passes twice the cap it is rewritten as the log's first ``cap / 8`` bytes
followed by its last ``cap - cap / 8`` bytes (or more), and the bytes dropped in between are
counted. ``capped()`` then gives exactly what ``cap_bytes`` would make of the whole log, so the
stored copy is the same as a wrapped run's, marker included, whatever the log's length. Disk use
stays under three times the cap; memory under the copy buffer's size, except ``capped()``, which
returns the stored bytes (at most the cap).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import BinaryIO

from gpuledger.core.training.logcap import HEAD_SHARE, CappedLog, cap_parts, check_cap, windows

COPY_B = 1 << 20  # compaction copies in pieces of this size


class HeadTailSpool:
    """Bytes appended in order; the file holds the head and a tail long enough for the cap."""

    def __init__(self, path: Path, cap_b: int) -> None:
        self.path = path
        self.cap_b = check_cap(cap_b)
        self.total_b = 0  # bytes appended
        self.compactions = 0
        self._file: BinaryIO | None = None

    def append(self, data: bytes) -> None:
        """Add ``data``; OSError when the file cannot be written (the caller says so)."""
        if not data:
            return
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            # A new spool starts empty (a copy left by an earlier agent is read again from the
            # daemon); one closed when its container stopped goes on where it was (a restart).
            fresh = os.O_TRUNC if self.total_b == 0 else 0
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | fresh | os.O_APPEND | os.O_NOFOLLOW, 0o600)
            self._file = os.fdopen(fd, "ab")
        self._file.write(data)
        self._file.flush()
        self.total_b += len(data)
        if self._file.tell() > 2 * self.cap_b:
            self._compact()

    def capped(self) -> CappedLog | None:
        """The log as the ledger keeps it (``cap_bytes`` of everything appended); None when
        nothing was appended or the file cannot be read."""
        if self.total_b == 0:
            return None
        try:
            with open(self.path, "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                head_b, tail_b = windows(self.total_b, self.cap_b)
                if not head_b:
                    data = fh.read(self.total_b)
                    return CappedLog(data, self.total_b, False)
                head = fh.read(head_b)
                fh.seek(max(head_b, size - tail_b))
                tail = fh.read()
        except OSError:
            return None
        return cap_parts(head, tail, self.total_b, self.cap_b)

    def close(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None

    def remove(self) -> None:
        self.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    def _compact(self) -> None:
        """Rewrite the file as the log's head and its last ``cap`` bytes (a tail long enough for any
        later cap: ``windows`` never asks for more than the cap)."""
        assert self._file is not None
        head_b = self.cap_b // HEAD_SHARE
        self._file.close()
        self._file = None
        tmp = self.path.with_name(self.path.name + ".compact")
        with open(self.path, "rb") as src, open(tmp, "wb") as dst:
            os.fchmod(dst.fileno(), 0o600)
            size = os.fstat(src.fileno()).st_size
            _copy(src, dst, head_b)
            src.seek(max(head_b, size - self.cap_b))
            _copy(src, dst, size)
        os.replace(tmp, self.path)
        self.compactions += 1
        self._file = open(self.path, "ab")  # noqa: SIM115 - kept open while the log grows


def _copy(src: BinaryIO, dst: BinaryIO, n: int) -> None:
    while n > 0 and (piece := src.read(min(COPY_B, n))):
        dst.write(piece)
        n -= len(piece)
