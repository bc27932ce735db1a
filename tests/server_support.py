"""Helpers for the team-server tests: fresh PostgreSQL ledgers, tokens, batches, real server
processes (``gpuledger serve`` on 127.0.0.1, a free port each)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from conftest import _pg_schema_url
from gpuledger.store import Ledger, accounts

NOW = time.time()


@contextlib.contextmanager
def fresh_pg_url() -> Iterator[str]:
    """A new, empty PostgreSQL schema (dropped afterwards), like the ``ledger_url`` fixture."""
    gen = _pg_schema_url()
    url = next(gen)
    try:
        yield url
    finally:
        with contextlib.suppress(StopIteration):
            next(gen)


# The two ledgers a server test runs on; PostgreSQL's tests carry the postgres marker.
BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@contextlib.contextmanager
def backend_url(backend: str, folder: Path) -> Iterator[str]:
    """A fresh, empty ledger of ``backend``: a SQLite file in ``folder``, or a PostgreSQL schema
    dropped afterwards (the test is skipped when GPULEDGER_TEST_PG=0)."""
    if backend == "sqlite":
        yield f"sqlite:///{folder}/team.db"
        return
    if os.environ.get("GPULEDGER_TEST_PG") == "0":
        pytest.skip("PostgreSQL tests disabled by GPULEDGER_TEST_PG=0")
    with fresh_pg_url() as url:
        yield url


@dataclass
class Tokens:
    admin: str
    agent_a: str
    agent_b: str
    member_a: str
    member_b: str
    member_ab: str


def setup_accounts(url: str) -> Tokens:
    """Projects A and B; an admin, an agent and a member per project, a member of both."""
    with Ledger(url) as led:  # migrates a fresh test database
        for p in ("A", "B"):
            accounts.add_project(led, p, actor="test")
        for user, projects in (("alice", ["A"]), ("bob", ["B"]), ("carol", ["A", "B"])):
            accounts.add_user(led, user, actor="test")
            for p in projects:
                accounts.add_member(led, user, p, actor="test")

        def issue(user: str, role: str, projects: list[str] | None = None) -> str:
            return accounts.issue_token(led, user, role=role, projects=projects, actor="test", create_user=True)[1]

        return Tokens(
            admin=issue("root", "admin"),
            agent_a=issue("agent-a", "agent", ["A"]),
            agent_b=issue("agent-b", "agent", ["B"]),
            member_a=issue("alice", "member"),
            member_b=issue("bob", "member"),
            member_ab=issue("carol", "member"),
        )


def enroll(url: str, host: str, projects: list[str] | None = None, user: str | None = None) -> str:
    """The token of an enrolled node: an agent bound to ``host`` (user ``host`` unless given), the
    only kind that registers that host's GPUs and pushes its capacity (docs/SERVER.md)."""
    with Ledger(url) as led:
        return accounts.issue_token(led, user or host, role="agent", projects=projects or ["A"], actor="test",
                                    create_user=True, host=host)[1]  # fmt: skip


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


HOST_A = "gpu-node-1"


def host_of(project: str | None) -> str:
    """Each project's runs on a machine of their own (a GPU belongs to one host and agent)."""
    return HOST_A if project == "A" else f"gpu-node-{project or 'none'}"


def gpu_uuid(d: int, host: str = HOST_A) -> str:
    """GPU ``d`` of ``host``: GPU-0, GPU-1 ... on HOST_A, prefixed by a hash of the host elsewhere."""
    return f"GPU-{d}" if host == HOST_A else f"GPU-{hashlib.sha1(host.encode()).hexdigest()[:8]}-{d}"


def run_doc(run_id: str | None = None, project: str | None = "A", **fields: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "id": run_id or str(uuid.uuid4()),
        "command": ["python", "train.py"],
        "user": "tester",
        "host": host_of(project),
        "cwd": "/work",
        "started_at": NOW - 3600,
        "labels": {"team": "vision"} | ({"project": project} if project is not None else {}),
    }
    doc.update(fields)
    return doc


