"""The agent's outbox against a real server app on PostgreSQL, through a transport that fails the
way networks do: refused connections, replies lost after the server committed, 5xx. Whatever
happens, the server ends with every local row exactly once."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient

from gpuledger.agent.client import Client, Rejected, Unreachable
from gpuledger.agent.outbox import drain_run
from gpuledger.agent.pusher import BACKOFF_MAX_S, Pusher, backoff_s
from gpuledger.agent.sync import sync
from gpuledger.cli.main import cli
from gpuledger.core.model import Event, GpuIdentity, GpuInterval, HostInterval, Metric, RunRecord
from gpuledger.server.app import create_app
from gpuledger.store import Ledger, audit, pushes, quarantine
from server_support import NOW, fresh_pg_url, setup_accounts

SERVER = "http://testserver"


class Flaky(httpx.BaseTransport):
    """Wraps the app's transport; ``plan`` says per request: "ok", "refuse" (never reaches the
    server), "lose" (the server handles it, the reply is lost), "503"."""

    def __init__(self, inner: httpx.BaseTransport, plan: list[str] | None = None) -> None:
        self.inner = inner
        self.plan = list(plan or [])
        self.calls = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.calls += 1
        what = self.plan.pop(0) if self.plan else "ok"
        if what == "refuse":
            raise httpx.ConnectError("connection refused", request=request)
        if what == "503":
            return httpx.Response(503, json={"detail": "busy"}, request=request)
        response = self.inner.handle_request(request)
        if what == "lose":
            response.read()
            raise httpx.ReadTimeout("reply lost", request=request)
        return response


@pytest.fixture
def server() -> Iterator[tuple[TestClient, str, str]]:
    with fresh_pg_url() as url:
        tokens = setup_accounts(url)
        with TestClient(create_app(url)) as app_client:
            yield app_client, url, tokens.agent_a


def _local_run(led: Ledger, n: int, *, ended: bool = True, project: str = "A") -> str:
    run_id = str(uuid.uuid4())
    start = NOW - 86400
    led.create_run(RunRecord(run_id, ["python", "t.py"], "u", "h", "/", start, labels={"project": project}))
    led.add_devices(run_id, [GpuIdentity(0, "GPU-0", "NVIDIA A100-SXM4-80GB")])
    append_rows(led, run_id, 0, n)
    if ended:
        led.set_log(run_id, b"all done\n")
        led.update_run(run_id, status="succeeded", ended_at=start + n * 5 + 1, exit_code=0)
    return run_id


def append_rows(led: Ledger, run_id: str, first: int, n: int) -> None:
    start = NOW - 86400
    gpu = [
        GpuInterval("GPU-0", i, start + 5 * i, start + 5 * i + 5, 5, busy_s=2.0 + i % 3, energy_j=900.0)
        for i in range(first, first + n)
    ]
    host = [HostInterval(i, start + 5 * i, start + 5 * i + 5, 5, cpu_s=1.0) for i in range(first, first + n)]
    events = [Event(start + 5 * first + 1, "note", f"batch at {first}")]
    metrics = [Metric(start + 5 * first + 2, "loss", float("nan") if first % 2 else 0.5, epoch=first)]
    led.append(run_id, gpu, host, events, metrics)


def _counts(url: str, run_id: str) -> tuple[int, int, int, int]:
    with Ledger(url) as led:
        return (
            len(led.gpu_intervals(run_id)),
            len(led.host_intervals(run_id)),
            len(led.events(run_id)),
            len(led.metrics(run_id)),
        )


def test_sync_pushes_everything_exactly_once_through_a_bad_network(tmp_path: Path, server) -> None:  # type: ignore[no-untyped-def]
    app_client, url, token = server
    local = Ledger(tmp_path / "local.db")
    run_id = _local_run(local, 2000)
    pushes.register(local, SERVER, [run_id])
    flaky = Flaky(app_client._transport, ["refuse", "ok", "lose", "503", "lose", "ok", "refuse", "lose"])
    client = Client(SERVER, token, transport=flaky)
    for _ in range(30):  # what a pusher does: retry until done
        state = pushes.get(local, SERVER, run_id)
        assert state is not None
        if state.done:
            break
        try:
            drain_run(local, client, state, budget=300)
        except Unreachable:
            continue
    assert pushes.get(local, SERVER, run_id).done  # type: ignore[union-attr]
    assert _counts(url, run_id) == (2000, 2000, 1, 1)
    with Ledger(url) as remote:
        assert remote.get_run(run_id).status == "succeeded" and remote.get_log(run_id) == b"all done\n"
        assert [m.value for m in remote.metrics(run_id)] == [0.5]
        assert audit.verify(remote).ok
        assert audit.verify(remote).runs_checked == 1  # sealed by the final batch
    assert flaky.calls > 8


def test_a_refused_run_is_recorded_and_the_others_still_go(tmp_path: Path, server) -> None:  # type: ignore[no-untyped-def]
    app_client, url, token = server
    local = Ledger(tmp_path / "local.db")
    good = _local_run(local, 10)
    bad = _local_run(local, 10, project="B")  # the agent's token writes project A only
    client = Client(SERVER, token, transport=app_client._transport)
    report = sync(local, client, all_runs=True)
    assert report.registered == 2 and report.done == [good] and list(report.forbidden) == [bad]
    assert _counts(url, good)[0] == 10
    missing = [s.run_id for s in pushes.pending(local, SERVER)]
    assert missing == [bad]  # 403 is "not authorised": kept and retried, not dropped


def test_a_422_marks_the_run_refused_until_retried(tmp_path: Path, server) -> None:  # type: ignore[no-untyped-def]
    app_client, _, token = server
    local = Ledger(tmp_path / "local.db")
    run_id = _local_run(local, 3)
    local.update_run(run_id, started_at=NOW + 30 * 86400, ended_at=NOW + 30 * 86400 + 10)  # a broken clock
    client = Client(SERVER, token, transport=app_client._transport)
    pushes.register(local, SERVER, [run_id])
    with pytest.raises(Rejected):
        drain_run(local, client, pushes.get(local, SERVER, run_id))  # type: ignore[arg-type]
    assert pushes.pending(local, SERVER) == []
    assert [s.run_id for s in pushes.pending(local, SERVER, include_rejected=True)] == [run_id]
    report = sync(local, client, retry_rejected=True)
    assert list(report.rejected) == [run_id]


def test_one_bad_interval_no_longer_keeps_a_run_out_of_the_server(tmp_path: Path, server) -> None:  # type: ignore[no-untyped-def]
    """The audit's case: one bad row used to refuse every batch of the run, and --retry was refused
    again forever. Now the server keeps the rest, the agent records what was refused and moves on."""
    app_client, url, token = server
    local = Ledger(tmp_path / "local.db")
    run_id = _local_run(local, 10)
    start = NOW - 86400
    clock_jump = GpuInterval("GPU-0", 10, start + 60, start + 50, 5, busy_s=1.0)  # t1 before t0
    local.append(run_id, [clock_jump])
    pushes.register(local, SERVER, [run_id])
    state = pushes.get(local, SERVER, run_id)
    assert state is not None
    state.last_error = pushes.REJECTED + "422 from a server without partial acceptance"
    pushes.save(local, state)
    client = Client(SERVER, token, transport=app_client._transport)
    assert sync(local, client).done == []  # refused runs wait for --retry, as before
    report = sync(local, client, retry_rejected=True)
    assert report.done == [run_id] and report.rejected == {} and report.quarantined == {run_id: 1}
    assert _counts(url, run_id) == (10, 10, 1, 1)
    with Ledger(url) as remote:
        assert remote.get_run(run_id).status == "succeeded" and remote.get_log(run_id) == b"all done\n"
    assert pushes.pending(local, SERVER, include_rejected=True) == []
    [kept] = quarantine.for_server(local, SERVER)[run_id]
    assert kept["item"] == "GPU-0 seq 10" and "before t0" in kept["reason"]
    assert sync(local, client, retry_rejected=True).rows == 0  # nothing is sent twice
    status = CliRunner().invoke(cli, ["sync", "--server", SERVER, "--status", "--db", str(tmp_path / "local.db")])
    assert f"{run_id}  done" in status.output
    assert "quarantined by the server: gpu_rows GPU-0 seq 10: t1" in status.output, status.output


def test_a_429_is_retried_after_the_servers_retry_after(tmp_path: Path) -> None:
    def busy(request: httpx.Request) -> httpx.Response:
        return httpx.Response(429, headers={"Retry-After": "7"}, json={"detail": "slow down"}, request=request)

    client = Client(SERVER, "t", transport=httpx.MockTransport(busy))
    with pytest.raises(Unreachable) as err:
        client.ingest({"run": {}})
    assert err.value.retry_after_s == 7.0
    local = Ledger(tmp_path / "local.db")
    run_id = _local_run(local, 1)
    lines: list[str] = []
    pusher = Pusher(str(tmp_path / "local.db"), SERVER, "t", run_id, warn=lines.append, client=client)
    before = time.monotonic()
    pusher.push_once()
    assert pusher._next_try - before >= 7.0  # backoff alone would wait 0.5-1.5 s
    assert "HTTP 429" in lines[0]


def test_a_proxys_page_that_is_not_json_is_retried_not_taken_for_the_runs_own_error(tmp_path: Path) -> None:
    def proxy(request: httpx.Request) -> httpx.Response:  # a captive portal or a misrouted proxy: 200, HTML
        return httpx.Response(200, text="<html>please log in</html>", request=request)

    local = Ledger(tmp_path / "local.db")
    run_id = _local_run(local, 1)
    lines: list[str] = []
    client = Client(SERVER, "t", transport=httpx.MockTransport(proxy))
    pusher = Pusher(str(tmp_path / "local.db"), SERVER, "t", run_id, warn=lines.append, client=client)
    pusher.push_once()
    assert pusher._next_try < float("inf")  # tried again later, as for a server that is down
    assert "cannot push to" in lines[0] and "kept in the local ledger" in lines[0]


def test_pusher_thread_drains_while_recording_and_after_an_outage(tmp_path: Path, server) -> None:  # type: ignore[no-untyped-def]
    app_client, url, token = server
    db = tmp_path / "local.db"
    local = Ledger(db)
    run_id = _local_run(local, 5, ended=False)
    plan = ["refuse"] * 6 + ["lose"] + ["ok"] * 3 + ["503"] * 2
    flaky = Flaky(app_client._transport, plan)
    lines: list[str] = []
    client = Client(SERVER, token, transport=flaky)
    pusher = Pusher(str(db), SERVER, token, run_id, warn=lines.append, period_s=0.2, budget=50, client=client,
                    backoff_min_s=0.1)  # fmt: skip
    pusher.start()
    for k in range(1, 9):  # the recorder keeps flushing while the server flaps
        append_rows(local, run_id, 5 * k, 5)
        pusher.wake()
        time.sleep(0.3)
    local.set_log(run_id, b"end\n")
    local.update_run(run_id, status="failed", ended_at=NOW - 10, exit_code=1)
    pusher.wake()
    deadline = time.monotonic() + 60
    while not pusher.done and time.monotonic() < deadline:  # backoff may wait a few seconds
        pusher.wake()
        time.sleep(0.3)
    assert pusher.close(10) is True
    assert _counts(url, run_id) == (45, 45, 9, 9)
    assert any("cannot push" in ln for ln in lines) and any("again" in ln for ln in lines)


def test_backoff_doubles_with_jitter_and_is_capped() -> None:
    assert backoff_s(1, lambda: 0.5) == 1.0
    assert backoff_s(4, lambda: 0.5) == 8.0
    assert backoff_s(50, lambda: 0.999) <= BACKOFF_MAX_S * 1.5
    assert 0.5 <= backoff_s(1, lambda: 0.0) < backoff_s(1, lambda: 0.99)


def test_pusher_never_blocks_when_the_server_is_gone(tmp_path: Path) -> None:
    db = tmp_path / "local.db"
    local = Ledger(db)
    run_id = _local_run(local, 3)
    lines: list[str] = []
    pusher = Pusher(str(db), "http://127.0.0.1:9", None, run_id, warn=lines.append)  # nothing listens on port 9
    pusher.start()
    t = time.monotonic()
    assert pusher.close(5) is False
    assert time.monotonic() - t < 6 and pushes.pending(local, "http://127.0.0.1:9")[0].run_id == run_id
    assert threading.active_count() < 50
