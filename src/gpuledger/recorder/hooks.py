"""What other parts of gpuledger plug into a wrapped run. The recorder names none of them: the
CLI (cli/run_hooks.py) passes the integrations and the team-server push in, so the recorder never
imports a layer above it, and a run can be recorded with none of them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import mmap

    from gpuledger.recorder.session import Session

Warn = Callable[[str], None]
# (session, log, status, exit code, signal) -> the reason for the run's status, or None to keep it;
# the log may be the file mapped (recorder/wrap.py), with the relay's line index attached
Explain = Callable[["Session", "bytes | mmap.mmap", str, "int | None", "int | None"], "str | None"]


class Push(Protocol):
    """A run's push to the team server, running beside the recorder."""

    def wake(self) -> None:
        """Something new was flushed to the ledger: send it soon."""

    def finish(self, warn: Warn) -> None:
        """The run has ended: send what is left (bounded), warn about what could not be sent."""


@dataclass(frozen=True)
class RunHooks:
    # CMD's environment -> variables to add to it (zero-code integrations loading inside CMD)
    child_env: Callable[[Mapping[str, str]], Mapping[str, str]] | None = None
    # read the run's log after the recorder stopped: why it failed, epochs nobody reported
    explain: Explain | None = None
    # (run id, warn) -> the run's push to a team server, or None (not configured, or cannot start)
    start_push: Callable[[str, Warn], Push | None] | None = None
