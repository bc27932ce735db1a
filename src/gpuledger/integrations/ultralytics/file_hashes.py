"""Content hashes of files, cached by (absolute path, size, mtime_ns), so a split is read once.

The cache is a SQLite file in the user's cache folder (paths.cache_dir, ``file-hashes.sqlite``):
one row per file. A file whose size or modification time changed is read again; a file modified
less than ``RACY_S`` ago is hashed but not cached, since a write in the same clock tick would
leave its size and mtime unchanged (git's "racy" case). The cache is an optimisation only: when
it cannot be opened or written (read-only home, a locked file), every file is simply read.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sqlite3
import time
from pathlib import Path

CACHE_NAME = "file-hashes.sqlite"
RACY_S = 2.0
BLOCK_B = 1 << 20


def sha256_of(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(BLOCK_B), b""):
            digest.update(block)
    return digest.hexdigest()


def default_cache_path() -> Path:
    from gpuledger.paths import cache_dir

    return cache_dir() / CACHE_NAME


class FileHashes:
    """``digest(path)`` -> (size, sha256 hex); ``hits`` and ``reads`` count what the cache saved."""

    def __init__(self, cache_path: str | os.PathLike[str] | None = None, *, use_cache: bool = True) -> None:
        self.hits = 0
        self.reads = 0
        self._db: sqlite3.Connection | None = None
        self._new: list[tuple[str, int, int, str]] = []
        self._loaded: dict[str, tuple[int, int, str]] = {}  # path -> (size, mtime_ns, sha256)
        if use_cache:
            self._db = _open(Path(cache_path) if cache_path is not None else default_cache_path())

    def preload(self, folder: str | os.PathLike[str]) -> None:
        """Read the cached hashes of every file below ``folder`` in one query (a split's files are
        then dictionary look-ups, not one query each)."""
        if self._db is None:
            return
        prefix = os.path.join(os.path.abspath(os.fspath(folder)), "")
        upper = prefix[:-1] + chr(ord(prefix[-1]) + 1)  # every path that starts with the prefix
        with contextlib.suppress(sqlite3.Error):
            rows = self._db.execute(
                "SELECT path, size, mtime_ns, sha256 FROM file_hash WHERE path >= ? AND path < ?", (prefix, upper)
            )
            self._loaded.update((p, (size, mtime, sha)) for p, size, mtime, sha in rows)

    def digest(self, path: str | os.PathLike[str]) -> tuple[int, str]:
        """Size and sha256 of the file at ``path`` (OSError when it cannot be read)."""
        absolute = os.path.abspath(os.fspath(path))
        st = os.stat(absolute)
        key = (absolute, st.st_size, st.st_mtime_ns)
        loaded = self._loaded.get(absolute)
        if loaded is not None and loaded[:2] == key[1:]:
            self.hits += 1
            return st.st_size, loaded[2]
        if self._db is not None and loaded is None:
            with contextlib.suppress(sqlite3.Error):
                row = self._db.execute(
                    "SELECT sha256 FROM file_hash WHERE path = ? AND size = ? AND mtime_ns = ?", key
                ).fetchone()
                if row is not None:
                    self.hits += 1
                    return st.st_size, row[0]
        sha = sha256_of(absolute)
        self.reads += 1
        if self._db is not None and time.time() - st.st_mtime_ns / 1e9 >= RACY_S:
            self._new.append((*key, sha))
        return st.st_size, sha

    def close(self) -> None:
        """Store the hashes read (one transaction) and close the cache."""
        if self._db is None:
            return
        with contextlib.suppress(sqlite3.Error), self._db:
            self._db.executemany(
                "INSERT OR REPLACE INTO file_hash (path, size, mtime_ns, sha256) VALUES (?, ?, ?, ?)", self._new
            )
        self._new = []
        with contextlib.suppress(sqlite3.Error):
            self._db.close()
        self._db = None

    def __enter__(self) -> FileHashes:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _open(path: Path) -> sqlite3.Connection | None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        db = sqlite3.connect(str(path), timeout=10)
        db.execute(
            "CREATE TABLE IF NOT EXISTS file_hash ("
            "path TEXT PRIMARY KEY, size INTEGER NOT NULL, mtime_ns INTEGER NOT NULL, sha256 TEXT NOT NULL)"
        )
        db.commit()
        return db
    except (OSError, sqlite3.Error):
        return None
