"""The standard-library writer of ``gpuledger run`` (store/run_writer.py) stores what ``Ledger`` stores.

The same run, with every kind of row a recording run writes (NaN measurements, a NaN metric,
JSON payloads, labels, a compressed log, a resent batch, the run's end, a late append after it
ended), is written once through ``Ledger`` (SQLAlchemy) and once through ``RunWriter`` into two
fresh ledgers; every table is then read back with SQLite's ``quote()`` of every column, so a
value stored with another type (1 vs 1.0, 'NaN' vs NULL, a JSON text spelled differently) differs.
"""

from __future__ import annotations

import dataclasses
import math
import sqlite3
from pathlib import Path

import pytest

from gpuledger.core.model import Event, Metric
from gpuledger.store import Ledger, accounts
from gpuledger.store.run_writer import RunWriter, open_run_ledger
from test_store_records import T0, full_device, full_gpu, full_host, minimal_device, minimal_gpu, minimal_run

RID = "0190abcd-0001-7000-8000-000000000001"


def record(led: object) -> None:
    """What a recording run writes, start to end, plus the calls a retry or a late batch makes."""
    run = minimal_run(
        RID,
        command=["python", "train.py", "--lr=0.01", "épochs=3"],
        labels={"project": "vision", "team": "perception", "dataset": "coco"},
        git={"commit": "a" * 40, "dirty": True},
        versions={"python": "3.11.7"},
        interval_s=5.0,
        recorder_pid=4242,
        log_path="/tmp/x.log",
        gpu_note=None,
    )
    assert led.create_run(run) is True
    assert led.create_run(run) is False  # a replayed creation changes nothing
    nan_power = dataclasses.replace(full_device(0, "GPU-aaaa"), power_limit_w=math.nan)
    led.add_devices(RID, [nan_power, minimal_device(1, "GPU-bbbb")])
    gpu = [full_gpu("GPU-aaaa", 0), full_gpu("GPU-aaaa", 1), minimal_gpu("GPU-bbbb", 0)]
    gpu[1].busy_s = math.nan  # a NaN reading is no reading: NULL
    gpu[1].throttle_s = {"power": math.inf}
    host = [full_host(0), full_host(1)]
    led.append(RID, gpu, host)
    led.append(RID, gpu[:1], host[:1])  # resent: skipped
    events = [
        Event(T0 + 1, "sampler_error", "nvml hiccup", {"code": 3, "ratio": math.nan}),
        Event(T0 + 2, "epoch_end", "", {}),
    ]
    metrics = [Metric(T0 + 2, "loss", math.nan, epoch=0), Metric(T0 + 2, "mAP50", 0.5, epoch=0, step=10)]
    led.append(RID, events=events, metrics=metrics)
    led.append(RID, events=events[:1], metrics=metrics[:1])  # resent without numbers: skipped
    led.append(RID, metrics=[metrics[1], Metric(T0 + 4, "epochs", 3)])  # half resent; an int stays an int
    led.append(RID, metrics=[Metric(T0 + 5, "lr", 0.01, step=7)], metric_seq=9)  # numbered by the sender
    led.append(RID, events=[Event(T0 + 3, "alert", "idle GPU", {"gpu": 1})], event_seq=2)
    led.update_run(RID, labels={"project": "vision", "team": "robotics"}, meta={})
    led.set_log(RID, b"epoch 1/3 loss 0.5\n" * 200, truncated=True)
    led.update_run(RID, status="succeeded", ended_at=T0 + 60.25, exit_code=0, signal=None, status_reason=None)
    led.append(RID, [minimal_gpu("GPU-bbbb", 1)])  # a late batch after the end (an outbox replay)


def tables(url: str) -> dict[str, list[tuple]]:
    path = url.removeprefix("sqlite:///")
    with sqlite3.connect(path) as conn:
        names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
        out = {}
        for name in names:
            if name == "schema_version":
                continue  # when each ledger was created
            cols = [r[1] for r in conn.execute(f'PRAGMA table_info("{name}")')]
            quoted = ", ".join(f'quote("{c}")' for c in cols)
            order = ", ".join(str(i + 1) for i in range(len(cols)))
            rows = conn.execute(f'SELECT {quoted} FROM "{name}" ORDER BY {order}')
            out[name] = [tuple(zip(cols, row, strict=True)) for row in rows]
    return out


def fresh(tmp_path: Path, name: str) -> str:
    url = f"sqlite:///{tmp_path / name}"
    Ledger(url).close()  # created and migrated, as the first gpuledger command does
    return url


def test_a_run_written_with_sqlite3_is_stored_row_for_row_as_sqlalchemy_stores_it(tmp_path: Path) -> None:
    full_url, lite_url = fresh(tmp_path, "full.db"), fresh(tmp_path, "lite.db")
    with Ledger(full_url) as led:
        record(led)
    writer = RunWriter.open(lite_url)
    assert writer is not None
    with writer:
        record(writer)
    full, lite = tables(full_url), tables(lite_url)
    assert full["runs"] and full["gpu_intervals"] and full["metrics"] and full["logs"]
    for name in full:
        assert lite[name] == full[name], name
    # and what gpuledger reads back is the run as written
    with Ledger(lite_url) as led:
        assert led.get_run(RID).labels == {"project": "vision", "team": "robotics"}
        assert math.isnan(led.metrics(RID, "loss")[0].value)
        assert led.get_log(RID) == b"epoch 1/3 loss 0.5\n" * 200


def test_other_ledgers_are_left_to_sqlalchemy(tmp_path: Path) -> None:
    assert RunWriter.open(f"sqlite:///{tmp_path / 'new.db'}") is None  # to create: Ledger migrates it
    assert RunWriter.open("sqlite://") is None  # in memory
    assert RunWriter.open("postgresql://u@127.0.0.1/db") is None
    stale = tmp_path / "old.db"
    sqlite3.connect(stale).executescript(
        "CREATE TABLE schema_version (version INTEGER PRIMARY KEY, applied_at REAL, description TEXT);"
        "INSERT INTO schema_version VALUES (17, 0, 'x');"
    )
    assert RunWriter.open(f"sqlite:///{stale}") is None  # to migrate
    team = fresh(tmp_path, "team.db")
    with Ledger(team) as led:
        accounts.issue_token(led, "ana", role="admin", actor="test", create_user=True)
    assert RunWriter.open(team) is None
    led = open_run_ledger(team)  # the full Ledger, which refuses to record into a team ledger
    try:
        with pytest.raises(Exception, match="team server's ledger"):
            led.create_run(minimal_run(RID))
    finally:
        led.close()


def test_reads_and_rare_writes_go_to_the_full_ledger(tmp_path: Path) -> None:
    url = fresh(tmp_path, "l.db")
    writer = RunWriter.open(url)
    assert writer is not None
    with writer:
        writer.create_run(minimal_run(RID))
        writer.update_run(RID, meta={"lineage": {"model_line": "det", "weights_sha256": "b" * 64}})
        assert writer.get_run(RID).meta["lineage"]["model_line"] == "det"  # read through Ledger
        with pytest.raises(Exception, match="run"):
            writer.update_run("0190abcd-0001-7000-8000-0000000000ff", status="failed")  # RunNotFound, as Ledger says it
    lineage = sqlite3.connect(url.removeprefix("sqlite:///")).execute("SELECT model_line FROM run_lineage").fetchall()
    assert lineage == [("det",)]
