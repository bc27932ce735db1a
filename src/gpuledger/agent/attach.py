"""A wrapped run's push to a team server, as the recorder's ``start_push`` hook (recorder/hooks.py)."""

from __future__ import annotations

from collections.abc import Callable

from gpuledger.agent.client import normalise_server
from gpuledger.agent.pusher import Pusher

FINAL_PUSH_S = 5.0  # how long ``gpuledger run`` waits, after CMD ended, for the last batches


class RunPush:
    """The recorder's view of a Pusher (recorder/hooks.Push): wake it after a flush, finish it at the end."""

    def __init__(self, pusher: Pusher) -> None:
        self.pusher = pusher

    def wake(self) -> None:
        self.pusher.wake()

    def finish(self, warn: Callable[[str], None]) -> None:
        """Wait up to FINAL_PUSH_S for the last batches; what is left stays in the outbox."""
        pusher = self.pusher
        if not pusher.close(FINAL_PUSH_S):
            why = f" ({pusher.last_error})" if pusher.last_error else ""
            warn(
                f"gpuledger: run {pusher.run_id} is not fully on {pusher.server} yet{why}; it stays in the local "
                "ledger's outbox: push it with: gpuledger sync"
            )


def start_pusher(
    server: str, token: str | None, db_url: str | None, run_id: str, warn: Callable[[str], None]
) -> RunPush | None:
    """This run's pusher, started; None (and a warning) when it cannot start."""
    try:
        pusher = Pusher(db_url, normalise_server(server), token, run_id, warn=warn)
        pusher.start()
        return RunPush(pusher)
    except Exception as exc:  # never in the way of the training
        warn(f"gpuledger: cannot push to {server} ({exc}); push later with: gpuledger sync --all")
        return None
