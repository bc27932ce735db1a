"""Hyperscan databases are compiled once per machine and read back from the cache
(core/hyperscan_cache.py): a later process reads the file instead of compiling, finds exactly what
a compiled database finds, and a damaged, foreign or unwritable cache only means compiling again."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ci_support import need_module

need_module("hyperscan", "pip install hyperscan (a dependency of gpuledger on x86-64 Linux)")

import hyperscan as hs  # noqa: E402

from gpuledger.core import hyperscan_cache  # noqa: E402
from gpuledger.core.hyperscan_cache import compile_database  # noqa: E402

EXPRESSIONS = [rb"tok(?:en)?[=:]\S+", rb"\x1b\[", rb"epoch \d+"]
FLAGS = [hs.HS_FLAG_CASELESS, 0, 0]
TEXT = b"start TOKEN=abc\x1b[1m epoch 12 token:xyz\n" * 3


def _matches(db: object) -> list[tuple[int, int]]:
    found: list[tuple[int, int]] = []
    db.scan(TEXT, match_event_handler=lambda i, _s, end, _f, _c: found.append((i, end)))  # type: ignore[attr-defined]
    return found


def _reference() -> list[tuple[int, int]]:
    db = hs.Database(mode=hs.HS_MODE_BLOCK)
    db.compile(expressions=EXPRESSIONS, ids=list(range(len(EXPRESSIONS))), elements=len(EXPRESSIONS), flags=FLAGS)
    return _matches(db)


def _other_database() -> bytes:
    """A database Hyperscan reads without complaint, of other expressions."""
    db = hs.Database(mode=hs.HS_MODE_BLOCK)
    db.compile(expressions=[b"zzz"], ids=[0], elements=1, flags=[0])
    return hs.dumpb(db)


def _files(home: Path) -> list[Path]:
    folder = home / "cache" / "hyperscan"
    return sorted(folder.glob("*.hsdb")) if folder.is_dir() else []


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GPULEDGER_HOME", str(tmp_path))
    return tmp_path


def test_a_compiled_database_is_kept_and_read_back_instead_of_compiled_again(home: Path) -> None:
    first = compile_database(hs.HS_MODE_BLOCK, EXPRESSIONS, FLAGS)
    (kept,) = _files(home)
    before = kept.stat()
    again = compile_database(hs.HS_MODE_BLOCK, EXPRESSIONS, FLAGS)
    after = kept.stat()
    # Read, not compiled and written again (a write renames a new file into place).
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert _matches(first) == _matches(again) == _reference()


def test_other_expressions_flags_or_mode_get_their_own_database(home: Path) -> None:
    compile_database(hs.HS_MODE_BLOCK, EXPRESSIONS, FLAGS)
    compile_database(hs.HS_MODE_BLOCK, EXPRESSIONS, [0, 0, 0])
    compile_database(hs.HS_MODE_BLOCK, EXPRESSIONS[:2], FLAGS[:2])
    stream = compile_database(hs.HS_MODE_STREAM, EXPRESSIONS, FLAGS)
    assert len(_files(home)) == 4
    assert _matches(compile_database(hs.HS_MODE_BLOCK, EXPRESSIONS, [0, 0, 0])) != _reference()  # case counts
    found: list[int] = []

    def on_match(_id: int, _start: int, end: int, _flags: int, _context: object) -> None:
        found.append(end)

    # A variable holds the handler: python-hyperscan's stream keeps no reference to it.
    with stream.stream(match_event_handler=on_match) as scanning:  # type: ignore[attr-defined]
        scanning.scan(TEXT[:20])
        scanning.scan(TEXT[20:])
    assert sorted(found) == sorted(end for _, end in _reference())


@pytest.mark.parametrize(
    "damage",
    [
        lambda raw: raw[: len(raw) // 2],  # cut short
        lambda raw: raw[:-1] + bytes([raw[-1] ^ 1]),  # one bit of the database changed
        lambda raw: b"not a database at all",
        lambda raw: b"",
        lambda raw: raw[: len(hyperscan_cache._MAGIC) + 32] + _other_database(),  # whole, but not what was kept
    ],
    ids=["cut", "bit", "garbage", "empty", "swapped"],
)
def test_a_damaged_file_is_compiled_over(home: Path, damage) -> None:
    compile_database(hs.HS_MODE_BLOCK, EXPRESSIONS, FLAGS)
    (kept,) = _files(home)
    kept.write_bytes(damage(kept.read_bytes()))
    assert _matches(compile_database(hs.HS_MODE_BLOCK, EXPRESSIONS, FLAGS)) == _reference()
    mended = kept.stat()
    assert _matches(compile_database(hs.HS_MODE_BLOCK, EXPRESSIONS, FLAGS)) == _reference()
    assert kept.stat().st_ino == mended.st_ino  # rewritten whole, and read from then on


def test_a_whole_file_hyperscan_refuses_is_compiled_over(home: Path) -> None:
    """Its own checksum holds, but Hyperscan refuses what it carries (another version's format)."""
    import hashlib

    compile_database(hs.HS_MODE_BLOCK, EXPRESSIONS, FLAGS)
    (kept,) = _files(home)
    body = b"\0" * 4096
    kept.write_bytes(hyperscan_cache._MAGIC + hashlib.sha256(body).digest() + body)
    assert _matches(compile_database(hs.HS_MODE_BLOCK, EXPRESSIONS, FLAGS)) == _reference()
    assert kept.read_bytes() != hyperscan_cache._MAGIC + hashlib.sha256(body).digest() + body


def test_a_cache_that_cannot_be_written_only_means_compiling(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("the cache folder cannot be made under a file")
    monkeypatch.setenv("GPULEDGER_HOME", str(blocker))
    assert _matches(compile_database(hs.HS_MODE_BLOCK, EXPRESSIONS, FLAGS)) == _reference()
    assert _matches(compile_database(hs.HS_MODE_BLOCK, EXPRESSIONS, FLAGS)) == _reference()


def test_only_the_newest_databases_are_kept(home: Path) -> None:
    for n in range(hyperscan_cache.KEEP + 5):
        compile_database(hs.HS_MODE_BLOCK, [b"word%d" % n], [0])
        folder = home / "cache" / "hyperscan"
        for i, path in enumerate(sorted(folder.glob("*.hsdb"), key=lambda p: p.stat().st_mtime_ns)):
            os.utime(path, ns=(i, i))  # the order they were written in, whatever the clock's grain
    assert len(_files(home)) == hyperscan_cache.KEEP
    newest = compile_database(hs.HS_MODE_BLOCK, [b"word%d" % (hyperscan_cache.KEEP + 4)], [0])
    found: list[int] = []
    newest.scan(b"a word%d b" % (hyperscan_cache.KEEP + 4), match_event_handler=lambda *a: found.append(a[2]))  # type: ignore[attr-defined]
    assert found == [2 + len(b"word%d" % (hyperscan_cache.KEEP + 4))]


_RELAY = """
import os, sys
from gpuledger.core.redaction.redact import Redactor
from gpuledger.recorder.relay import pump
log = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
pump({0: 1}, log, Redactor.default().stream, sys.argv[1] + ".lines", None)
"""


def test_the_relay_of_a_later_run_reads_the_cache_and_writes_the_same_log_and_index(tmp_path: Path) -> None:
    """Two relays, real processes: the first compiles the redaction's and the line index's
    databases and keeps them, the second reads them; logs and line indexes are byte for byte the same."""
    output = b"".join(
        b"\r%6d/300 loss %.3f |%s| token=hf_%032d \x1b[32mok\x1b[0m\n" % (i, i / 7, b"#" * (i % 40), i)
        for i in range(3000)
    )
    output += b"Killed\nCUDA out of memory. Tried to allocate 2.00 GiB\n"
    env = {**os.environ, "GPULEDGER_HOME": str(tmp_path / "home")}
    logs = []
    for n in range(2):
        log = tmp_path / f"run{n}.log"
        done = subprocess.run(
            [sys.executable, "-c", _RELAY, str(log)], input=output, env=env, capture_output=True, check=True
        )
        assert done.stdout == output  # the terminal copy: unchanged
        logs.append((log.read_bytes(), Path(f"{log}.lines").read_bytes()))
        if n == 0:
            kept = {p: p.stat().st_ino for p in _files(tmp_path / "home")}
    assert len(kept) >= 2  # the line filter and the line index's stream patterns at least
    assert {p: p.stat().st_ino for p in _files(tmp_path / "home")} == kept  # read, not written again
    assert logs[0] == logs[1]
    assert b"hf_0000" not in logs[0][0] and b"[REDACTED:" in logs[0][0]
