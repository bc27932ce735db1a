"""The month's bill holds (issue 33), each attack against a real ``gpuledger serve`` (a child process)
on PostgreSQL and on SQLite with a signed trail: an agent rewriting a sealed ``lost`` run, forging the
liveness sweep's verdict, creating a run of a closed month or adding rows to one, and inflating a
run's hours with overlapping copies or with a GPU it does not hold. Each is refused or named, and a
lost run reported late within the slack still verifies clean."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from audit_support import audit_key, audit_rows, keyring, payload_of
from gpuledger.core.audit.signing import SigningKey
from gpuledger.store import Ledger, audit, audit_approve, closed_months, liveness_sweep
from server_support import (
    BACKENDS,
    ServerProcess,
    Tokens,
    backend_url,
    bearer,
    devices_doc,
    gpu_rows,
    run_doc,
    setup_accounts,
)

pytestmark = pytest.mark.slow
HOUR = 3600.0
STEP = 300.0  # one interval every five minutes: twelve an hour


@dataclass
class Served:
    url: str
    server: ServerProcess
    tokens: Tokens
    key: SigningKey

    def post(self, body: dict[str, Any], token: str | None = None) -> httpx.Response:
        headers = bearer(token or self.tokens.agent_a)
        return httpx.post(self.server.url + "/api/v1/ingest", json=body, headers=headers, timeout=60)

    def get(self, path: str) -> httpx.Response:
        return httpx.get(self.server.url + "/api/v1" + path, headers=bearer(self.tokens.admin), timeout=60)

    def verify(self, **options: Any) -> audit.Verification:
        with Ledger(self.url) as led:
            return audit.verify(led, keyring=keyring(self.key), **options)

    def column(self, run_id: str, name: str) -> Any:
        with Ledger(self.url) as led:
            q = sa.text(f"SELECT {name} FROM runs WHERE id = :id")  # a fixed column name, never input
            return led.read(lambda c: c.execute(q, {"id": run_id}).scalar())

    def busy_s(self, run_id: str) -> float:
        with Ledger(self.url) as led:
            q = sa.text("SELECT coalesce(sum(t1 - t0), 0) FROM gpu_intervals WHERE run_id = :id")
            return float(led.read(lambda c: c.execute(q, {"id": run_id}).scalar()))


@contextlib.contextmanager
def _serving(kind: str, tmp: Path, **env: str) -> Iterator[Served]:
    with backend_url(kind, tmp) as url, audit_key() as key:
        tokens = setup_accounts(url)
        with ServerProcess(url, log=tmp / "server.log", env=env) as server:
            yield Served(url, server, tokens, key)


KINDS = BACKENDS


@pytest.fixture(scope="module", params=KINDS)
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with _serving(request.param, tmp_path_factory.mktemp("bill")) as s:
        yield s


def _rows(start: float, n: int, first_seq: int = 0, uuid: str = "GPU-0", step: float = STEP) -> list[dict[str, Any]]:
    rows = gpu_rows(n, start=start - first_seq * step, step=step, first_seq=first_seq)
    return [r | {"device_uuid": uuid} for r in rows]


def _body(run: dict[str, Any], gpu: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"run": run, "devices": devices_doc(1, run["host"]), "gpu_intervals": gpu, **extra}


def _lost_run(s: Served) -> tuple[dict[str, Any], float]:
    """A run its own agent pushed as lost (its recorder died after an hour), sealed; and its last
    interval's end."""
    start = time.time() - 2 * 86400
    run = run_doc(started_at=start, status="lost", ended_at=start + HOUR, status_reason="recorder died")
    got = s.post(_body(run, _rows(start, 12), final=True))
    assert got.status_code == 200 and got.json()["sealed"], got.text
    return run, start + HOUR


def _snapshot(s: Served, run_id: str) -> tuple[Any, ...]:
    shown = s.get(f"/runs/{run_id}").json()
    shown.pop("wall_seconds", None)
    return shown, s.get(f"/runs/{run_id}/intervals").json()


def _refused(s: Served, run_id: str) -> list[str]:
    rows = [r for r in audit_rows(s.url) if r["action"] == "push.refused" and r["object"] == f"run:{run_id}"]
    return [str(payload_of(r).get("reason")) for r in rows]


