"""Hyperscan, the C multi-pattern matcher the redaction filter and the end-of-run log reader use
for large texts, imported once on first use."""

from __future__ import annotations

import functools
from types import ModuleType


@functools.cache
def hyperscan() -> ModuleType | None:
    """The hyperscan module, imported on first use (about 25 ms, which a process that never scans a
    large text does not pay); None where it has no wheel."""
    try:
        import hyperscan
    except ImportError:
        return None
    return hyperscan
