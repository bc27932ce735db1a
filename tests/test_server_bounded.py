"""Issue 33, bounded work: what a member or a stranger can make a real ``gpuledger serve`` (a child
process, on SQLite and PostgreSQL where a database is involved) hold or do, and the bound on it.

Parallel log reads are streamed and counted under ``max_streams``; a body sent where none is taken
is answered unread; the log cap holds on the server whatever a header says; a push has caps per
kind of row, and the agent splits its backlog under them; X-Forwarded-For is believed from nobody
by default; refused pushes are folded in the audit trail; run ids are case-blind; a cached token
stops working when it expires or is revoked."""

from __future__ import annotations

import hashlib
import os
import socket
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from audit_support import audit_key, audit_rows, keyring, payload_of, sql
from gpuledger.agent.client import Client
from gpuledger.agent.outbox import drain_run
from gpuledger.core import push_caps
from gpuledger.core.model import Event, Metric, RunRecord
from gpuledger.core.training.logcap import find_cut
from gpuledger.store import Ledger, accounts, audit, pushes
from server_support import BACKENDS, NOW, ServerProcess, backend_url, batch, bearer, run_doc, setup_accounts

pytestmark = pytest.mark.slow


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    with backend_url(request.param, tmp_path) as url:
        yield url


def _serve(stack: ExitStack, url: str, tmp_path: Path, **env: str) -> ServerProcess:
    return stack.enter_context(ServerProcess(url, log=tmp_path / "server.log", env=env))


