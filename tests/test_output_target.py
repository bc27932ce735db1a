"""``-o FILE`` writes into what the path names (cli/output_target.py, cli/output.py).

Real ``gpuledger`` processes export a real run (recorded with ``gpuledger run --no-gpu`` on a
SQLite ledger) and write ``report chargeback`` / ``report run`` into a FIFO, a symbolic link, a
descriptor named through ``/proc/self/fd``, device nodes made here (1,7 is /dev/full's device:
every write fails with ENOSPC; 1,3 is /dev/null's), stdout and a regular file. The real /dev
entries are never touched: a regression would replace a node in tmp_path, not the machine's.
"""

from __future__ import annotations

import io
import os
import stat
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from ci_support import need_module

T = TypeVar("T")
DEADLINE_S = 120  # for one command; a loaded machine is slow, never this slow
PIPE_BUF_B = 65536  # Linux's default pipe capacity

EXPORTS = {
    "csv": ["export", "--format", "csv"],
    "parquet": ["export", "--format", "parquet"],
    "chargeback": ["report", "chargeback", "--format", "csv"],
}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A SQLite ledger with one real recorded run, and the environment that points at it."""
    root = tmp_path_factory.mktemp("output-target")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULEDGER_")}
    env.update(GPULEDGER_HOME=str(root / "home"), GPULEDGER_DB=f"sqlite:///{root / 'ledger.db'}")
    done = subprocess.run(
        [sys.executable, "-m", "gpuledger", "run", "--no-gpu", "-q", "--", sys.executable, "-c", "print('hi')"],
        env=env, capture_output=True, timeout=DEADLINE_S,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return env


def gl(world: dict[str, str], *args: str, **kw: Any) -> subprocess.CompletedProcess[bytes]:
    """A real ``gpuledger`` process, in the test's folder: a stray file it makes lands there."""
    return subprocess.run(
        [sys.executable, "-m", "gpuledger", *args],
        env=world, cwd=Path(world["GPULEDGER_HOME"]).parent, capture_output=True, timeout=DEADLINE_S, **kw,
    )  # fmt: skip


@pytest.fixture(scope="module")
def expected(world: dict[str, str]) -> dict[str, bytes]:
    """What each command writes to stdout with ``-o -``: the bytes every other target must get."""
    need_module("pyarrow.parquet", "the parquet extra: pip install 'gpuledger[parquet]'")
    return {name: _ok(gl(world, *args, "-o", "-")).stdout for name, args in EXPORTS.items()}


def _ok(done: subprocess.CompletedProcess[bytes]) -> subprocess.CompletedProcess[bytes]:
    assert done.returncode == 0, done.stderr.decode()
    assert b"Traceback" not in done.stderr, done.stderr.decode()
    return done


def _same_content(name: str, got: bytes, want: bytes) -> None:
    if name == "parquet":  # a whole file a reader can open, with the same rows
        pq = need_module("pyarrow.parquet", "the parquet extra: pip install 'gpuledger[parquet]'")
        assert pq.read_table(io.BytesIO(got)).equals(pq.read_table(io.BytesIO(want)))
    assert got == want


def _one_error(done: subprocess.CompletedProcess[bytes], *expected: str) -> None:
    shown = done.stderr.decode()
    assert done.returncode == 1, shown
    assert "Traceback" not in shown, shown
    errors = [line for line in shown.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, shown
    for text in expected:
        assert text in errors[0], shown


@pytest.mark.parametrize("name", EXPORTS)
def test_dash_writes_to_stdout(name: str, world: dict[str, str], expected: dict[str, bytes]) -> None:
    got = expected[name]
    if name == "parquet":
        assert got.startswith(b"PAR1") and got.endswith(b"PAR1")
    else:
        assert got.startswith(b"run_id," if name == "csv" else b"team,"), got[:80]


@pytest.mark.parametrize("name", EXPORTS)
def test_a_fifo_read_by_a_thread_gets_the_whole_output(
    name: str, world: dict[str, str], expected: dict[str, bytes], tmp_path: Path
) -> None:
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    got, done = read_fifo_while(fifo, lambda: gl(world, *EXPORTS[name], "-o", str(fifo)))
    _ok(done)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)  # written into, not replaced by a regular file
    _same_content(name, got, expected[name])


def test_a_fifo_whose_reader_leaves_is_an_error(world: dict[str, str], tmp_path: Path) -> None:
    """EPIPE: the report is larger than the pipe, the reader takes one byte and goes."""
    whole = tmp_path / "whole.html"
    _ok(gl(world, "report", "run", "-o", str(whole)))
    assert whole.stat().st_size > PIPE_BUF_B + 4096, "the report must not fit in the pipe"
    fifo = tmp_path / "report.fifo"
    os.mkfifo(fifo)

    def take_one_byte() -> None:
        with open(fifo, "rb") as fh:
            fh.read(1)

    reader = threading.Thread(target=take_one_byte, daemon=True)
    reader.start()
    try:
        done = gl(world, "report", "run", "-o", str(fifo))
    finally:
        _release(fifo)
    _one_error(done, f"cannot write {fifo}", "Broken pipe")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_a_symlink_is_followed_and_stays_a_link(
    world: dict[str, str], expected: dict[str, bytes], tmp_path: Path
) -> None:
    (tmp_path / "data").mkdir()
    real = tmp_path / "data" / "run.csv"
    real.write_text("an older export\n")
    link = tmp_path / "latest.csv"
    link.symlink_to(Path("data") / "run.csv")  # relative: resolved from the link's own folder
    chained = tmp_path / "chained.csv"
    chained.symlink_to(link)
    _ok(gl(world, *EXPORTS["csv"], "-o", str(chained)))
    assert chained.is_symlink() and os.readlink(chained) == str(link)
    assert link.is_symlink() and os.readlink(link) == str(Path("data") / "run.csv")
    assert real.read_bytes() == expected["csv"]
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["chained.csv", "data", "latest.csv", "run.csv"]


