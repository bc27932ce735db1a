"""The capacity ledger in the audit trail (store/capacity_audit.py), on SQLite and PostgreSQL: each
UTC day's per-GPU sums are sealed once the day after it is over, a late push reseals what it adds,
and ``audit verify`` names a sealed day's sums edited, inserted or deleted with SQL; a local ledger
seals nothing."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from fastapi.testclient import TestClient

from audit_support import audit_key, audit_rows, keyring, sql
from gpuledger.core.audit.signing import SigningKey
from gpuledger.core.capacity.model import DAY_MS, CapacityInterval, States
from gpuledger.server.app import create_app
from gpuledger.server.settings import Settings
from gpuledger.store import Ledger, audit
from gpuledger.store.capacity import write_capacity
from server_support import bearer, enroll, fresh_pg_url, setup_accounts

DAY0 = 20_500  # 2026-02-16 (UTC days since 1970)
HOUR_MS = 3_600_000


def _day_of(gpu: str, host: str, day: int, busy_h: int = 6) -> list[CapacityInterval]:
    """A whole UTC day of one GPU in four 6-hour intervals, ``busy_h`` hours of them busy."""
    out = []
    for q in range(4):
        t0 = day * DAY_MS + q * 6 * HOUR_MS
        busy = min(6, max(0, busy_h - q * 6)) * HOUR_MS
        out.append(CapacityInterval(gpu, host, t0, t0 + 6 * HOUR_MS, States(0, 6 * HOUR_MS - busy, busy, 0), 0, 1e6))
    return out


def _write(url: str, intervals: list[CapacityInterval], now_day: float) -> int:
    with Ledger(url) as led:
        return led.write(lambda c: write_capacity(led.database, c, intervals, now=now_day * 86_400))


def _capacity_rows(url: str) -> list[dict]:
    return [r for r in audit_rows(url) if r["object"] == "capacity"]


@dataclass
class Fleet:
    url: str
    key: SigningKey


@pytest.fixture
def fleet(ledger_url: str) -> Iterator[Fleet]:
    """Two GPUs, days DAY0 .. DAY0+3, written at noon of DAY0+3: DAY0 and DAY0+1 are sealed."""
    with audit_key() as key:
        setup_accounts(ledger_url)  # a team ledger: it keeps an audit trail
        ivs = [iv for d in range(DAY0, DAY0 + 4) for g in ("GPU-a", "GPU-b") for iv in _day_of(g, "node-1", d)]
        assert _write(ledger_url, ivs, DAY0 + 3.5) == len(ivs)
        yield Fleet(ledger_url, key)


def _verify(f: Fleet) -> audit.Verification:
    with Ledger(f.url) as led:
        return audit.verify(led, keyring=keyring(f.key))


def test_days_over_are_sealed_with_a_digest_per_gpu_and_the_ledger_verifies(fleet: Fleet) -> None:
    [seal] = _capacity_rows(fleet.url)
    payload = json.loads(seal["payload"])
    assert seal["action"] == "capacity.sealed" and seal["sig"]
    assert (payload["from"], payload["through"]) == (DAY0, DAY0 + 1)  # DAY0+2 is sealed once DAY0+3 is over
    assert {d: sorted(g) for d, g in payload["days"].items()} == {str(DAY0): ["GPU-a", "GPU-b"],
                                                                  str(DAY0 + 1): ["GPU-a", "GPU-b"]}  # fmt: skip
    result = _verify(fleet)
    assert result.ok, result.problems
    _write(fleet.url, [], DAY0 + 4.5)  # the next write, a day later, seals the next day
    assert json.loads(_capacity_rows(fleet.url)[-1]["payload"])["through"] == DAY0 + 2


SEALED_DAY = DAY0 + 1
TAMPERING = [
    (f"UPDATE gpu_capacity_days SET busy_attr_ms = busy_attr_ms + 3600000, alloc_idle_ms = alloc_idle_ms - 3600000 "
     f"WHERE gpu_uuid = 'GPU-a' AND day = {SEALED_DAY}",
     "gpu_capacity_days: GPU GPU-a on 2026-02-17 (host 'node-1'): edited (differs from its seal at audit seq",
     "an hour moved from idle to busy"),
    (f"UPDATE gpu_capacity_days SET energy_j = energy_j * 2 WHERE day = {DAY0}",
     "on 2026-02-16 (host 'node-1'): edited", "energy doubled"),
    (f"DELETE FROM gpu_capacity_days WHERE gpu_uuid = 'GPU-b' AND day = {SEALED_DAY}",
     "GPU GPU-b on 2026-02-17 (host 'node-1'): sealed at audit seq", "a GPU's day deleted"),
    ("INSERT INTO gpu_capacity_days (gpu_uuid, day, host, first_ms, last_ms, unallocated_ms, alloc_idle_ms, "
     f"busy_attr_ms, busy_unattr_ms, unmeasured_ms, energy_j, intervals) VALUES ('GPU-z', {SEALED_DAY}, 'node-1', "
     f"{SEALED_DAY * DAY_MS}, {(SEALED_DAY + 1) * DAY_MS}, 0, 0, {DAY_MS}, 0, 0, 0, 1)",
     "GPU GPU-z on 2026-02-17 (host 'node-1'): not in the capacity seal of that day (inserted outside gpuledger)",
     "a busy GPU-day inserted"),
    (f"UPDATE gpu_capacity_days SET host = 'node-2' WHERE gpu_uuid = 'GPU-a' AND day = {DAY0}",
     "GPU GPU-a on 2026-02-16 (host 'node-2'): not in the capacity seal", "a GPU-day moved to another host"),
]  # fmt: skip


@pytest.mark.parametrize(("statement", "named", "what"), TAMPERING, ids=[t[2] for t in TAMPERING])
def test_verify_names_a_sealed_days_sums_changed_with_sql(fleet: Fleet, statement: str, named: str, what: str) -> None:
    sql(fleet.url, statement)
    result = _verify(fleet)
    assert not result.ok
    assert any(named in p for p in result.problems), (what, result.problems)


def test_a_late_push_to_a_sealed_day_is_resealed_with_what_it_added(fleet: Fleet) -> None:
    late = _day_of("GPU-c", "node-2", SEALED_DAY, busy_h=24)  # an agent that was away pushes its day
    assert _write(fleet.url, late, DAY0 + 3.6) == 4
    reseal = _capacity_rows(fleet.url)[-1]
    assert reseal["action"] == "capacity.resealed"
    payload = json.loads(reseal["payload"])
    assert payload["why"] == "late push: 4 capacity intervals added"
    assert list(payload["days"]) == [str(SEALED_DAY)] and list(payload["days"][str(SEALED_DAY)]) == ["GPU-c"]
    result = _verify(fleet)
    assert result.ok, result.problems
    sql(fleet.url, f"UPDATE gpu_capacity_days SET busy_attr_ms = 0 WHERE gpu_uuid = 'GPU-c' AND day = {SEALED_DAY}")
    assert any("GPU GPU-c on 2026-02-17 (host 'node-2'): edited" in p for p in _verify(fleet).problems)


def test_a_day_not_over_yet_is_open_and_a_replayed_batch_reseals_nothing(fleet: Fleet) -> None:
    before = len(_capacity_rows(fleet.url))
    again = [iv for g in ("GPU-a", "GPU-b") for iv in _day_of(g, "node-1", SEALED_DAY)]
    assert _write(fleet.url, again, DAY0 + 3.6) == 0  # stored already: no day changed
    assert len(_capacity_rows(fleet.url)) == before
    # The current day is not sealed: its agent may still add to it (docs/AUDIT.md says so).
    sql(fleet.url, f"UPDATE gpu_capacity_days SET busy_attr_ms = 0 WHERE day = {DAY0 + 3}")
    result = _verify(fleet)
    assert result.ok, result.problems


def test_an_upgraded_ledger_is_sealed_a_week_per_write(ledger_url: str) -> None:
    with audit_key() as key:
        setup_accounts(ledger_url)
        ivs = [iv for d in range(DAY0, DAY0 + 20) for iv in _day_of("GPU-a", "node-1", d)]
        _write(ledger_url, ivs, DAY0 + 40)
        throughs = [json.loads(r["payload"])["through"] for r in _capacity_rows(ledger_url)]
        assert throughs == [DAY0 + 6]
        for _ in range(3):
            _write(ledger_url, [], DAY0 + 40)
        throughs = [json.loads(r["payload"])["through"] for r in _capacity_rows(ledger_url)]
        assert throughs == [DAY0 + 6, DAY0 + 13, DAY0 + 20, DAY0 + 27]  # empty days after the data are sealed too
        sql(ledger_url, f"UPDATE gpu_capacity_days SET intervals = 5 WHERE day = {DAY0 + 19}")
        with Ledger(ledger_url) as led:
            problems = audit.verify(led, keyring=keyring(key)).problems
        assert problems == [
            "gpu_capacity_days: GPU GPU-a on 2026-03-07 (host 'node-1'): edited (differs from its seal at audit seq "
            f"{len(audit_rows(ledger_url)) - 1})"
        ]


def test_a_local_ledger_seals_nothing(tmp_path) -> None:  # type: ignore[no-untyped-def]
    url = f"sqlite:///{tmp_path}/local.db"
    _write(url, _day_of("GPU-a", "node-1", DAY0), DAY0 + 10)
    assert audit_rows(url) == []


def test_capacity_pushed_to_the_server_is_sealed(ledger_url: str) -> None:
    with audit_key() as key:
        setup_accounts(ledger_url)
        node = enroll(ledger_url, "node-1")  # capacity comes from the node's own, host-bound token
        wire = [[iv.gpu_uuid, iv.host, iv.t0_ms, iv.t1_ms, *iv.states.as_tuple(), iv.unmeasured_ms, iv.energy_j]
                for iv in _day_of("GPU-a", "node-1", DAY0)]  # fmt: skip
        seen = {"uuid": "GPU-a", "name": "NVIDIA A100-SXM4-80GB", "host": "node-1", "first_seen": DAY0 * 86400.0,
                "last_seen": wire[-1][3] / 1000}  # fmt: skip
        # 2026-02 is a closed month on any later date: a window that keeps it open (store/closed_months.py)
        with TestClient(create_app(ledger_url, settings=Settings(close_after_days=36500))) as client:
            got = client.post("/api/v1/capacity", json={"intervals": wire, "gpus": [seen]}, headers=bearer(node))
            assert got.status_code == 200, got.text
        [seal] = _capacity_rows(ledger_url)  # 2026-02-16 is long over
        assert list(json.loads(seal["payload"])["days"]) == [str(DAY0)]
        sql(ledger_url, f"DELETE FROM gpu_capacity_days WHERE day = {DAY0}")
        with Ledger(ledger_url) as led:
            assert any("sealed at audit seq" in p for p in audit.verify(led, keyring=keyring(key)).problems)


def _through(url: str) -> int:
    return json.loads([r for r in _capacity_rows(url) if r["action"] == "capacity.sealed"][-1]["payload"])["through"]


@pytest.mark.postgres
def test_a_day_sealed_while_another_writer_adds_to_it_is_resealed_on_postgresql(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Writer A adds rows of a day it still sees as yesterday; writer B, whose clock is already past
    midnight, seals that day between A's insert and A's commit (it cannot see A's rows). A must find
    the new seal and reseal its rows, or verify would call them inserted outside gpuledger."""
    if os.environ.get("GPULEDGER_TEST_PG") == "0":
        pytest.skip("PostgreSQL tests disabled by GPULEDGER_TEST_PG=0")
    with fresh_pg_url() as url, audit_key() as key:
        setup_accounts(url)
        _write(url, _day_of("GPU-a", "node-1", DAY0), DAY0 + 2.5)
        assert _through(url) == DAY0
        real_lock = audit.lock
        sealed_meanwhile: list[int] = []

        def b_seals_first(conn):  # type: ignore[no-untyped-def]
            if threading.current_thread().name == "writer-a":
                b = threading.Thread(target=lambda: _write(url, [], DAY0 + 3.1), name="writer-b")
                b.start()
                b.join(timeout=60)
                sealed_meanwhile.append(_through(url))
            real_lock(conn)

        monkeypatch.setattr(audit, "lock", b_seals_first)
        a = threading.Thread(
            target=lambda: _write(url, _day_of("GPU-b", "node-2", DAY0 + 1), DAY0 + 2.9), name="writer-a"
        )
        a.start()
        a.join(timeout=120)
        assert sealed_meanwhile == [DAY0 + 1]  # B sealed the day while A's rows were not committed
        assert _capacity_rows(url)[-1]["action"] == "capacity.resealed"
        with Ledger(url) as led:
            result = audit.verify(led, keyring=keyring(key))
        assert result.ok, result.problems


