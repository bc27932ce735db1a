"""A run's log is stored once, capped: the head and the tail of the output around a marker that
says what was cut, with the sha256 of the stored bytes, on SQLite and PostgreSQL."""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuledger.core.training.logcap import DEFAULT_MAX_B, HEAD_SHARE, MIN_MAX_B, cap_bytes, find_cut, parse_size
from gpuledger.runs.liveness import fresh_log
from gpuledger.runs.logfile import archive, archive_once, cap_or_default, log_cap, read_capped
from gpuledger.store import Ledger
from gpuledger.store.audit_seals import current_seal
from test_store_records import minimal_run, run_id

CAP = MIN_MAX_B  # 64 KiB: small enough to cut a few hundred KB of output


def _output(size: int, seed: int = 1) -> bytes:
    rnd = random.Random(seed)
    lines = []
    total = 0
    while total < size:
        line = b"epoch %d step %d loss %.5f %s\n" % (total // 5000, total, rnd.random(), b"x" * rnd.randint(0, 120))
        lines.append(line)
        total += len(line)
    return b"".join(lines)[:size]


@pytest.fixture
def ledger(ledger_url: str):
    led = Ledger(ledger_url)
    yield led
    led.close()


def test_a_long_log_keeps_its_head_and_tail_around_the_marker(ledger, tmp_path: Path) -> None:
    rid = run_id(1)
    ledger.create_run(minimal_run(rid))
    data = _output(400_000)
    path = tmp_path / "run.log"
    path.write_bytes(data)
    stored = archive(ledger, rid, str(path), CAP, remove=True)
    assert stored is not None and stored.truncated and stored.total_b == len(data)
    assert not path.exists()  # the ledger holds the log now: one copy
    kept = ledger.get_log(rid)
    assert kept == stored.data and len(kept) <= CAP
    cut = find_cut(kept)
    assert cut is not None and cut.total_b == len(data) and cut.cap_b == CAP
    assert kept[: cut.head_b] == data[: cut.head_b]  # the start of the run
    assert kept[len(kept) - cut.tail_b :] == data[len(data) - cut.tail_b :]  # its end
    assert cut.head_b + cut.cut_b + cut.tail_b == len(data)
    assert cut.head_b <= CAP // HEAD_SHARE and cut.tail_b > CAP // 2  # the end is what explains a failure
    assert data[cut.head_b - 1 : cut.head_b] == b"\n" and data[-cut.tail_b - 1 : -cut.tail_b] == b"\n"  # whole lines
    marker = kept[cut.head_b : len(kept) - cut.tail_b]
    assert marker.startswith(b"[gpuledger: %d bytes cut here" % cut.cut_b) and marker.endswith(b"]\n")
    info = ledger.log_info(rid)
    assert info == {"sha256": hashlib.sha256(kept).hexdigest(), "size_b": len(kept), "truncated": True}
    seal = ledger.read(lambda conn: current_seal(conn, rid))
    assert seal is not None and seal[0]["log"] == info["sha256"]  # what the audit trail seals


def test_a_short_log_is_stored_whole(ledger, tmp_path: Path) -> None:
    rid = run_id(2)
    ledger.create_run(minimal_run(rid))
    data = _output(CAP)  # exactly the cap: nothing to cut
    path = tmp_path / "run.log"
    path.write_bytes(data)
    stored = archive(ledger, rid, str(path), CAP, remove=False)
    assert stored is not None and not stored.truncated
    assert path.exists()  # a lost run's file stays: its command may still write
    assert ledger.get_log(rid) == data and find_cut(data) is None
    assert ledger.log_info(rid) == {"sha256": hashlib.sha256(data).hexdigest(), "size_b": len(data), "truncated": False}


def test_a_recovered_run_stores_its_log_once_and_keeps_a_stored_one(ledger, tmp_path: Path) -> None:
    rid = run_id(3)
    ledger.create_run(minimal_run(rid))
    path = tmp_path / "run.log"
    path.write_bytes(_output(300_000, seed=2))
    archive_once(ledger, rid, str(path), CAP)
    first = ledger.log_info(rid)
    assert first is not None and first["truncated"] and not path.exists()
    path.write_bytes(b"a later file with the same name\n")
    archive_once(ledger, rid, str(path), CAP)  # the ledger had it: the file goes, the log stays
    assert ledger.log_info(rid) == first and not path.exists()


def test_a_file_that_cannot_be_read_stores_nothing(ledger, tmp_path: Path) -> None:
    rid = run_id(4)
    ledger.create_run(minimal_run(rid))
    assert archive(ledger, rid, str(tmp_path / "missing.log"), CAP, remove=True) is None
    assert ledger.get_log(rid) is None


def test_reading_a_huge_file_reads_only_what_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "huge.log"
    with open(path, "wb") as fh:  # 2 GiB, sparse: reading it whole would take seconds and 2 GiB
        fh.write(b"first line\n")
        fh.seek(2 * 1024**3 - 12)
        fh.write(b"\nlast line\n")
    stored = read_capped(str(path), CAP)
    assert stored is not None and stored.truncated and len(stored.data) <= CAP
    assert stored.data.startswith(b"first line\n") and stored.data.endswith(b"\nlast line\n")
    assert find_cut(stored.data).total_b == 2 * 1024**3 - 1


@st.composite
def _log_and_cap(draw: st.DrawFn) -> tuple[bytes, int]:
    """A cap and a log around it: from well under to several times over, so the cutting branch is
    reached in most examples (hypothesis alone seldom draws binaries of tens of KB)."""
    cap = draw(st.integers(min_value=MIN_MAX_B, max_value=150_000))
    size = draw(st.integers(min_value=0, max_value=3 * cap))
    unit = draw(
        st.binary(min_size=1, max_size=4096)
        | st.lists(st.sampled_from([b"\n", b"ab", b"x" * 999, "é✓\n".encode()]), min_size=1).map(b"".join)
    )
    return (unit * (size // len(unit) + 1))[:size], cap


@settings(max_examples=200, deadline=None)
@given(case=_log_and_cap())
def test_cap_keeps_a_prefix_and_a_suffix_and_says_so(case: tuple[bytes, int]) -> None:
    data, cap = case
    stored = cap_bytes(data, cap)
    assert len(stored.data) <= max(cap, len(data)) and stored.total_b == len(data)
    cut = find_cut(stored.data)
    if len(data) <= cap:
        assert stored.data == data and not stored.truncated
        return
    assert stored.truncated and len(stored.data) <= cap and cut is not None
    assert cut.head_b + cut.cut_b + cut.tail_b == len(data) and cut.cut_b > 0
    assert stored.data[: cut.head_b] == data[: cut.head_b]
    assert stored.data[len(stored.data) - cut.tail_b :] == data[len(data) - cut.tail_b :]


def test_a_look_alike_marker_printed_by_the_command_is_not_a_cut() -> None:
    fake = b"[gpuledger: 10 bytes cut here; the first 5 and the last 5 of 20 bytes are kept (cap 65536 bytes, "
    fake += b"GPULEDGER_LOG_MAX_B)]\n"
    assert find_cut(b"hello\n" + fake + b"world\n") is None
    real = cap_bytes(_output(200_000) + fake, CAP).data
    assert find_cut(real) is not None and find_cut(real).total_b == 200_000 + len(fake)


def test_the_cap_comes_from_the_environment() -> None:
    assert log_cap({}) == DEFAULT_MAX_B == 64 * 1024 * 1024
    assert log_cap({"GPULEDGER_LOG_MAX_B": "256MiB"}) == 256 * 1024 * 1024
    assert log_cap({"GPULEDGER_LOG_MAX_B": " 100000 "}) == 100_000
    assert parse_size("1g") == parse_size("1 GiB") == 1024**3
    for bad in ("lots", "12", "-5", "1.5MiB", "64MB"):
        with pytest.raises(ValueError, match="GPULEDGER_LOG_MAX_B"):
            log_cap({"GPULEDGER_LOG_MAX_B": bad})
        assert cap_or_default({"GPULEDGER_LOG_MAX_B": bad}) == DEFAULT_MAX_B  # a read never fails on it


def test_a_lost_runs_file_is_shown_only_when_it_is_newer_than_the_log_it_was_cut_from(tmp_path: Path) -> None:
    # `gpuledger logs` of a lost run: CMD may still write its file, so the file wins when it holds at
    # least as much as the log the stored (capped) copy was cut from; comparing with the stored
    # copy's own length would show a shorter, older file instead.
    log = tmp_path / "run.log"
    log.write_bytes(b"".join(b"line %06d\n" % i for i in range(40_000)))  # 480 KB, cut at 64 KiB
    rid = run_id(1)
    with Ledger(f"sqlite:///{tmp_path}/l.db") as led:
        led.create_run(minimal_run(rid, status="lost", log_path=str(log)))
        stored = archive(led, rid, str(log), MIN_MAX_B, remove=False)
        assert stored is not None and stored.truncated
        with open(log, "ab") as fh:
            fh.write(b"printed after the recorder died\n")
        assert b"printed after the recorder died" in (fresh_log(led, led.get_run(rid)) or b"")
        log.write_bytes(b"x\n" * 100_000)  # 200 KB: more than the stored copy, less than its whole log
        assert fresh_log(led, led.get_run(rid)) == led.get_log(rid)