def test_a_dangling_symlink_creates_its_target(
    world: dict[str, str], expected: dict[str, bytes], tmp_path: Path
) -> None:
    link = tmp_path / "out.parquet"
    link.symlink_to(tmp_path / "made.parquet")
    _ok(gl(world, *EXPORTS["parquet"], "-o", str(link)))
    assert link.is_symlink()
    _same_content("parquet", (tmp_path / "made.parquet").read_bytes(), expected["parquet"])


def test_a_link_to_an_open_descriptor_writes_into_it(
    world: dict[str, str], expected: dict[str, bytes], tmp_path: Path
) -> None:
    """As ``-o /dev/stdout`` or ``/dev/fd/3``: the descriptor the caller set up, never a file in /proc."""
    out = tmp_path / "stdout-link"
    out.symlink_to("/proc/self/fd/1")
    done = _ok(gl(world, *EXPORTS["csv"], "-o", str(out)))
    assert done.stdout == expected["csv"]
    read_end, write_end = os.pipe()
    fd_link = tmp_path / "fd-link"
    fd_link.symlink_to(f"/dev/fd/{write_end}")
    chunks: list[bytes] = []
    drain = threading.Thread(target=_drain, args=(read_end, chunks), daemon=True)
    drain.start()
    try:
        _ok(gl(world, *EXPORTS["parquet"], "-o", str(fd_link), pass_fds=(write_end,)))
    finally:
        os.close(write_end)
    drain.join(DEADLINE_S)
    os.close(read_end)
    _same_content("parquet", b"".join(chunks), expected["parquet"])
    assert out.is_symlink() and fd_link.is_symlink()


@pytest.mark.parametrize("name", EXPORTS)
def test_a_full_device_is_an_error_and_stays_a_device(name: str, world: dict[str, str], tmp_path: Path) -> None:
    full = _char_device(tmp_path / "full", 1, 7)
    done = gl(world, *EXPORTS[name], "-o", str(full))
    _one_error(done, f"cannot write {full}", "No space left on device")
    assert b"wrote" not in done.stderr
    _is_char_device(full, 1, 7)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full"]  # no temporary file left


@pytest.mark.parametrize("name", EXPORTS)
def test_the_null_device_stays_a_device(name: str, world: dict[str, str], tmp_path: Path) -> None:
    null = _char_device(tmp_path / "null", 1, 3)
    _ok(gl(world, *EXPORTS[name], "-o", str(null)))
    _is_char_device(null, 1, 3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["null"]


@pytest.mark.parametrize("name", EXPORTS)
def test_a_regular_file_is_replaced_whole(
    name: str, world: dict[str, str], expected: dict[str, bytes], tmp_path: Path
) -> None:
    """A new file (renamed in: a new inode), the old file's permission bits kept, nothing left beside."""
    target = tmp_path / "out.file"
    target.write_text("the previous export\n")
    target.chmod(0o640)
    before = target.stat().st_ino
    _ok(gl(world, *EXPORTS[name], "-o", str(target)))
    assert target.stat().st_ino != before
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    _same_content(name, target.read_bytes(), expected[name])
    assert [p.name for p in tmp_path.iterdir()] == ["out.file"]


# -- helpers ------------------------------------------------------------------------------------


def read_fifo_while(fifo: Path, run: Callable[[], T]) -> tuple[bytes, T]:
    """What ``run`` writes into ``fifo``, read by a thread. A writer of our own holds the FIFO open
    until ``run`` returns, so a command that never writes ends the read instead of hanging it."""
    read_end = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # does not wait for a writer
    keep = os.open(fifo, os.O_WRONLY)  # a reader exists, so this does not wait either
    os.set_blocking(read_end, True)
    chunks: list[bytes] = []
    reader = threading.Thread(target=_drain, args=(read_end, chunks), daemon=True)
    reader.start()
    try:
        result = run()
    finally:
        os.close(keep)
    reader.join(DEADLINE_S)
    assert not reader.is_alive()
    os.close(read_end)
    return b"".join(chunks), result


def _drain(fd: int, chunks: list[bytes]) -> None:
    while chunk := os.read(fd, 1 << 16):
        chunks.append(chunk)


def _release(fifo: Path) -> None:
    """A reader thread still waiting in open() (the command never opened the FIFO) is let go."""
    try:
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:  # ENXIO: nobody is waiting to read
        return
    os.close(fd)


def _char_device(path: Path, major: int, minor: int) -> Path:
    try:
        os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(major, minor))
    except PermissionError:  # not root, or a container without CAP_MKNOD: the FIFO tests still run
        pytest.skip("making a device node needs root (CAP_MKNOD)")
    return path


def _is_char_device(path: Path, major: int, minor: int) -> None:
    st = os.lstat(path)
    assert stat.S_ISCHR(st.st_mode), oct(st.st_mode)
    assert (os.major(st.st_rdev), os.minor(st.st_rdev)) == (major, minor)
