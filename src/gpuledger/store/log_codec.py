"""How a run's log is kept in ``logs.data``: zlib-compressed when that is shorter (migration 13).

A training's console output is mostly repeated progress lines, so a log stored compressed takes a
fraction of the space on a team ledger (a 64 MiB log of progress bars shrinks about tenfold or
more). ``size_b`` and ``sha256`` always describe the log itself, so the stored form tells itself:
data as long as ``size_b`` is the log as it is (rows written before migration 13, and logs that do
not compress), shorter data is its zlib stream. Seals cover the log itself (``decode``), so a
row's form can change without touching any seal.

Speed: the stream is written by ISA-L (``isal``, a dependency), whose deflate produces a standard
zlib stream about ten times faster than zlib's default level (a 50 MB training log: 0.09 s instead
of 1.05 s of CPU, 12.2 MB instead of 9.7 MB). Any zlib reads it back; where isal cannot be imported
zlib's level 1 writes the same format (0.3 s, 12.7 MB).
"""

from __future__ import annotations

import hashlib
import mmap
import zlib
from collections.abc import Callable

from gpuledger.store.errors import LedgerError

_ISAL_LEVEL = 2  # ISA-L's levels are 0-3; 2 is as fast as 1 (0.09 s for 50 MB) and a little smaller
_ZLIB_LEVEL = 1  # without isal: zlib's fastest, 3.5x quicker than its default 6 for 30 % more bytes


def _compressor() -> Callable[[bytes | mmap.mmap], bytes]:
    try:
        from isal import isal_zlib
    except ImportError:  # a platform without an isal wheel: the same format, slower
        return lambda data: zlib.compress(data, _ZLIB_LEVEL)
    return lambda data: isal_zlib.compress(data, _ISAL_LEVEL)


def encode(data: bytes | mmap.mmap) -> bytes:
    """The stored form of ``data`` (bytes, or a log file mapped): compressed when that is shorter,
    else ``data`` itself."""
    packed = _compressor()(data)
    if len(packed) < len(data):
        return packed
    return data if isinstance(data, bytes) else bytes(data)


def decode(stored: bytes, size_b: int) -> bytes:
    """The log from its stored form and length (``logs.size_b``)."""
    if len(stored) == size_b:
        return stored
    try:
        data = zlib.decompress(stored)
    except zlib.error as exc:
        raise LedgerError(f"the stored log is damaged: {exc}") from None
    if len(data) != size_b:
        raise LedgerError(f"the stored log is damaged: {len(data)} bytes where its row says {size_b}")
    return data


def digest(stored: bytes, size_b: int) -> str:
    """sha256 of the log, for its run's seal; stored bytes that are no log at all (damaged, or
    edited with SQL) get a value no log has, so the seal names them changed."""
    try:
        return hashlib.sha256(decode(stored, size_b)).hexdigest()
    except LedgerError:
        return "damaged:" + hashlib.sha256(stored).hexdigest()