def test_audit_verify_says_how_far_capacity_is_sealed_and_names_an_edit(fleet: Fleet) -> None:
    from test_audit_signing import gl

    ok = gl("audit", "verify", "--db", fleet.url, "--public-key", fleet.key.public.text)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "4 capacity GPU-days checked (sealed through 2026-02-17)" in ok.stdout.splitlines()[0], ok.stdout
    sql(fleet.url, f"UPDATE gpu_capacity_days SET alloc_idle_ms = 0 WHERE gpu_uuid = 'GPU-b' AND day = {DAY0}")
    bad = gl("audit", "verify", "--db", fleet.url, "--public-key", fleet.key.public.text)
    assert bad.returncode == 1
    assert "TAMPERED  gpu_capacity_days: GPU GPU-b on 2026-02-16 (host 'node-1'): edited" in bad.stdout, bad.stdout


def test_the_capacity_report_says_which_of_its_days_are_not_sealed_yet(fleet: Fleet, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from click.testing import CliRunner

    from gpuledger.cli.main import cli

    def report(*args: str) -> dict:
        got = CliRunner().invoke(cli, ["report", "capacity", "--db", fleet.url, "--json", *args])
        assert got.exit_code == 0, got.output
        return json.loads(got.output)

    month = report("--month", "2026-02")  # 16 to 19 February hold rows; 16 and 17 are sealed
    assert month["sealed_through"] == "2026-02-17"
    assert any("figures from 2026-02-18 on are not sealed in the audit trail yet" in w for w in month["warnings"])
    sealed_only = report("--from", "2026-02-16", "--to", "2026-02-17")  # --to is included
    assert sealed_only["sealed_through"] == "2026-02-17"
    assert not any("not sealed" in w for w in sealed_only["warnings"])
    local = f"sqlite:///{tmp_path}/local.db"
    _write(local, _day_of("GPU-a", "node-1", DAY0), DAY0 + 10)
    got = CliRunner().invoke(cli, ["report", "capacity", "--db", local, "--json", "--month", "2026-02"])
    assert json.loads(got.output)["sealed_through"] is None  # a local ledger keeps no trail
    assert not any("not sealed" in w for w in json.loads(got.output)["warnings"])


def test_a_ledger_given_a_trail_later_is_sealed_by_its_next_write_of_todays_rows(ledger_url: str) -> None:
    with audit_key() as key:
        _write(ledger_url, _day_of("GPU-a", "node-1", DAY0), DAY0 + 1.5)  # no trail yet: nothing sealed
        assert audit_rows(ledger_url) == []
        setup_accounts(ledger_url)  # the ledger becomes a team ledger
        today = DAY0 + 9
        _write(ledger_url, _day_of("GPU-a", "node-1", today)[:1], today + 0.5)  # only today's rows
        seal = json.loads(_capacity_rows(ledger_url)[-1]["payload"])
        assert (seal["from"], seal["through"]) == (DAY0, DAY0 + 6) and list(seal["days"]) == [str(DAY0)]
        with Ledger(ledger_url) as led:
            result = audit.verify(led, keyring=keyring(key))
        assert result.ok, result.problems
