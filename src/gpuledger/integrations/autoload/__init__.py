"""Zero-code capture: environment additions that make CMD's Python load gpuledger's integrations.

``gpuledger run`` puts ``sitedir/`` first on CMD's ``PYTHONPATH``. Python imports the
``sitecustomize.py`` there at start-up; when ``GPULEDGER_RUN_ID`` and ``GPULEDGER_CONTROL`` are set
it installs an import hook (hooks.py) and loads the user's own sitecustomize, if any. Nothing else
happens until the program imports a library gpuledger integrates with, so Python programs that do
not (and every program run outside gpuledger) are unaffected.

Not loaded: interpreters started with ``-S``, ``-E`` or ``-I`` (they ignore PYTHONPATH or site),
and Python older than 3.10. ``GPULEDGER_AUTOLOAD=0`` turns it off.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

SITE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sitedir")


def autoload_env(env: Mapping[str, str]) -> dict[str, str]:
    """Variables to add to CMD's environment: PYTHONPATH with the sitecustomize folder first."""
    if env.get("GPULEDGER_AUTOLOAD", "1") == "0":
        return {}
    current = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if SITE_DIR in current:  # nested gpuledger run
        return {}
    return {"PYTHONPATH": os.pathsep.join([SITE_DIR, *current])}