def gpu_rows(
    n: int, devices: int = 1, start: float = NOW - 3600, step: float = 5.0, first_seq: int = 0, host: str = HOST_A
) -> list[dict[str, Any]]:
    rows = []
    for d in range(devices):
        for i in range(first_seq, first_seq + n):
            t0 = start + i * step
            rows.append(
                {
                    "device_uuid": gpu_uuid(d, host),
                    "seq": i,
                    "t0": t0,
                    "t1": t0 + step,
                    "samples": 5,
                    "busy_s": 0.5 * step + 0.01 * (i % 7),
                    "util_method": "samples",
                    "util_max_pct": 90.0,
                    "energy_j": 250.0 * step + i % 3,
                    "energy_method": "counter",
                    "power_max_w": 300.0,
                    "mem_used_max_b": 10**10 + i,
                    "mem_used_last_b": 10**10,
                    "temp_max_c": 60.0 + i % 10,
                    "sm_clock_avg_mhz": 1400.0,
                    "throttle_s": {"power": 0.25},
                }
            )
    return rows


def host_rows(n: int, start: float = NOW - 3600, step: float = 5.0, first_seq: int = 0) -> list[dict[str, Any]]:
    return [
        {"seq": i, "t0": start + i * step, "t1": start + (i + 1) * step, "samples": 5, "cpu_s": 2.5 + i % 4,
         "rss_max_b": 10**9 + i, "read_b": 1000 * i, "write_b": 10 * i, "threads_max": 8, "procs_max": 3}
        for i in range(first_seq, first_seq + n)
    ]  # fmt: skip


def devices_doc(devices: int = 1, host: str = HOST_A) -> list[dict[str, Any]]:
    return [
        {"index": d, "uuid": gpu_uuid(d, host), "name": "NVIDIA A100-SXM4-80GB", "memory_total_b": 80 * 2**30}
        for d in range(devices)
    ]


def batch(run: dict[str, Any], n: int = 10, devices: int = 1, **extra: Any) -> dict[str, Any]:
    doc = {
        "run": run,
        "devices": devices_doc(devices, run["host"]),
        "gpu_intervals": gpu_rows(n, devices, host=run["host"]),
        "host_intervals": host_rows(n),
        "events": [{"seq": 0, "t": NOW - 3000, "kind": "alert", "message": "GPU idle", "payload": {"gpu": 0}}],
        "metrics": [{"seq": 0, "t": NOW - 3000, "key": "loss", "value": 0.5, "epoch": 1}],
    }
    doc.update(extra)
    return doc


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """``gpuledger serve`` in a child process on 127.0.0.1."""

    def __init__(
        self,
        db_url: str,
        port: int | None = None,
        *,
        log: Path | None = None,
        workers: int = 1,
        env: dict[str, str] | None = None,
    ) -> None:
        self.db_url = db_url
        self.env = env or {}
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.workers = workers
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 30.0) -> ServerProcess:
        out = open(self.log, "ab") if self.log else subprocess.DEVNULL  # noqa: SIM115
        env = {**os.environ, "GPULEDGER_TOKEN_CACHE_S": "0", **self.env}  # a test may set a cache
        if not env.get("GPULEDGER_AUDIT_CHECKPOINT"):  # not the user's data dir: one per server object
            path = os.path.join(tempfile.mkdtemp(prefix="gl-checkpoint-"), "audit-checkpoint.json")
            self.env = {**self.env, "GPULEDGER_AUDIT_CHECKPOINT": path}
            env["GPULEDGER_AUDIT_CHECKPOINT"] = path
        # running without an audit key is an explicit choice (docs/SERVER.md, "Deploying")
        unsigned = [] if env.get("GPULEDGER_AUDIT_KEY") or env.get("GPULEDGER_AUDIT_KEY_FILE") else ["--unsigned"]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpuledger", "serve", "--db", self.db_url, "--host", "127.0.0.1",
             "--port", str(self.port), "--workers", str(self.workers), "--log-level", "warning", *unsigned],
            stdout=out, stderr=out, env=env, start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gpuledger serve exited with {self.proc.returncode}")
            try:
                if httpx.get(self.url + "/healthz", timeout=1.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError("gpuledger serve did not answer within the timeout")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
