"""Optional parts of gpuledger and the extra that installs each (``pip install 'gpuledger[EXTRA]'``).

A command that needs an optional library asks for it here, so a missing one is one sentence that
names the extra to install, never an ``ImportError`` traceback.
"""

from __future__ import annotations

import importlib
from types import ModuleType


class MissingExtra(ImportError):
    """An optional library is not installed; ``extra`` is what to ``pip install``."""

    def __init__(self, purpose: str, extra: str, missing: str) -> None:
        self.purpose, self.extra, self.missing = purpose, extra, missing
        super().__init__(
            f"{purpose} needs the [{extra}] extra ({missing} is not installed): pip install 'gpuledger[{extra}]'"
        )


def require(module: str, *, extra: str, purpose: str) -> ModuleType:
    """``import module``, or MissingExtra naming the extra that provides it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtra(purpose, extra, exc.name or module) from exc
