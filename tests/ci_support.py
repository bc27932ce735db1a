"""Skips that depend on the environment only, and never in CI.

A test may skip because the machine lacks a tool or package (a newcomer's laptop without
Chromium, say); in CI (the ``CI`` environment variable, which .ci/run sets) every expected tool is
installed, so a missing one is a failure, never a silent skip.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest


def in_ci() -> bool:
    return bool(os.environ.get("CI"))


def missing(what: str, hint: str) -> None:
    """Skip outside CI, fail in CI, because ``what`` is not on this machine."""
    if in_ci():
        pytest.fail(f"{what} is missing in CI: {hint}")
    pytest.skip(f"{what} is not installed ({hint}) and CI is not set", allow_module_level=True)


def need_module(name: str, hint: str) -> ModuleType:
    """The module, or a skip (outside CI) / a failure (in CI) when it cannot be imported."""
    try:
        return importlib.import_module(name)
    except ImportError:
        missing(f"the Python module {name}", hint)
        raise  # unreachable: missing() always raises
