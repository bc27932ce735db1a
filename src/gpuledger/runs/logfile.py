"""A run's log: the relay's file while the run lives, one capped copy in the ledger after it.

Where the log is kept, and why:

- ``<data dir>/logs/<run id>.log`` is written by the output relay (redacted) while CMD runs. It is
  the copy that survives gpuledger being killed, so it exists for as long as the run is live, and
  for a run whose end could not be written (``lost``, or kept in the spool for ``gpuledger
  recover``).
- The ledger's ``logs`` row is the archived copy: what ``gpuledger logs``, the team server push
  and the audit trail's seal (the sha256 of the stored bytes) read. When the run's end is written
  the file is copied there, capped (core/training/logcap.py: head and tail around a marker), and removed,
  so a finished run's output is kept once.

The cap is ``GPULEDGER_LOG_MAX_B`` (bytes, or e.g. ``256MiB``; at least 64 KiB), 64 MiB by default.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from collections.abc import Mapping

from gpuledger.core.training.logcap import DEFAULT_MAX_B, ENV_VAR, CappedLog, cap_parts, check_cap, parse_size, windows


def log_cap(env: Mapping[str, str]) -> int:
    """The cap from ``env``; ValueError with a message naming the variable when it is not a size
    (``gpuledger run`` checks it before CMD starts)."""
    text = env.get(ENV_VAR, "").strip()
    if not text:
        return DEFAULT_MAX_B
    try:
        return check_cap(parse_size(text))
    except ValueError as exc:
        raise ValueError(f"{ENV_VAR}={text!r}: {exc}") from None


def cap_or_default(env: Mapping[str, str]) -> int:
    """The cap for reading a log back (``gpuledger logs``, recover): the default when ``env``'s
    value is not a size, as a read must not fail on it."""
    try:
        return log_cap(env)
    except ValueError:
        return DEFAULT_MAX_B


def read_capped(path: str, cap_b: int) -> CappedLog | None:
    """The log file as it would be stored: whole, or its head and tail around the marker. Only
    those parts are read, however large the file. None when it cannot be read."""
    try:
        with open(path, "rb") as fh:
            total = os.fstat(fh.fileno()).st_size
            head_b, tail_b = windows(total, cap_b)
            if not head_b:
                data = fh.read(total)  # what it held when looked at (a lost run's CMD may still write)
                return CappedLog(data, len(data), False)
            head = fh.read(head_b)
            fh.seek(total - tail_b)
            tail = fh.read(tail_b)
    except OSError:
        return None
    return cap_parts(head, tail, total, cap_b)


def map_whole(path: str, size_b: int) -> mmap.mmap | None:
    """The log file mapped read-only, when it holds exactly ``size_b`` bytes (``gpuledger run``:
    the bytes the relay's line index describes, the relay having ended). The end-of-run readers
    cut their lines out of the mapping and the ledger hashes and compresses it where it lies, so
    a chatty run's log is never copied whole into gpuledger (50 MB: 0.02-0.03 s of CPU and its
    memory). None where it cannot be mapped so: read it with ``read_capped``."""
    if size_b <= 0:
        return None
    try:
        with open(path, "rb") as fh:
            if os.fstat(fh.fileno()).st_size != size_b:
                return None
            # The relay, the only writer, has ended and only ever appended: the pages stay valid.
            return mmap.mmap(fh.fileno(), size_b, prot=mmap.PROT_READ)
    except (OSError, ValueError):
        return None


def archive(ledger, run_id: str, path: str, cap_b: int, *, remove: bool) -> CappedLog | None:
    """Store the log file in the ledger (capped); with ``remove``, delete the file once stored.
    Returns what was stored; None when there is no file. Ledger errors are raised, and the file
    is then kept."""
    capped = read_capped(path, cap_b)
    if capped is None:
        return None
    ledger.set_log(run_id, capped.data, truncated=capped.truncated)
    if remove:
        remove_file(path)
    return capped


def archive_once(ledger, run_id: str, path: str, cap_b: int, *, remove: bool = True) -> None:
    """Store the file unless the ledger has the run's log already, then remove it (a recovered
    run: the ledger is where its log is kept from now on) unless ``remove`` is False (a process
    still writes it)."""
    if not os.path.isfile(path):
        return
    if ledger.log_info(run_id) is None:
        archive(ledger, run_id, path, cap_b, remove=remove)
    elif remove:
        remove_file(path)


def remove_file(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