def _rss_b(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _finished_run(server: ServerProcess, token: str) -> dict[str, Any]:
    run = run_doc(status="succeeded", ended_at=NOW - 600, exit_code=0)
    got = httpx.post(server.url + "/api/v1/ingest", json=batch(run, n=3), headers=bearer(token), timeout=60)
    assert got.status_code == 200, got.text
    return run


# -- logs ------------------------------------------------------------------------------------------


def test_parallel_log_reads_are_streamed_and_counted(db_url: str, tmp_path: Path) -> None:
    tokens = setup_accounts(db_url)
    log = b"".join(b"%08d %s\n" % (i, os.urandom(24).hex().encode()) for i in range(800_000))  # ~48 MiB
    with ExitStack() as stack:
        server = _serve(stack, db_url, tmp_path, GPULEDGER_MAX_STREAMS="4")
        run = _finished_run(server, tokens.agent_a)
        with Ledger(db_url) as led:
            led.set_log(run["id"], log)  # stored compressed (about half): decoded whole, it was 1.5x the log
        url = f"{server.url}/api/v1/runs/{run['id']}/log"
        assert server.proc is not None
        before = _rss_b(server.proc.pid)
        with httpx.Client(timeout=120) as client:
            streams = [stack.enter_context(client.stream("GET", url, headers=bearer(tokens.admin))) for _ in range(6)]
            statuses = sorted(s.status_code for s in streams)
            assert statuses == [200] * 4 + [429] * 2, statuses  # max_streams: the other two retry later
            readers = [s for s in streams if s.status_code == 200]
            pieces = [s.iter_raw(1 << 20) for s in readers]
            firsts = [next(it) for it in pieces]  # every stream open and started
            peak = _rss_b(server.proc.pid) - before
            digests = []
            for it, first in zip(pieces, firsts, strict=True):
                digest = hashlib.sha256(first)
                for chunk in it:
                    digest.update(chunk)
                    peak = max(peak, _rss_b(server.proc.pid) - before)
                digests.append(digest.hexdigest())
        assert digests == [hashlib.sha256(log).hexdigest()] * 4
        # Four readers of a 48 MiB log: whole, they cost 4 x (48 + 24) MiB; streamed, a few MiB each.
        assert peak < len(log), f"the server grew by {peak / 2**20:.0f} MiB serving four reads"


def test_a_stored_log_is_read_back_a_bounded_piece_at_a_time(db_url: str) -> None:
    from gpuledger.store import log_stream

    with Ledger(db_url) as led:
        for data in (b"epoch 1 42%\r" * 400_000, os.urandom(300_000), b""):  # compressed, stored as is, empty
            run_id = str(uuid.uuid4())
            led.create_run(RunRecord(run_id, ["python", "t.py"], "u", "h", "/", NOW))
            led.set_log(run_id, data)
            found = log_stream.open_log(led.database, run_id, chunk_b=65536)
            assert found is not None
            info, reader = found
            try:
                pieces = list(reader)
            finally:
                reader.close()
            assert b"".join(pieces) == data and info.size_b == len(data)
            assert all(len(p) <= 65536 for p in pieces)
        assert log_stream.open_log(led.database, str(uuid.uuid4())) is None


def test_the_log_cap_holds_on_the_server_whatever_the_header_says(db_url: str, tmp_path: Path) -> None:
    tokens = setup_accounts(db_url)
    cap = 1 << 20
    with ExitStack() as stack:
        server = _serve(stack, db_url, tmp_path, GPULEDGER_LOG_MAX_B=str(cap))
        run = _finished_run(server, tokens.agent_a)
        url = f"{server.url}/api/v1/runs/{run['id']}/log"
        big = b"".join(b"line %07d of a chatty training\n" % i for i in range(120_000))  # ~3.7 MiB
        headers = bearer(tokens.agent_a) | {"X-Gpuledger-Log-Truncated": "0"}
        put = httpx.put(url, content=big, headers=headers, timeout=120)
        assert put.status_code == 200, put.text
        assert put.json()["truncated"] is True and put.json()["size_b"] == len(big)
        stored = httpx.get(url, headers=bearer(tokens.admin), timeout=120).content
        assert len(stored) <= cap and put.json()["sha256"] == hashlib.sha256(stored).hexdigest()
        cut = find_cut(stored)
        assert cut is not None and cut.total_b == len(big) and stored.startswith(b"line 0000000 ")
        assert stored.endswith(b"line 0119999 of a chatty training\n")  # the end, where errors are, is kept
        with Ledger(db_url) as led:
            assert led.log_info(run["id"]) == {"sha256": put.json()["sha256"], "size_b": len(stored), "truncated": True}
            # A whole log is not cut, whatever the header claims.
        small = _finished_run(server, tokens.agent_a)
        lie = bearer(tokens.agent_a) | {"X-Gpuledger-Log-Truncated": "1"}
        put = httpx.put(f"{server.url}/api/v1/runs/{small['id']}/log", content=b"ok\n", headers=lie, timeout=60)
        assert put.status_code == 200 and put.json()["truncated"] is False
        with Ledger(db_url) as led:
            assert led.log_info(small["id"])["truncated"] is False  # type: ignore[index]


# -- bodies ----------------------------------------------------------------------------------------


def _headers_only(port: int, head: bytes) -> bytes:
    """Send a request's headers announcing 8 MiB and none of the body; the answer comes unread (a
    server that waits for the body never answers: the socket's deadline fails the test)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(head)
        out = b""
        while b"\r\n\r\n" not in out:
            piece = s.recv(65536)
            if not piece:
                break
            out += piece
        return out


@pytest.mark.parametrize(
    ("request_line", "auth", "status"),
    [
        (b"POST /dashboard/ HTTP/1.1", False, b"405"),  # a page
        (b"POST /nowhere HTTP/1.1", False, b"404"),  # no such path
        (b"PUT /healthz HTTP/1.1", False, b"405"),
        (b"GET /api/v1/runs HTTP/1.1", True, b"413"),  # a GET with a body, with a valid token
        (b"POST /api/v1/runs HTTP/1.1", True, b"405"),
        (b"POST /api/v1/ingest HTTP/1.1", False, b"401"),  # a write path without a token
        (b"POST /api/v1/ingest HTTP/1.1", True, b"403"),  # ... with a member's token, which cannot write
    ],
    ids=["page", "no-path", "healthz", "get-with-body", "post-to-get-route", "no-token", "member-write"],
)
def test_a_body_where_none_is_taken_is_never_read(
    tmp_path: Path, request_line: bytes, auth: bool, status: bytes
) -> None:
    url = f"sqlite:///{tmp_path}/team.db"
    tokens = setup_accounts(url)
    with ExitStack() as stack:
        server = _serve(stack, url, tmp_path, GPULEDGER_BODY_IDLE_S="600", GPULEDGER_BODY_TIMEOUT_S="600")
        head = request_line + b"\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 8388608\r\n"
        if auth:
            head += b"Authorization: Bearer " + tokens.member_a.encode() + b"\r\n"
        answer = _headers_only(server.port, head + b"\r\n")
        assert answer.split(b"\r\n")[0].split(b" ")[1] == status, answer[:300]
        if status != b"401":
            assert b"connection: close" in answer.lower()  # the unread body is never parsed as a request


# -- pushes ----------------------------------------------------------------------------------------


def test_a_push_over_a_cap_is_refused_whole_and_the_agent_splits_its_backlog(db_url: str, tmp_path: Path) -> None:
    tokens = setup_accounts(db_url)
    with ExitStack() as stack:
        server = _serve(stack, db_url, tmp_path)
        run = run_doc()
        events = [{"seq": i, "t": NOW - 3000, "kind": "note", "message": ""} for i in range(push_caps.MAX_EVENTS + 1)]
        got = httpx.post(f"{server.url}/api/v1/ingest", json={"run": run, "events": events},
                         headers=bearer(tokens.agent_a), timeout=120)  # fmt: skip
        assert got.status_code == 413, got.text
        assert f"at most {push_caps.MAX_EVENTS:,} events; this one has {push_caps.MAX_EVENTS + 1:,}" in got.text
        with Ledger(db_url) as led:
            assert not led.read(lambda c: audit_count(c, run["id"]))  # nothing stored, not even the run

        local = Ledger(tmp_path / "local.db")
        run_id = str(uuid.uuid4())
        start = NOW - 86400
        local.create_run(RunRecord(run_id, ["python", "t.py"], "u", "h", "/", start, labels={"project": "A"}))
        n_events, n_metrics = push_caps.MAX_EVENTS * 2 + 7, push_caps.MAX_METRICS + 3
        local.append(
            run_id, [], [],
            [Event(start + i * 0.001, "note", f"e{i}") for i in range(n_events)],
            [Metric(start + i * 0.001, "loss", 0.5, step=i) for i in range(n_metrics)],
        )  # fmt: skip
        local.update_run(run_id, status="succeeded", ended_at=start + 60, exit_code=0)
        pushes.register(local, server.url, [run_id])
        sent: list[tuple[int, int]] = []
        client = Client(server.url, tokens.agent_a, timeout_s=120)
        ingest = client.ingest

        def counted(body: dict[str, Any]) -> Any:
            sent.append((len(body["events"]), len(body["metrics"])))
            return ingest(body)

        client.ingest = counted  # type: ignore[method-assign]
        state = pushes.get(local, server.url, run_id)
        assert state is not None
        result = drain_run(local, client, state, budget=10**6)  # a budget far over the caps
        assert result.done
        assert max(e for e, _ in sent) <= push_caps.MAX_EVENTS and max(m for _, m in sent) <= push_caps.MAX_METRICS
        assert sum(e for e, _ in sent) == n_events  # nothing sent twice: no push was refused
        with Ledger(db_url) as led:
            assert (len(led.events(run_id)), len(led.metrics(run_id))) == (n_events, n_metrics)
        local.close()


def audit_count(conn: Any, run_id: str) -> int:
    import sqlalchemy as sa

    return int(conn.scalar(sa.text("SELECT count(*) FROM runs WHERE id = :id"), {"id": run_id}))


def test_refused_pushes_are_folded_in_the_trail(db_url: str, tmp_path: Path) -> None:
    with audit_key() as key, ExitStack() as stack:
        tokens = setup_accounts(db_url)  # the trail signed from its first row
        with Ledger(db_url) as led:
            _, other = accounts.issue_token(led, "agent-a2", role="agent", projects=["A"], actor="test",
                                            create_user=True)  # fmt: skip
        server = _serve(stack, db_url, tmp_path, GPULEDGER_REFUSED_AUDIT_WINDOW_S="3")
        run = _finished_run(server, tokens.agent_a)
        seal = httpx.post(f"{server.url}/api/v1/ingest", json=batch(run, n=3, final=True),
                          headers=bearer(tokens.agent_a), timeout=60)  # fmt: skip
        assert seal.status_code == 200, seal.text

        def refused_rows() -> list[dict[str, Any]]:
            return [r for r in audit_rows(db_url) if r["action"] == "push.refused"]

        def push() -> None:
            got = httpx.post(f"{server.url}/api/v1/ingest", json=batch(run, n=3), headers=bearer(other), timeout=60)
            assert got.status_code == 409, got.text

        for _ in range(20):  # a flood inside one window
            push()
        rows = refused_rows()
        assert len(rows) <= 2  # not 20: at most one per window (the flood may straddle one edge)
        sent = 20
        deadline = time.monotonic() + 120
        while len(refused_rows()) == len(rows):  # keep refusing until the window has passed
            assert time.monotonic() < deadline, "no second push.refused row after the window"
            push()
            sent += 1
        rows = refused_rows()
        folded = [payload_of(r).get("folded", 0) for r in rows]
        assert len(rows) + sum(folded) == sent  # every refusal is counted, in its row or a later one
        assert folded[-1] > 0
        with Ledger(db_url) as led:
            assert audit.verify(led, keyring=keyring(key)).ok


# -- addresses, ids, tokens ------------------------------------------------------------------------


def test_x_forwarded_for_is_believed_only_from_a_trusted_proxy(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/team.db"
    tokens = setup_accounts(url)
    limits = {"GPULEDGER_RATE_IP_PER_S": "0.01", "GPULEDGER_RATE_IP_BURST": "3"}

    def codes(server: ServerProcess) -> list[int]:
        return [
            httpx.get(f"{server.url}/api/v1/me", timeout=30,
                      headers=bearer(tokens.member_a) | {"X-Forwarded-For": f"10.9.{i}.1", "X-Real-IP": f"10.8.{i}.1"},
                      ).status_code
            for i in range(5)
        ]  # fmt: skip

    with ExitStack() as stack:
        assert codes(_serve(stack, url, tmp_path, **limits)) == [200, 200, 200, 429, 429]
    with ExitStack() as stack:  # behind a proxy on this machine: the header names each client
        trusted = _serve(stack, url, tmp_path, GPULEDGER_TRUSTED_PROXY="127.0.0.1/32", **limits)
        assert codes(trusted) == [200] * 5


def test_run_ids_that_differ_only_in_case_are_one_run(db_url: str, tmp_path: Path) -> None:
    tokens = setup_accounts(db_url)
    with ExitStack() as stack:
        server = _serve(stack, db_url, tmp_path)
        run = run_doc(str(uuid.uuid4()).upper())
        for doc in (run, run | {"id": run["id"].lower()}):
            got = httpx.post(f"{server.url}/api/v1/ingest", json=batch(doc, n=3), headers=bearer(tokens.agent_a),
                             timeout=60)  # fmt: skip
            assert got.status_code == 200, got.text
            assert got.json()["run_id"] == run["id"].lower()
        shown = httpx.get(f"{server.url}/api/v1/runs/{run['id']}", headers=bearer(tokens.admin), timeout=60)
        assert shown.status_code == 200 and shown.json()["id"] == run["id"].lower()
        put = httpx.put(f"{server.url}/api/v1/runs/{run['id']}/log", content=b"x\n", headers=bearer(tokens.agent_a),
                        timeout=60)  # fmt: skip
        assert put.status_code == 200 and put.json()["run_id"] == run["id"].lower()
        with Ledger(db_url) as led:
            assert [r.id for r in led.list_runs()] == [run["id"].lower()]


def test_a_ledger_reads_a_run_id_typed_in_capitals(db_url: str) -> None:
    with Ledger(db_url) as led:  # SQLite's LIKE ignores case, PostgreSQL's does not
        run_id = str(uuid.uuid4())
        led.create_run(RunRecord(run_id, ["python", "t.py"], "u", "h", "/", NOW))
        assert led.resolve(run_id.upper()) == run_id and led.resolve(run_id[:8].upper()) == run_id


def test_a_cached_token_stops_working_when_it_expires_or_is_revoked(db_url: str, tmp_path: Path) -> None:
    setup_accounts(db_url)
    with Ledger(db_url) as led:
        expiring_id, expiring = accounts.issue_token(led, "alice", role="member", actor="test")
        revoked_id, revoked = accounts.issue_token(led, "alice", role="member", actor="test")
    with ExitStack() as stack:
        server = _serve(stack, db_url, tmp_path, GPULEDGER_TOKEN_CACHE_S="3600")  # the cache would outlive both
        me = f"{server.url}/api/v1/me"
        for token in (expiring, revoked):
            assert httpx.get(me, headers=bearer(token), timeout=30).status_code == 200  # looked up, cached
        sql(db_url, "UPDATE api_tokens SET expires_at = :t WHERE id = :id", t=time.time() - 1, id=expiring_id)
        with Ledger(db_url) as led:
            accounts.revoke_token(led, revoked_id, actor="test")
        for token in (expiring, revoked):
            got = httpx.get(me, headers=bearer(token), timeout=30)
            assert got.status_code == 401, got.text  # at once, not when the cache entry ages out
