"""No secret is stored anywhere by the team server: a push whose every text field carries one (run
name, command, user, host, directory, labels and their keys, git, versions, metadata, status
reason, device names and ids, GPU rows' text, event kinds, messages and payloads, metric keys,
quarantined rows, and a log whose very long line has secrets at the 1 MiB cut) goes to a real
``gpuledger serve`` on SQLite and PostgreSQL; then every column of every table is read straight
from the database and searched for each secret."""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import zlib
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from gpuledger.store import Ledger
from server_support import BACKENDS, NOW, ServerProcess, backend_url, bearer, host_rows, setup_accounts

pytestmark = pytest.mark.slow

MIB = 1 << 20

# One secret per place, each in a shape some rule knows, written in parts so that secret scanners
# skip the repository. The value is what must never be stored (the part a rule replaces).
S = {
    "name": "sk-" + "proj-Ab1Cd2Ef3Gh4Ij5Kl6Mn7_Op8Qr9St0Uv-Name01",
    "command_p": "Myp4ss" + "Cmd77",
    "command_hf": "hf_" + "CmdAbCdEfGhIjKlMnOpQrStUvWxYz01234",
    "user": "hf_" + "UserCdEfGhIjKlMnOpQrStUvWxYz0123456",
    "host": "sk-" + "proj-Host2Ef3Gh4Ij5Kl6Mn7_Op8Qr9St0Uv",
    "cwd": "wJalrXUtnFEMI/K7MDENG/" + "bPxRfiCYCwdEXAMPLE",
    "label_key": "glt_" + "LabelKeyNoHexId0123456789",
    "label_value": "cGFzc3dvcmQ9" + "TGFiZWxWYWx1ZTk5",  # base64 of password=LabelValue99
    "git_branch": "ghp_" + "GitBranchhIjKlMnOpQrStUvWxYz012345678",
    "git_remote": "Rem0te" + "Pw9988",
    "versions": "VerTok" + "en0123456",
    "meta": "wJalrXUtnFEMI/K7MDENG/" + "bPxRfiCYMetEXAMPLE",
    "status_reason": "Hunter" + "Reason42",
    "gpu_note": "NoteTok" + "en987654",
    "device_name": "glt_" + "0123456789ab_DeviceNameSecret0123456789",
    "device_uuid": "hf_" + "UuidCdEfGhIjKlMnOpQrStUvWxYz0123456",
    "util_method": "UtilTok" + "en24680",
    "throttle": "sk-" + "proj-Throttle4Ij5Kl6Mn7_Op8Qr9St0Uv",
    "event_kind": "ghp_" + "EventKindIjKlMnOpQrStUvWxYz012345678",
    "event_message": "Msg" + "Passw0rd11",
    "payload_key": "hf_" + "PayloadKeyGhIjKlMnOpQrStUvWxYz01234",
    "payload_value": "Payload" + "Secret33",
    "metric_key": "sk-" + "proj-Metric4Ij5Kl6Mn7_Op8Qr9St0Uv-x",
    "refused_metric": "hf_" + "RefusedMetricIjKlMnOpQrStUvWxYz0123",
    "refused_row": "RefusedR" + "owPass55",
}
AKIA = "AKIA" + "IOSFODNN7EXAMPLE"


def _run(run_id: str, **more: Any) -> dict[str, Any]:
    return {
        "id": run_id,
        "name": f"eval {S['name']}",
        "command": ["mysql", "-u", "ml", "-p" + S["command_p"], "runs", "--hf-token", S["command_hf"]],
        "user": f"alice-{S['user']}",
        "host": f"node.{S['host']}",
        "cwd": f"/work/{AKIA} {S['cwd']}",
        "started_at": NOW - 3600,
        "labels": {"project": "A", S["label_key"]: S["label_value"]},
        "git": {"branch": f"feature/{S['git_branch']}", "remote": f"https://ml:{S['git_remote']}@git.example/x.git"},
        "versions": {"torch": f"2.4 token={S['versions']}"},
        "meta": {"dataset": f"s3://bucket AWS_SECRET_ACCESS_KEY {S['meta']}"},
        "gpu_note": f"HF_TOKEN={S['gpu_note']}",
        **more,
    }


def _gpu_row(seq: int, t0: float, t1: float) -> list[Any]:
    return [
        f"GPU:{S['device_uuid']}", seq, t0, t1, 5, 0.5 * (t1 - t0), f"samples token={S['util_method']}", 90.0,
        250.0, "counter", 300.0, 10**10, 10**10, None, None, None, 60.0, 1400.0, 1593.0,
        {f"power {S['throttle']}": 0.25}, 0.0, 0.0, None, 0.0,
    ]  # fmt: skip


def _batch(run_id: str) -> dict[str, Any]:
    rows = [_gpu_row(i, NOW - 3600 + 5 * i, NOW - 3595 + 5 * i) for i in range(5)]
    rows.append(_gpu_row(5, NOW - 3000, NOW - 3100))  # t1 before t0: quarantined, with its device id
    device = {"index": 0, "uuid": f"GPU:{S['device_uuid']}", "name": f"NVIDIA H100 {S['device_name']}",
              "driver_version": "550.54", "memory_total_b": 80 * 2**30}  # fmt: skip
    events = [
        {"seq": 0, "t": NOW - 3000, "kind": S["event_kind"], "message": f"login password={S['event_message']}",
         "payload": {S["payload_key"]: 1, "db": f"client_secret={S['payload_value']}"}},
        {"seq": 1, "t": NOW + 86400, "kind": "note", "message": f"password={S['refused_row']}"},  # in the future
    ]  # fmt: skip
    return {
        "run": _run(run_id),
        "devices": [device],
        "gpu_rows": rows,
        "host_intervals": host_rows(5),
        "events": events,
        "metrics": [
            {"seq": 0, "t": NOW - 3000, "key": f"val/{S['metric_key']}", "value": 0.5},
            {"seq": 1, "t": NOW - 3000, "key": f"x/{S['refused_metric']}" + "k" * 300, "value": 1.0},  # too long
        ],
    }