def test_a_sealed_lost_run_cannot_be_rebilled(served: Served) -> None:
    run, last = _lost_run(served)
    before, busy = _snapshot(served, run["id"]), served.busy_s(run["id"])
    # Two days later, as another team, with a 46-hour busy interval: the attack of issue 33.
    end = time.time() - 600
    six_days = _rows(last, 1, first_seq=12, step=end - last)
    moved = run | {"status": "succeeded", "exit_code": 0, "ended_at": end}
    got = served.post(_body(moved | {"labels": {"team": "billing", "project": "A"}}, six_days, final=True))
    assert got.status_code == 409 and "may report only how it ended" in got.text and "labels" in got.text, got.text
    got = served.post(_body(moved, six_days, final=True))
    assert got.status_code == 409 and "its end may lie between its last interval" in got.text, got.text
    late = served.post(_body(run, six_days, final=True))  # still lost: the long interval alone
    assert late.status_code == 200 and late.json()["gpu_intervals"] == 0, late.text
    assert "after the run ended" in late.json()["quarantined"][0]["reason"]
    assert _snapshot(served, run["id"]) == before and served.busy_s(run["id"]) == busy
    assert _refused(served, run["id"])  # audited (refusals of a token are folded per minute)
    assert served.verify().ok


def test_a_lost_run_reported_late_within_the_slack_verifies_clean(served: Served) -> None:
    run, last = _lost_run(served)
    tail = _rows(last, 2, first_seq=12)  # what the agent still had: ten minutes more
    ended = run | {"status": "failed", "exit_code": 1, "ended_at": last + 2 * STEP + 60, "status_reason": None}
    got = served.post(_body(ended, tail, final=True))
    assert got.status_code == 200 and got.json()["gpu_intervals"] == 2 and got.json()["sealed"], got.text
    shown = served.get(f"/runs/{run['id']}").json()
    assert shown["status"] == "failed" and shown["exit_code"] == 1
    changed = [r for r in audit_rows(served.url) if r["action"] == "run.changed" and r["object"] == f"run:{run['id']}"]
    assert payload_of(changed[-1])["old"]["status"] == "lost" and payload_of(changed[-1])["new"]["status"] == "failed"
    result = served.verify()
    assert result.ok, result.problems


def test_the_sweeps_verdict_cannot_be_forged(served: Served) -> None:
    start = time.time() - 2 * HOUR
    run = run_doc(started_at=start)
    assert served.post(_body(run, _rows(start, 6))).status_code == 200
    reason = f"{liveness_sweep.REASON_PREFIX} 3600 s (no push, no interval); its agent may still report how it ended"
    forged = run | {"status": "lost", "ended_at": start + 6 * STEP, "status_reason": reason}
    assert served.post(_body(forged, [])).status_code == 200
    assert served.column(run["id"], "swept_at") is None  # the text is only text
    assert served.post(_body(forged | {"swept_at": time.time()}, [])).status_code == 422  # no push sets it
    assert served.post(_body(run, [])).status_code == 200  # "running" again: no revival for an agent's own lost
    assert served.get(f"/runs/{run['id']}").json()["status"] == "lost"
    assert f"run {run['id']}: lost but never sealed (see `gpuledger audit seal`)" in served.verify().problems
    with Ledger(served.url) as led:  # what an admin does with it: look, then seal it as it stands
        audit_approve.approve(led, runs=[run["id"]], actor="root")
    assert served.verify().ok


def test_the_sweep_sets_its_verdict_and_the_owner_may_still_end_the_run(served: Served) -> None:
    start = time.time() - 2 * HOUR
    run = run_doc(started_at=start)
    assert served.post(_body(run, _rows(start, 6))).status_code == 200
    with Ledger(served.url) as led:
        later = time.time() + 2 * HOUR
        assert run["id"] in liveness_sweep.sweep(led.database, lost_after_s=HOUR, now=later)
    assert served.column(run["id"], "swept_at") is not None
    result = served.verify()
    assert result.ok and result.unsealed_running >= 1, result.problems  # the server's verdict: still its agent's
    ended = run | {"status": "succeeded", "exit_code": 0, "ended_at": start + 6 * STEP + 30}
    got = served.post(_body(ended, [], final=True))
    assert got.status_code == 200 and got.json()["sealed"], got.text
    assert served.column(run["id"], "swept_at") is None  # the owner's word replaced the sweep's
    assert served.verify().ok


