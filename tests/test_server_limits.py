"""What keeps one client from hurting the server: tokens checked before any body is read, rate
limits per token and per address (429 with Retry-After), a token cache that garbage tokens cannot
flush, and deadlines for headers and bodies. The deadlines and the memory of refused uploads are
checked against a real ``gpuledger serve``."""

from __future__ import annotations

import concurrent.futures
import hashlib
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from gpuledger.server.app import create_app
from gpuledger.server.auth import Authenticator
from gpuledger.server.settings import Settings
from gpuledger.store import Ledger, LedgerUnavailable, accounts
from server_support import ServerProcess, Tokens, batch, bearer, fresh_pg_url, run_doc, setup_accounts


@pytest.fixture(scope="module")
def pg() -> Iterator[tuple[str, Tokens]]:
    with fresh_pg_url() as url:
        yield url, setup_accounts(url)


def _client(url: str, **settings: float) -> TestClient:
    return TestClient(create_app(url, settings=Settings(**settings)))  # type: ignore[arg-type]


def test_each_token_has_a_rate_limit_and_is_told_when_to_retry(pg) -> None:  # type: ignore[no-untyped-def]
    url, t = pg
    with _client(url, rate_token_per_s=0.01, rate_token_burst=3) as client:
        codes = [client.get("/api/v1/me", headers=bearer(t.member_a)).status_code for _ in range(4)]
        assert codes == [200, 200, 200, 429]
        refused = client.get("/api/v1/runs", headers=bearer(t.member_a))
        assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 1
        assert "retry in" in refused.json()["detail"]
        assert client.get("/api/v1/me", headers=bearer(t.member_b)).status_code == 200  # another token is fine
        body = batch(run_doc(), n=1)
        assert client.post("/api/v1/ingest", json=body, headers=bearer(t.agent_a)).status_code == 200


def test_each_address_has_a_rate_limit_whatever_the_token(pg) -> None:  # type: ignore[no-untyped-def]
    url, t = pg
    with _client(url, rate_ip_per_s=0.01, rate_ip_burst=5) as client:
        garbage = [bearer(f"glt_{i:012x}_{'x' * 43}") for i in range(5)]
        assert [client.get("/api/v1/me", headers=h).status_code for h in garbage] == [401] * 5
        flood = client.get("/api/v1/me", headers=bearer(t.admin))
        assert flood.status_code == 429 and int(flood.headers["retry-after"]) >= 1
        assert client.get("/dashboard/").status_code == 429
        assert client.get("/healthz").status_code == 200  # load balancers' health checks are exempt


def test_garbage_tokens_cannot_flush_the_token_cache(pg) -> None:  # type: ignore[no-untyped-def]
    url, _ = pg
    with Ledger(url) as led:
        token_id, token = accounts.issue_token(led, "alice", role="member", actor="test")
        auth = Authenticator(led, cache_s=600, size=64)
        assert auth.principal(token) is not None  # looked up once, cached
        for i in range(1000):  # well-formed, unknown: each costs one lookup and a failed-cache entry
            assert auth.principal(f"glt_{i:012x}_{'y' * 43}") is None
        lookups = auth.lookups
        assert auth.principal(token) is not None  # still served from the cache: not pushed out
        assert auth.lookups == lookups
        accounts.revoke_token(led, token_id, actor="test")
        assert auth.principal(token) is None  # a cached token is checked on every use: revoked at once
        for text in ("", "x", "Bearer", "glt_nothex_zzz", "glt_0123456789ab"):  # not a token: no lookup
            assert auth.principal(text) is None
        assert auth.lookups == lookups