def _log() -> bytes:
    """One line of 2.5 MiB with no blank to cut after; around the 1 MiB and 2 MiB marks (where an
    upload is handed to the redaction in pieces, and where a line is cut) it is secrets end to
    end, so whatever the cut, it falls inside one."""
    line = bytearray(b"x" * (5 * MIB // 2))
    for start in (MIB - 64 * 1024, 2 * MIB - 64 * 1024):
        secrets = (
            b"".join(
                (
                    b",sk-" + b"proj-LogA%08dKl6Mn7_Op8Qr9St0Uv-WxYz" % i,
                    b",password=LogB%08d" % i,
                    b",hf_" + b"LogC%08dEfGhIjKlMnOpQrStUvWx" % i,
                )[i % 3]
                for i in range(12_000)
            )
            + b","
        )
        line[start : start + len(secrets)] = secrets
    return bytes(line) + b"\nepoch 1 done\n"


def _stored_log(url: str, run_id: str) -> bytes:
    with Ledger(url) as led:
        data = led.get_log(run_id)
    assert data is not None
    return data


@pytest.fixture(scope="module", params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with backend_url(request.param, tmp_path_factory.mktemp("redaction")) as url:
        yield url


def _stored_texts(url: str) -> Iterator[tuple[str, str, str]]:
    """(table, column, text) for every non-empty value of every column of every table; bytes as
    they are and, when zlib-compressed (stored logs), decompressed."""
    with Ledger(url) as led, led.database.engine.connect() as conn:
        meta = sa.MetaData()
        meta.reflect(bind=conn)
        for table in meta.sorted_tables:
            for row in conn.execute(sa.select(table)).mappings():
                for column, value in row.items():
                    if value is None:
                        continue
                    if isinstance(value, (bytes, memoryview)):
                        raw = bytes(value)
                        texts = [raw.decode("latin-1")]
                        with contextlib.suppress(zlib.error):
                            texts.append(zlib.decompress(raw).decode("latin-1"))
                    elif isinstance(value, (dict, list)):
                        texts = [json.dumps(value)]
                    else:
                        texts = [str(value)]
                    for text in texts:
                        yield table.name, column, text


def test_no_secret_is_stored_anywhere(db_url: str) -> None:
    tokens = setup_accounts(db_url)
    run_id = "0190aaaa-bbbb-7ccc-8ddd-eeeeffff0001"
    with ServerProcess(db_url) as server:

        def post(body: dict[str, Any]) -> httpx.Response:
            return httpx.post(server.url + "/api/v1/ingest", json=body, headers=bearer(tokens.agent_a), timeout=60)

        first = post(_batch(run_id))
        assert first.status_code == 200, first.text
        assert len(first.json()["quarantined"]) == 3, first.text  # the bad GPU row, event and metric
        # Pushed again, ended: the identity fields (user, host, cwd, command, git, versions) are
        # redacted the same way, so the run is not "rewritten" (409).
        final = {"run": _run(run_id, status="failed", ended_at=NOW - 60, exit_code=1,
                             status_reason=f"db password={S['status_reason']}"), "final": True}  # fmt: skip
        again = post(final)
        assert again.status_code == 200, again.text
        log = httpx.put(f"{server.url}/api/v1/runs/{run_id}/log", content=_log(), headers=bearer(tokens.agent_a),
                        timeout=120)  # fmt: skip
        assert log.status_code == 200, log.text
        shown = httpx.get(f"{server.url}/api/v1/runs/{run_id}", headers=bearer(tokens.admin), timeout=60).json()
    leaks = [
        (name, table, column)
        for table, column, text in _stored_texts(db_url)
        for name, secret in S.items()
        if secret in text
    ]
    assert not leaks, leaks
    # Of the long line, only its filler, the commas and the key names are left around the
    # placeholders: not one byte of a secret, wherever the line was cut.
    line = _stored_log(db_url, run_id).split(b"\n")[0]
    left = re.sub(rb"\[REDACTED:[a-z0-9-]+\]", b"", line).replace(b"password=", b"")
    assert set(left) == set(b"x,"), sorted(set(left))
    assert line.count(b"[REDACTED:") == 24_000
    # A quarantined row's sha256 is of the redacted row: a hash of one holding a short password
    # would let its guesses be checked.
    with Ledger(db_url) as led:
        q = led.database.read(
            lambda c: c.execute(sa.text("SELECT payload, payload_sha256 FROM quarantined_rows")).all()
        )
    assert len(q) == 3 and all(hashlib.sha256(p.encode()).hexdigest() == digest for p, digest in q), q
    assert shown["status"] == "failed" and "[REDACTED:" in shown["user"] and "[REDACTED:" in shown["cwd"]
    stored = {(table, column) for table, column, text in _stored_texts(db_url) if "[REDACTED:" in text}
    # Where the secrets went, redacted (the test would pass vacuously if the rows were not stored).
    for place in (("runs", "user"), ("runs", "name"), ("devices", "name"), ("events", "kind"), ("metrics", "key"),
                  ("quarantined_rows", "item"), ("quarantined_rows", "payload"), ("logs", "data")):  # fmt: skip
        assert any(t == place[0] and (c == place[1] or place[0] == "logs") for t, c in stored), (place, stored)
