"""What every Ultralytics callback of gpuledger shares: only rank -1/0 reports, and no error escapes.

A broken archive must not break a training or an evaluation; ``GPULEDGER_DEBUG=1`` shows the
errors on stderr.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any


def rank() -> int:
    try:
        return int(os.environ.get("RANK", "-1"))
    except ValueError:
        return -1


def debug_traceback() -> None:
    if os.environ.get("GPULEDGER_DEBUG"):
        import traceback

        traceback.print_exc()


def safe(fn: Callable[[Any], None]) -> Callable[[Any], None]:
    @functools.wraps(fn)
    def callback(obj: Any) -> None:
        try:
            if rank() in (-1, 0):
                fn(obj)
        except Exception:
            debug_traceback()

    return callback
