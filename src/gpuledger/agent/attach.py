"""The two calls ``gpuledger run`` makes to push a run to a team server (kept out of wrap.py)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from gpuledger.agent.client import ENV_SERVER, normalise_server
from gpuledger.agent.pusher import Pusher

FINAL_PUSH_S = 5.0  # how long ``gpuledger run`` waits, after CMD ended, for the last batches


def server_from(option: str | None, env: Mapping[str, str]) -> str | None:
    """--server, else GPULEDGER_SERVER; None when neither is set."""
    url = (option or env.get(ENV_SERVER, "")).strip()
    return normalise_server(url) if url else None


def start_pusher(
    server: str | None, token: str | None, db_url: str | None, run_id: str, warn: Callable[[str], None]
) -> Pusher | None:
    if not server:
        return None
    try:
        pusher = Pusher(db_url, normalise_server(server), token, run_id, warn=warn)
        pusher.start()
        return pusher
    except Exception as exc:  # never in the way of the training
        warn(f"gpuledger: cannot push to {server} ({exc}); push later with: gpuledger sync --all")
        return None


def finish_pusher(pusher: Pusher | None, warn: Callable[[str], None], timeout_s: float = FINAL_PUSH_S) -> None:
    if pusher is None:
        return
    if not pusher.close(timeout_s):
        why = f" ({pusher.last_error})" if pusher.last_error else ""
        warn(
            f"gpuledger: run {pusher.run_id} is not fully on {pusher.server} yet{why}; it stays in the local "
            "ledger's outbox: push it with: gpuledger sync"
        )
