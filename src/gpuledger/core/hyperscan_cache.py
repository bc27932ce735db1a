"""Hyperscan databases compiled once per machine, not once per process.

A chatty ``gpuledger run`` compiles three databases in its output relay (the redaction's line
filter and keyword finder, the end-of-run reader's stream patterns): about 0.03 s of CPU, a tenth
of what the relay spends on 50 MB of output. Their inputs are fixed by the rules shipped with the
package, so each compiled database is kept in ``<cache dir>/hyperscan/`` (paths.cache_dir), named
by the sha256 of everything that shapes it (the expressions, their ids and flags, the mode, the
hyperscan package's version, this machine's architecture), and read back in microseconds.

A file is used only when it is whole: it holds the sha256 of the database it carries, checked
before Hyperscan reads it, and Hyperscan itself refuses a database built by another version or
for a CPU lacking what it needs. Anything else (no file, a damaged or refused one, a folder that
cannot be written) compiles as before; a compiled database is written to a temporary file and
renamed, so a reader never sees half of one. Only the newest ``KEEP`` files are kept.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

from gpuledger.core.hyperscan_lib import hyperscan as _hyperscan
from gpuledger.paths import cache_dir

KEEP = 32  # databases kept; the package's own rules need three
_MAGIC = b"GPLHSDB1"
_DIGEST_B = 32


def compile_database(mode: int, expressions: Sequence[bytes], flags: Sequence[int]) -> object:
    """A database of ``expressions`` (ids: their indices) in ``mode``, from the cache when it holds
    one, else compiled (and kept). Raises what ``Database.compile`` raises (hyperscan.error)."""
    hs = _hyperscan()
    assert hs is not None
    path = _path(mode, expressions, flags)
    if path is not None:
        cached = _load(path, mode)
        if cached is not None:
            return cached
    db = hs.Database(mode=mode)
    db.compile(
        expressions=list(expressions), ids=list(range(len(expressions))), elements=len(expressions), flags=list(flags)
    )
    if path is not None:
        _save(path, hs.dumpb(db))
    return db


def _path(mode: int, expressions: Sequence[bytes], flags: Sequence[int]) -> Path | None:
    hs = _hyperscan()
    assert hs is not None
    key = hashlib.sha256(
        repr((_MAGIC, hs.__version__, os.uname().machine, mode, list(expressions), list(flags))).encode()
    ).hexdigest()
    try:
        return cache_dir() / "hyperscan" / f"{key}.hsdb"
    except RuntimeError:  # no home directory to find the cache in
        return None


def _load(path: Path, mode: int) -> object | None:
    hs = _hyperscan()
    assert hs is not None
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except OSError:
        return None
    head, digest, body = raw[: len(_MAGIC)], raw[len(_MAGIC) : len(_MAGIC) + _DIGEST_B], raw[len(_MAGIC) + _DIGEST_B :]
    if head != _MAGIC or hashlib.sha256(body).digest() != digest:
        return None
    try:
        db = hs.loadb(body, mode)
        # Scratch space, as compiling gives one: a stream's close and a scan given none use it.
        db.scratch = hs.Scratch(db)
    except hs.error:  # another Hyperscan's format, or a CPU without what the database needs
        return None
    return db


def _save(path: Path, body: bytes) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with open(tmp, "wb") as fh:
            fh.write(_MAGIC + hashlib.sha256(body).digest() + body)
        os.replace(tmp, path)
        _prune(path.parent)
    with contextlib.suppress(OSError):
        os.unlink(tmp)  # left only when the rename failed


def _prune(folder: Path) -> None:
    """Keep the newest KEEP databases: edited rules (or generated ones, in tests) each leave one."""
    files = [(entry.stat().st_mtime, entry.path) for entry in os.scandir(folder) if entry.name.endswith(".hsdb")]
    for _, old in sorted(files)[:-KEEP]:
        with contextlib.suppress(OSError):
            os.unlink(old)
