"""The local ledger holds no secret either: a run recorded with ``gpuledger.track`` whose user,
host, directory, name, labels (keys and values), git state, versions, metadata, metric keys,
events and failure reason each carry a secret; the SQLite file is then read byte by byte."""

from __future__ import annotations

from pathlib import Path

import pytest

import gpuledger
from gpuledger.recorder import metadata, session

S = {
    "user": "hf_" + "UserCdEfGhIjKlMnOpQrStUvWxYz0123456",
    "host": "sk-" + "proj-Host2Ef3Gh4Ij5Kl6Mn7_Op8Qr9St0Uv",
    "cwd": "glt_" + "0123456789ab_CwdSecretAbCdEfGhIjKlMn",
    "name": "sk-" + "proj-Name2Ef3Gh4Ij5Kl6Mn7_Op8Qr9St0Uv",
    "label_key": "glt_" + "LabelKeyNoHexId0123456789",
    "label_value": "cGFzc3dvcmQ9" + "TGFiZWxWYWx1ZTk5",
    "branch": "ghp_" + "GitBranchhIjKlMnOpQrStUvWxYz012345678",
    "remote": "Rem0te" + "Pw9988",
    "version": "VerTok" + "en0123456",
    "meta": "MetaPass" + "word77",
    "metric": "hf_" + "MetricEfGhIjKlMnOpQrStUvWxYz0123456",
    "event_kind": "ghp_" + "EventKindIjKlMnOpQrStUvWxYz012345678",
    "event_message": "Msg" + "Passw0rd11",
    "payload": "hf_" + "PayloadKeyGhIjKlMnOpQrStUvWxYz01234",
    "reason": "Reason" + "Hunter42",
}


def test_the_local_ledger_holds_no_secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    workdir = tmp_path / f"work-{S['cwd']}"
    workdir.mkdir()
    monkeypatch.chdir(workdir)
    monkeypatch.setenv("LOGNAME", f"alice-{S['user']}")
    monkeypatch.setattr(session, "host_name", lambda: f"node.{S['host']}")
    git = {"commit": "0" * 40, "branch": f"feature/{S['branch']}", "remote": f"https://ml:{S['remote']}@git.x/r.git"}
    monkeypatch.setattr(metadata, "git_state", lambda cwd: dict(git))
    monkeypatch.setattr(metadata, "versions", lambda: {"torch": f"2.4 token={S['version']}"})
    db = tmp_path / "ledger.db"
    labels = {"project": "A", S["label_key"]: S["label_value"]}
    with (
        pytest.raises(RuntimeError),
        gpuledger.track(
            name=f"eval {S['name']}", labels=labels, db=f"sqlite:///{db}", no_gpu=True, interval=0.5
        ) as run,
    ):
        run.log_metric(f"val/{S['metric']}", 0.5, epoch=1)
        run.event(S["event_kind"], f"login password={S['event_message']}", **{S["payload"]: 1})
        run._session.update_meta(labels={}, meta={"db": f"password={S['meta']}"})
        raise RuntimeError(f"could not connect: password={S['reason']}")

    stored = b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.name.startswith("ledger.db"))
    leaks = [name for name, secret in S.items() if secret.encode() in stored]
    assert not leaks, leaks
    with gpuledger.store.Ledger(f"sqlite:///{db}") as led:
        kept = led.get_run(run.id)
    assert kept is not None and kept.status == "failed"
    assert "[REDACTED:" in kept.user and "[REDACTED:" in kept.host and "[REDACTED:" in kept.cwd
    assert "[REDACTED:" in kept.status_reason and "[REDACTED:" in str(kept.meta)
