"""What ``gpuledger run`` plugs into the recorder (recorder/hooks.py): the integrations that load
inside CMD and read its log afterwards, and the push to a team server when one is given."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuledger.recorder.hooks import Push, RunHooks, Warn

if TYPE_CHECKING:
    import mmap

    from gpuledger.recorder.session import Session


def explain_run(
    session: Session, log: bytes | mmap.mmap, status: str, exit_code: int | None, signal: int | None
) -> str | None:
    # imported when CMD has ended, not before it starts
    from gpuledger.integrations.ultralytics.postrun import explain_run as explain

    return explain(session, log, status, exit_code, signal)


def run_hooks(server: str | None, token: str | None, db_url: str | None) -> RunHooks:
    from gpuledger.integrations.autoload import autoload_env

    if not server:
        return RunHooks(child_env=autoload_env, explain=explain_run)

    def start_push(run_id: str, warn: Warn) -> Push | None:
        # the agent (httpx, outbox) is only loaded for a run that pushes to a server
        from gpuledger.agent.attach import start_pusher

        return start_pusher(server, token, db_url, run_id, warn)

    return RunHooks(child_env=autoload_env, explain=explain_run, start_push=start_push)