def test_no_token_no_body_read(pg) -> None:  # type: ignore[no-untyped-def]
    url, t = pg
    pulled: list[int] = []

    def body() -> Iterator[bytes]:
        for i in range(64):
            pulled.append(i)
            yield b"x" * 65536

    with _client(url) as client:
        for path, method in (
            ("/api/v1/ingest", "POST"),
            ("/api/v1/runs/00000000-0000-0000-0000-000000000000/log", "PUT"),
        ):
            for headers in ({}, bearer("glt_0123456789ab_" + "z" * 43), {"Authorization": "Basic eDp5"}):
                got = client.request(method, path, content=body(), headers=headers)
                assert got.status_code == 401 and got.headers["www-authenticate"] == "Bearer"
                assert pulled == [], (path, headers)  # refused before a single chunk was read
        member = client.request("POST", "/api/v1/ingest", content=body(), headers=bearer(t.member_a))
        assert member.status_code == 403 and pulled == []  # a member's token cannot write: nothing is read


def test_database_down_is_503_even_while_checking_the_token(pg, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The token is looked up in the guard, before any route: a database that cannot be reached
    there is the documented 503 (agents retry, a load balancer tries another replica), not a 500
    with a traceback in the server's log."""
    url, t = pg
    with _client(url) as client:
        assert client.get("/api/v1/me", headers=bearer(t.agent_a)).status_code == 200  # now cached
        ledger = client.app.state.auth._ledger  # type: ignore[attr-defined]

        def down(fn: object) -> object:
            raise LedgerUnavailable("cannot reach the ledger database (test)")

        monkeypatch.setattr(ledger, "read", down)
        for method, path, token in (
            ("GET", "/api/v1/runs", t.member_a),  # never looked up
            ("GET", "/metrics", t.admin),
            ("POST", "/api/v1/ingest", t.agent_a),  # cached: still checked against the database
        ):
            got = client.request(method, path, headers=bearer(token), content=b"{}" if method == "POST" else None)
            assert got.status_code == 503, (path, got.status_code, got.text)
            assert got.json() == {"detail": "the ledger database is unavailable; retry later"}
        monkeypatch.undo()
        assert client.get("/api/v1/runs", headers=bearer(t.member_a)).status_code == 200


# -- against a real server ----------------------------------------------------------------------


def _raw(port: int, data: bytes, wait_s: float = 60.0) -> bytes:
    """Send ``data`` and read until the server closes the connection (or ``wait_s`` passes)."""
    with socket.create_connection(("127.0.0.1", port), timeout=wait_s) as s:
        s.sendall(data)
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except (TimeoutError, ConnectionResetError):
            pass
        return out


@pytest.mark.slow
def test_slow_headers_and_slow_bodies_are_cut_off(tmp_path: Path, pg) -> None:  # type: ignore[no-untyped-def]
    url, t = pg
    env = {"GPULEDGER_HEADER_TIMEOUT_S": "1", "GPULEDGER_BODY_IDLE_S": "1"}
    with ServerProcess(url, log=tmp_path / "server.log", env=env) as server:
        trickled = _raw(server.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # the blank line never comes
        assert trickled.startswith(b"HTTP/1.1 408"), trickled
        assert _raw(server.port, b"").startswith(b"HTTP/1.1 408")  # connected, sent nothing
        head = (
            f"POST /api/v1/ingest HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {t.agent_a}\r\n"
            "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
        )
        stalled = _raw(server.port, head.encode() + b'{"run": ')  # 8 of 1000 bytes, then nothing
        assert stalled.startswith(b"HTTP/1.1 408") and b"not received in time" in stalled, stalled
        assert httpx.get(server.url + "/healthz").status_code == 200  # and it still serves everyone else


@pytest.mark.slow
def test_unauthenticated_uploads_cost_no_memory(tmp_path: Path, pg, capsys) -> None:  # type: ignore[no-untyped-def]
    """The audit's case: 4 parallel unauthenticated PUTs of ~94 MB took a server from 106 to 471 MB RSS."""
    url, _ = pg
    size = 94 * 1024 * 1024
    chunk = b"x" * (1024 * 1024)
    run = "00000000-0000-4000-8000-000000000000"

    def upload() -> int | str:
        def body() -> Iterator[bytes]:
            for _ in range(size // len(chunk)):
                yield chunk

        headers = {"Content-Length": str(size), "Content-Type": "application/octet-stream"}
        try:
            with httpx.Client(timeout=60) as http:
                return http.put(f"{server.url}/api/v1/runs/{run}/log", content=body(), headers=headers).status_code
        except httpx.TransportError as exc:  # the server answered 401 and closed while we were still sending
            return type(exc).__name__

    with ServerProcess(url, log=tmp_path / "server.log") as server:
        assert server.proc is not None
        proc = psutil.Process(server.proc.pid)
        before = proc.memory_info().rss
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda _: upload(), range(4)))
        deadline = time.monotonic() + 60  # the server is done with the four connections (polled)
        while any(c.laddr and c.laddr.port == server.port and c.status != psutil.CONN_LISTEN
                  for c in proc.net_connections(kind="tcp")):  # fmt: skip
            assert time.monotonic() < deadline, "the server kept the uploads' connections open"
            time.sleep(0.05)
        after = proc.memory_info().rss
    with capsys.disabled():
        print(f"\n[unauthenticated 4 x 94 MB PUT] server RSS {before / 2**20:.0f} -> {after / 2**20:.0f} MB: {answers}")
    assert all(a in (401, "WriteError", "RemoteProtocolError", "ReadError") for a in answers), answers
    assert after - before < 64 * 2**20  # reading even one body would cost 94 MB


def test_logs_are_streamed_redacted_capped_and_audited(pg) -> None:  # type: ignore[no-untyped-def]
    url, t = pg
    run = run_doc(status="succeeded", ended_at=time.time() - 60, exit_code=0)
    pulled: list[int] = []

    def chunks(data: bytes, size: int = 7) -> Iterator[bytes]:
        for i in range(0, len(data), size):  # secrets split across chunks
            pulled.append(i)
            yield data[i : i + size]

    def leftovers() -> set[str]:
        return {p.name for p in Path(tempfile.gettempdir()).glob("gpuledger-log-*.part")}

    before = leftovers()
    with _client(url, max_log_b=1024 * 1024) as client:
        assert (
            client.post("/api/v1/ingest", json=batch(run, n=2, final=True), headers=bearer(t.agent_a)).status_code
            == 200
        )
        path = f"/api/v1/runs/{run['id']}/log"
        log = f"epoch 1\nexport DB_PASSWORD=hunter2\nlogin with {t.admin} done\n".encode()
        put = client.put(path, content=chunks(log), headers=bearer(t.agent_a))
        assert put.status_code == 200, put.text
        stored = client.get(path, headers=bearer(t.member_a)).content
        assert b"hunter2" not in stored and t.admin[17:].encode() not in stored
        assert stored.startswith(b"epoch 1\nexport DB_PASSWORD=[REDACTED:")
        assert put.json()["sha256"] == hashlib.sha256(stored).hexdigest() and put.json()["size_b"] == len(log)
        with Ledger(url) as led:
            last = led.read(
                lambda c: c.execute(sa.text("SELECT actor FROM audit_log ORDER BY seq DESC LIMIT 1")).scalar()
            )
        assert t.agent_a[4:16] in last  # who stored the log: user and token id

        big = b"x" * (2 * 1024 * 1024)
        over = client.put(path, content=chunks(big, 65536), headers=bearer(t.agent_a))  # no Content-Length
        assert over.status_code == 413 and "limit" in over.json()["detail"]
        declared = client.put(path, content=big, headers=bearer(t.agent_a))
        assert declared.status_code == 413
        assert client.get(path, headers=bearer(t.member_a)).content == stored  # the stored log is untouched
        pulled.clear()
        nobody = client.put("/api/v1/runs/00000000-0000-4000-8000-000000000000/log", content=chunks(log),
                            headers=bearer(t.agent_a))  # fmt: skip
        assert nobody.status_code == 404 and pulled == []  # an unknown run: not a byte read
        theirs = client.put(path, content=chunks(log), headers=bearer(t.agent_b))
        assert theirs.status_code == 404 and pulled == []
    assert leftovers() == before  # no temporary file left behind, whatever the outcome
