"""Is NVML's library there at all? Asked before pynvml and the NVML collector are imported.

On a machine without an NVIDIA driver, importing pynvml and the collector's modules only to learn
that ``libnvidia-ml.so.1`` cannot be loaded cost ``gpuledger run`` a fifth of its start-up
(BENCHMARKS.md, "Wrapper overhead"). The probe loads the library by the name pynvml loads it by,
so it answers exactly what ``nvmlInit`` would find.
"""

from __future__ import annotations

import ctypes
import sys

LIBRARY = "libnvidia-ml.so.1"  # the name pynvml's nvmlInit loads on Linux
MISSING = f"NVML library not loadable ({LIBRARY}): no NVIDIA driver installed here"


def loadable() -> bool:
    """False only when the library certainly cannot be loaded (elsewhere than Linux: pynvml decides)."""
    if not sys.platform.startswith("linux"):
        return True
    try:
        ctypes.CDLL(LIBRARY)
    except OSError:
        return False
    return True
