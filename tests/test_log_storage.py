"""Run logs at rest (store/log_codec.py, migration 13), on SQLite and PostgreSQL: a training's log is
stored zlib-compressed and read back byte for byte; a log that does not compress, and one stored
before migration 13, are kept as they are; a damaged stored log is a clear error, never a wrong log."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from gpuledger.store import Ledger, schema
from gpuledger.store.errors import LedgerError
from test_store_records import minimal_run, run_id


@pytest.fixture
def ledger(ledger_url: str) -> Iterator[Ledger]:
    with Ledger(ledger_url) as led:
        led.create_run(minimal_run(run_id(1)))
        yield led


def _stored(ledger: Ledger) -> tuple[bytes, int]:
    lg = schema.logs.c
    row = ledger.read(lambda c: c.execute(sa.select(lg.data, lg.size_b).where(lg.run_id == run_id(1))).one())
    return bytes(row[0]), int(row[1])


def _yolo_log(epochs: int = 500) -> bytes:
    """What an Ultralytics training prints: a progress bar redrawn with \\r, per epoch, and a table."""
    out = []
    for e in range(1, epochs + 1):
        for i in range(0, 101, 5):
            losses = f"2.31G      1.{i:03d}      2.{e:03d}      1.2{i % 7}"
            out.append(
                f"\r      {e}/{epochs}      {losses}   {i}%|██▍  | {i}/100 [00:{i % 60:02d}<00:10, 9.{i % 10}it/s]"
            )
        scores = f"0.6{e % 10}      0.5{e % 7}      0.58{e % 3}      0.41{e % 9}"
        out.append(f"\n                 all        128        929      {scores}\n")
    return "".join(out).encode()


def test_a_training_log_is_stored_compressed_and_read_back_byte_for_byte(ledger: Ledger) -> None:
    log = _yolo_log()
    ledger.set_log(run_id(1), log)
    stored, size_b = _stored(ledger)
    assert size_b == len(log) > 1_000_000
    assert len(stored) < len(log) / 5, (len(stored), len(log))  # progress bars compress well
    assert ledger.get_log(run_id(1)) == log
    assert ledger.log_info(run_id(1)) == {"sha256": hashlib.sha256(log).hexdigest(), "size_b": len(log),
                                          "truncated": False}  # fmt: skip


def test_a_log_that_does_not_compress_is_stored_as_it_is(ledger: Ledger) -> None:
    noise = os.urandom(200_000)
    ledger.set_log(run_id(1), noise)
    assert _stored(ledger) == (noise, len(noise))
    assert ledger.get_log(run_id(1)) == noise
    ledger.set_log(run_id(1), b"")
    assert ledger.get_log(run_id(1)) == b""


def test_a_log_stored_before_migration_13_reads_as_it_was(ledger: Ledger) -> None:
    ledger.set_log(run_id(1), b"placeholder")
    old = _yolo_log(20)  # what gpuledger stored before: the bytes themselves
    lg = schema.logs
    ledger.write(lambda c: c.execute(sa.update(lg).where(lg.c.run_id == run_id(1)).values(data=old, size_b=len(old))))
    assert ledger.get_log(run_id(1)) == old


def test_a_damaged_stored_log_is_an_error_not_a_wrong_log(ledger: Ledger) -> None:
    ledger.set_log(run_id(1), _yolo_log(20))
    stored, _ = _stored(ledger)
    lg = schema.logs
    for data in (b"rewritten", stored[:-20]):
        ledger.write(lambda c, d=data: c.execute(sa.update(lg).where(lg.c.run_id == run_id(1)).values(data=d)))
        with pytest.raises(LedgerError, match="the stored log is damaged"):
            ledger.get_log(run_id(1))
