"""Where commands write their results: ``-o FILE`` checked before any work, written whole or not at all.

``OutputPath`` refuses a file whose folder does not exist (or is not writable) while the options
are parsed, so a long report is never computed only to fail at the end (exit 2, a usage error).
``write_text`` / ``write_with`` write next to the target and rename, so a failure half-way (disk
full) leaves an existing file as it was, and report it as one error line (exit 1).
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

STDOUT = "-"


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
    target = Path(path).expanduser()
    if target.is_dir():
        return f"{path} is a folder: give a file name inside it"
    folder = target.parent
    if not folder.exists():
        return f"cannot write {path}: the folder {folder} does not exist"
    if not folder.is_dir():
        return f"cannot write {path}: {folder} is not a folder"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"cannot write {path}: no permission to create files in {folder}"
    if target.exists() and not os.access(target, os.W_OK):
        return f"cannot write {path}: the file is read-only"
    return None


def write_with(path: str, write: Callable[[str], None]) -> None:
    """Call ``write(tmp_path)`` for a temporary file beside ``path``, then put it in place."""
    target = Path(path).expanduser()
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        os.close(fd)
    except OSError as exc:
        raise click.ClickException(f"cannot write {path}: {exc.strerror or exc}") from exc
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, target)
    except OSError as exc:
        raise click.ClickException(f"cannot write {path}: {exc.strerror or exc}; nothing was written") from exc
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def write_text(path: str | None, text: str, announce: bool = False) -> None:
    """``text`` to ``path`` (None or ``-``: stdout)."""
    if path is None or path == STDOUT:
        sys.stdout.write(text)
        sys.stdout.flush()
        return

    def put(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)

    write_with(path, put)
    if announce:
        click.echo(f"wrote {path}", err=True)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