def test_overlapping_copies_and_another_gpus_rows_are_quarantined(served: Served) -> None:
    start = time.time() - 3 * HOUR
    run = run_doc(started_at=start, status="succeeded", ended_at=start + HOUR, exit_code=0)
    copies = [r | {"seq": i} for i, r in enumerate(_rows(start, 1, step=HOUR) * 20)]  # one hour, twenty seqs
    foreign = _rows(start, 1, first_seq=50, uuid="GPU-1")  # a GPU of the host, not of this run
    host_copies = [{"seq": i, "t0": start, "t1": start + HOUR, "samples": 5, "cpu_s": 60.0} for i in range(3)]
    got = served.post(_body(run, copies + foreign, host_intervals=host_copies, final=True))
    assert got.status_code == 200, got.text
    answer = got.json()
    assert answer["gpu_intervals"] == 1 and answer["host_intervals"] == 1, answer
    reasons = [q["reason"] for q in answer["quarantined"]]
    assert sum("overlaps seq 0 of the same series" in r for r in reasons) == 19 + 2
    assert sum("GPU GPU-1 is not among the run's devices" in r for r in reasons) == 1
    assert served.busy_s(run["id"]) == pytest.approx(HOUR)  # held once, not twenty times
    later = _rows(start + 0.5 * HOUR, 1, first_seq=7, step=600)  # a later seq inside the hour: an overlap too
    got = served.post(_body(run, later))
    assert got.status_code == 200 and got.json()["gpu_intervals"] == 0
    assert "overlaps seq 0" in got.json()["quarantined"][0]["reason"]
    assert served.verify().ok


@pytest.mark.parametrize("kind", KINDS)
def test_a_closed_month_cannot_change(kind: str, tmp_path: Path) -> None:
    now = time.time()
    closed = closed_months.boundary(now, 0)  # with no grace, every month before this one is closed
    old_start = closed - 86400  # the last day of the month before
    old = run_doc(started_at=old_start)
    with _serving(kind, tmp_path, GPULEDGER_CLOSE_AFTER_DAYS="62") as lenient:  # no month closed yet
        assert lenient.post(_body(old, _rows(old_start, 2))).status_code == 200
        with ServerProcess(lenient.url, env={"GPULEDGER_CLOSE_AFTER_DAYS": "0"}) as strict:
            s = Served(lenient.url, strict, lenient.tokens, lenient.key)
            sixty_days = run_doc(started_at=now - 60 * 86400, status="succeeded", ended_at=now - 59 * 86400)
            got = s.post(_body(sixty_days, _rows(now - 60 * 86400, 12), final=True))
            assert got.status_code == 409 and "a run of a closed month cannot be created" in got.text, got.text
            assert s.get(f"/runs/{sixty_days['id']}").status_code == 404
            assert _refused(s, sixty_days["id"]) and "closed month" in _refused(s, sixty_days["id"])[0]
            got = s.post(_body(old, _rows(old_start, 2, first_seq=2)))  # rows of the closed month: quarantined
            assert got.status_code == 200 and got.json()["gpu_intervals"] == 0, got.text
            assert all("in a closed month" in q["reason"] for q in got.json()["quarantined"])
        # The run created after its month closed (by the lenient server) is named by verify.
        late = s.verify(close_after_days=0).problems
        assert any(p.startswith(f"run {old['id']}: started ") and "after its month closed" in p for p in late), late
        assert not any(old["id"] in p for p in s.verify(close_after_days=62).problems)
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPULEDGER_AUDIT")}
        cli = [sys.executable, "-m", "gpuledger", "audit", "verify", "--db", s.url, "--public-key", s.key.public.text]
        named = subprocess.run([*cli, "--close-after-days", "0"], capture_output=True, text=True, timeout=120, env=env)
        assert named.returncode == 1 and f"TAMPERED  run {old['id']}: started " in named.stdout, named.stdout
        fine = subprocess.run([*cli, "--close-after-days", "62"], capture_output=True, text=True, timeout=120, env=env)
        assert fine.returncode == 0, fine.stdout + fine.stderr
