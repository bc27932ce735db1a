"""A discovered run's log copy on disk: whatever its length, it gives what a wrapped run stores.

``HeadTailSpool`` keeps a growing log as head and tail (node/log_spool.py); ``capped()`` must equal
``cap_bytes`` of the whole log (core/training/logcap.py, the wrapped path's cap) however the bytes
arrive, and the file must stay bounded. A container log fed binary garbage and a line of many
megabytes without a newline is still archived, redacted and bounded.
"""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from e2e_helpers import cli_env, run_cli
from gpuledger.core.training.logcap import MIN_MAX_B, cap_bytes, find_cut
from gpuledger.node.docker_logs import ContainerLog, Message
from gpuledger.node.log_spool import HeadTailSpool

CAP = MIN_MAX_B  # the smallest cap, so a few hundred KiB cross it several times

pieces = st.lists(
    st.one_of(
        st.binary(min_size=0, max_size=3000),
        st.integers(min_value=1, max_value=90_000).map(lambda n: (b"epoch %d loss 0.5\n" % n) * (n // 18 + 1)),
    ),
    max_size=40,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(chunks=pieces)
def test_the_spool_gives_exactly_the_wrapped_paths_capped_log(tmp_path: Path, chunks: list[bytes]) -> None:
    path = tmp_path / "s.log"
    path.unlink(missing_ok=True)
    spool = HeadTailSpool(path, CAP)
    for chunk in chunks:
        spool.append(chunk)
        assert path.stat().st_size <= 2 * CAP + len(chunk) if chunk else True  # compacted past 2 x cap
    whole = b"".join(chunks)
    assert spool.total_b == len(whole)
    assert spool.capped() == (cap_bytes(whole, CAP) if whole else None)
    spool.remove()


def test_a_spool_compacts_and_its_stored_log_names_the_cut(tmp_path: Path) -> None:
    spool = HeadTailSpool(tmp_path / "s.log", CAP)
    lines = [b"line %07d of a long training\n" % i for i in range(40_000)]  # ~1.2 MB, 18 x the cap
    for line in lines:
        spool.append(line)
    assert spool.compactions > 0 and (tmp_path / "s.log").stat().st_size <= 2 * CAP
    stored = spool.capped()
    assert stored is not None and stored.truncated and len(stored.data) <= CAP
    assert stored.data.startswith(lines[0]) and stored.data.endswith(lines[-1])
    cut = find_cut(stored.data)
    assert cut is not None and cut.total_b == sum(map(len, lines))
    assert stored == cap_bytes(b"".join(lines), CAP)  # the wrapped path's cut of the same output


def test_binary_garbage_and_a_huge_line_are_archived_bounded_and_redacted(tmp_path: Path) -> None:
    log = ContainerLog("c" * 64, path=tmp_path / "c.log", cap_b=CAP)
    garbage = bytes(range(256)) * 64 + b"\xff\xfe\x00\x1b[2J"
    log.add([Message(1, None, b"WANDB_API_KEY=0123456789abcdef0123456789abcdef01234567\n")])
    log.add([Message(1, None, garbage)])
    for _ in range(80):  # 8 MiB on one line, no newline
        log.add([Message(1, None, b"x" * (100 * 1024))])
    log.add([Message(1, None, b"\nTraceback: the end\n")])
    log.finish()
    stored = log.capped()
    assert stored is not None and stored.truncated and len(stored.data) <= CAP
    assert b"0123456789abcdef0123456789abcdef" not in stored.data and b"WANDB_API_KEY=" in stored.data
    assert stored.data.endswith(b"Traceback: the end\n")
    assert (tmp_path / "c.log").stat().st_size <= 3 * CAP


def test_a_log_cap_that_is_not_a_size_is_refused_before_the_agent_starts(tmp_path: Path) -> None:
    env = cli_env(tmp_path / "home", f"sqlite:///{tmp_path}/ledger.db", GPULEDGER_LOG_MAX_B="lots")
    out = run_cli(["agent", "--no-slurm", "--kubelet-socket", "none", "--docker-socket", "none"], env, timeout=60)
    err = out.stderr.decode()
    assert out.returncode == 2 and "GPULEDGER_LOG_MAX_B='lots'" in err and "is not a size" in err, err
    assert "Traceback" not in err and not (tmp_path / "ledger.db").exists()
