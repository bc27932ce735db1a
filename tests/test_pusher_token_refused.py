"""A push the server refuses for its token (401, 403) says so, not "pushed when the server is back".

Found walking the README: `run --server` with a member token got a 403, and the line told the user
to wait for a server that was up all along. The run is still kept and retried (a membership or a
token can be fixed on the server), so only the words change.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from gpuledger.agent.client import Client
from gpuledger.agent.pusher import Pusher
from gpuledger.store import Ledger
from test_agent_outbox import SERVER, _local_run


def _refusing(status: int, detail: str) -> httpx.MockTransport:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, json={"detail": detail}, request=request)

    return httpx.MockTransport(answer)


@pytest.mark.parametrize(
    ("status", "detail"),
    [(401, "missing token"), (403, "role 'member' cannot write; use an agent token")],
)
def test_a_refused_token_is_named_and_the_run_kept_for_later(tmp_path: Path, status: int, detail: str) -> None:
    local = Ledger(tmp_path / "local.db")
    run_id = _local_run(local, 1)
    lines: list[str] = []
    client = Client(SERVER, "t", transport=_refusing(status, detail))
    pusher = Pusher(str(tmp_path / "local.db"), SERVER, "t", run_id, warn=lines.append, client=client)
    pusher.push_once()
    assert len(lines) == 1, lines
    assert f"HTTP {status}" in lines[0] and detail in lines[0]
    assert "pushed when the token is accepted" in lines[0]
    assert "server is back" not in lines[0]
    assert pusher._next_try < float("inf")  # still tried again later


def test_a_server_that_is_away_still_says_so(tmp_path: Path) -> None:
    local = Ledger(tmp_path / "local.db")
    run_id = _local_run(local, 1)
    lines: list[str] = []
    client = Client(SERVER, "t", transport=_refusing(503, "down for maintenance"))
    pusher = Pusher(str(tmp_path / "local.db"), SERVER, "t", run_id, warn=lines.append, client=client)
    pusher.push_once()
    assert "pushed when the server is back" in lines[0], lines
