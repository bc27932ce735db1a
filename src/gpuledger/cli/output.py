"""Where commands write their results: ``-o FILE`` checked before any work, then written into what
the path names (cli/output_target.py decides which of these it is).

``OutputPath`` refuses a file whose folder does not exist (or is not writable) while the options
are parsed, so a long report is never computed only to fail at the end (exit 2, a usage error).
``write_with`` / ``write_text_with`` / ``write_text`` then write:

* a regular file or a new name (a symbolic link's target, the link kept): beside it, flushed to
  disk and renamed over it, so a failure half-way (disk full) leaves an existing file as it was;
* a FIFO, a device or one of our open descriptors (``/dev/stdout``): opened and written in place,
  never replaced by a regular file;
* ``-``: stdout.

A failed write is one error line and exit 1 (``cannot write FILE: ...``), never exit 0; stdout
whose reader stopped early (``| head``) is the one quiet exception, as for any Unix filter.
"""

from __future__ import annotations

import contextlib
import io
import os
import select
import sys
import tempfile
from collections.abc import Callable
from functools import partial
from typing import Any, BinaryIO, TextIO

import click

from gpuledger.cli.output_target import STDOUT, Kind, Target, resolve

__all__ = ["STDOUT", "OutputPath", "output_problem", "write_text", "write_text_with", "write_with"]


class OutputPath(click.ParamType):
    """A file to create or replace; ``-`` means stdout when ``allow_stdout``."""

    name = "file"

    def __init__(self, allow_stdout: bool = True) -> None:
        self.allow_stdout = allow_stdout

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = os.fspath(value)
        if text == STDOUT and self.allow_stdout:
            return text
        problem = output_problem(text)
        if problem:
            self.fail(problem, param, ctx)
        return text


def output_problem(path: str) -> str | None:
    """Why ``path`` cannot be written, or None."""
    if not path:
        return "give a file name"
    try:
        target = resolve(path)
    except IsADirectoryError:
        return f"{path} is a folder: give a file name inside it"
    except OSError as exc:
        return f"cannot write {path}: {exc.strerror or exc}"
    if target.path is None:  # stdout or an open descriptor: the shell already opened it
        return None
    if target.kind is Kind.IN_PLACE:
        return None if os.access(target.path, os.W_OK) else f"cannot write {path}: no permission to write to it"
    folder = target.path.parent
    if not folder.exists():
        return f"cannot write {path}: the folder {folder} does not exist"
    if not folder.is_dir():
        return f"cannot write {path}: {folder} is not a folder"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"cannot write {path}: no permission to create files in {folder}"
    if target.mode is not None and not os.access(target.path, os.W_OK):
        return f"cannot write {path}: the file is read-only"
    return None


def write_with(path: str, write: Callable[[BinaryIO], None]) -> None:
    """Call ``write(fh)`` with a binary file whose bytes end up in what ``path`` names."""
    try:
        target = resolve(path)
    except OSError as exc:
        raise _cannot(path, exc) from exc
    if target.kind is Kind.STDOUT:
        _to_stdout(lambda: _binary_stdout(write))
    elif target.fd is not None:  # one of our descriptors, named through /dev/fd or /proc
        _in_place(path, partial(os.dup, target.fd), write)
    elif target.kind is Kind.IN_PLACE and target.path is not None:
        _in_place(path, partial(os.open, target.path, os.O_WRONLY | os.O_CLOEXEC), write)
    else:
        _replace(path, target, write)


def write_text_with(path: str | None, write: Callable[[TextIO], None]) -> None:
    """``write_with`` for text: UTF-8 to a file; None or ``-``: stdout, in its own encoding."""
    if path is None or path == STDOUT:
        _to_stdout(lambda: write(sys.stdout))
        return

    def put(fh: BinaryIO) -> None:
        text = io.TextIOWrapper(fh, encoding="utf-8")
        write(text)
        text.detach()  # flushes; the binary file stays open for write_with to finish and close

    write_with(path, put)


def write_text(path: str | None, text: str, announce: bool = False) -> None:
    """``text`` to ``path`` (None or ``-``: stdout)."""
    write_text_with(path, lambda fh: fh.write(text))
    if announce and path not in (None, STDOUT):
        click.echo(f"wrote {path}", err=True)


def _binary_stdout(write: Callable[[BinaryIO], None]) -> None:
    sys.stdout.flush()  # text printed before stays before
    write(sys.stdout.buffer)
    sys.stdout.buffer.flush()


def _to_stdout(write: Callable[[], None]) -> None:
    try:
        write()
        sys.stdout.flush()
    except BrokenPipeError:  # the reader stopped (| head): nothing more to say
        silence_stdout()
    except OSError as exc:
        silence_stdout()
        raise click.ClickException(f"cannot write to stdout: {exc.strerror or exc}") from exc


def silence_stdout() -> None:
    """Point stdout at /dev/null: what is still buffered would fail again at exit, with a traceback."""
    with contextlib.suppress(OSError, ValueError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def stdout_reader_gone() -> bool:
    """Whether stdout is a pipe or terminal with no reader left: the kernel reports POLLERR on a
    pipe's write end once its read end is closed, POLLHUP on a terminal hung up."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))
    except (OSError, ValueError):
        return False


def _in_place(shown: str, opener: Callable[[], int], write: Callable[[BinaryIO], None]) -> None:
    """A FIFO, device or open descriptor: no temporary file, no rename (a FIFO waits for a reader)."""
    try:
        with open(opener(), "wb") as fh:
            write(fh)
    except OSError as exc:
        raise _cannot(shown, exc) from exc


def _replace(shown: str, target: Target, write: Callable[[BinaryIO], None]) -> None:
    path = target.path
    assert path is not None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise _cannot(shown, exc) from exc
    try:
        with open(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())  # on disk before it is renamed in: a crash leaves old or new, whole
        os.chmod(tmp, 0o666 & ~_umask() if target.mode is None else target.mode)  # a replaced file keeps its mode
        os.replace(tmp, path)
    except OSError as exc:
        raise click.ClickException(f"cannot write {shown}: {exc.strerror or exc}; nothing was written") from exc
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _cannot(shown: str, exc: OSError) -> click.ClickException:
    return click.ClickException(f"cannot write {shown}: {exc.strerror or exc}")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
