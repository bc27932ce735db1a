"""Log uploads (``PUT /runs/{id}/log``) streamed to disk, redacted on the way, and stored a few at a
time.

The body is never held in memory while it arrives: chunks are redacted line by line (the same
rules as the agent, core/redaction/redact.py) and appended to a temporary file, in the thread pool so a large
log never blocks the event loop. The request guard (limits.py) has already checked the token and
counts the bytes: past ``Settings.max_log_b`` the upload stops with 413, and a body that stalls gets
408. Only then is the file read back and stored in the ledger (the database takes the log in one
piece), under a per-process limit of ``Settings.log_writes`` at once, so memory is bounded by that
many logs whatever the number of uploads in flight. The temporary file is always removed.

The ledger's log cap (``GPULEDGER_LOG_MAX_B``, 64 MiB by default; core/training/logcap.py) holds on
the server too: a longer log is stored as its head and tail around the cut marker, read from the
file without loading the rest. Whether the stored log is cut is the server's finding (it cut it,
or it carries an agent's valid cut marker), never a client's header.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from fastapi import HTTPException, Request
from fastapi.concurrency import run_in_threadpool

from gpuledger.core.redaction.redact import LineRedactor, Redactor
from gpuledger.core.training.logcap import CappedLog, cap_parts, find_cut, windows
from gpuledger.server.limits import BodyTimeout, BodyTooLarge

T = TypeVar("T")
FLUSH_B = 1 << 20  # redact and write in pieces of about this size
_writers: dict[int, threading.BoundedSemaphore] = {}
_writers_lock = threading.Lock()


def _gate(limit: int) -> threading.BoundedSemaphore:
    with _writers_lock:
        return _writers.setdefault(limit, threading.BoundedSemaphore(max(1, limit)))


@dataclass
class Upload:
    """A received, redacted log on disk. ``store(fn, cap)`` hands the bytes to keep (at most
    ``cap``) and whether they are cut to ``fn``, and removes the file."""

    path: str
    size_b: int = 0  # bytes received (before redaction)
    sha256: str = ""  # of what is stored (after redaction and the cap)
    truncated: bool = False  # what is stored is a cut log (the server's or the agent's cut)
    limit: int = 2
    _removed: bool = field(default=False, repr=False)

    async def store(self, write: Callable[[bytes, bool], T], cap_b: int) -> T:
        def locked() -> T:
            with _gate(self.limit):
                kept = read_capped(self.path, cap_b)
                self.truncated = kept.truncated or find_cut(kept.data) is not None
                self.sha256 = hashlib.sha256(kept.data).hexdigest()
                return write(kept.data, self.truncated)

        try:
            return await run_in_threadpool(locked)
        finally:
            self.remove()

    def remove(self) -> None:
        if not self._removed:
            self._removed = True
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)


async def receive(request: Request) -> Upload:
    """Stream the request body to a temporary file, redacted; 413 / 408 as the guard decides."""
    settings = request.app.state.settings
    fd, path = tempfile.mkstemp(prefix="gpuledger-log-", suffix=".part")
    upload = Upload(path, limit=settings.log_writes)
    redactor = LineRedactor(Redactor.default())
    digest = hashlib.sha256()

    def write(piece: bytes, last: bool) -> None:
        out = redactor.feed(piece) + (redactor.flush() if last else b"")
        digest.update(out)
        _write_all(fd, out)

    pending: list[bytes] = []
    pending_b = 0
    try:
        async for chunk in request.stream():
            upload.size_b += len(chunk)
            pending.append(chunk)
            pending_b += len(chunk)
            if pending_b >= FLUSH_B:
                await run_in_threadpool(write, b"".join(pending), False)
                pending, pending_b = [], 0
        await run_in_threadpool(write, b"".join(pending), True)
    except BodyTooLarge as exc:
        upload.remove()
        raise HTTPException(status_code=413, detail=str(exc)) from None
    except BodyTimeout as exc:
        upload.remove()
        raise HTTPException(status_code=408, detail=str(exc), headers={"Connection": "close"}) from None
    except BaseException:
        upload.remove()
        raise
    finally:
        os.close(fd)
    upload.sha256 = digest.hexdigest()  # the whole redacted log's; store() sets what is kept
    return upload


def read_capped(path: str, cap_b: int) -> CappedLog:
    """The file's bytes as the ledger keeps them: whole when they fit ``cap_b``, else its head and
    tail around the marker (only those are read)."""
    with open(path, "rb") as fh:
        total = os.fstat(fh.fileno()).st_size
        head_b, tail_b = windows(total, cap_b)
        if not head_b:
            return CappedLog(fh.read(), total, False)
        head = fh.read(head_b)
        fh.seek(total - tail_b)
        return cap_parts(head, fh.read(tail_b), total, cap_b)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
