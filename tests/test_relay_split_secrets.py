"""The output relay's log copy (recorder/relay._LogCopy: batches of LOG_BATCH_B, each source's
stream redacted line by line) holds exactly what redacting the whole output at once gives, when
the output arrives cut inside its secrets: every rule's example secret, cut at any byte of it, in
reads of any size, with the batch size down to a few bytes so the relay's own cuts fall inside
secrets too."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuledger.core.redaction.redact import Redactor
from gpuledger.recorder import relay

R = Redactor.default()
SECRETS = [r.example.encode() for r in R.rules if r.example]
FILLER = [
    b"      1/100      3.1G      1.234      2.345  45%|####      | 12/50 [00:01<00:02, 9.1it/s]",
    b"step 12 | loss 2.31 | tokens/s 41000 | key_dim 64",
    b"\x1b[34mtrain: \x1b[0mScanning /data/labels.cache... 128 images",
    b"-" * 40,
    b"",
]
SEPARATORS = [b"\n", b"\r", b"\r\n", b" ", b""]


@st.composite
def split_output(draw: st.DrawFn) -> tuple[bytes, list[int]]:
    """Output of filler and secrets, and cut positions: one inside each secret, more anywhere."""
    data = bytearray()
    cuts: list[int] = []
    for _ in range(draw(st.integers(1, 12))):
        if draw(st.booleans()):  # a secret on a line of its own, ended by \n or \r
            secret = draw(st.sampled_from(SECRETS))
            data += draw(st.sampled_from(SEPARATORS[:3]))
            cuts.append(len(data) + draw(st.integers(1, max(1, len(secret) - 1))))
            data += secret + draw(st.sampled_from(SEPARATORS[:3]))
        else:
            data += draw(st.sampled_from(FILLER)) + draw(st.sampled_from(SEPARATORS))
    cuts += draw(st.lists(st.integers(0, len(data)), max_size=6))
    return bytes(data), sorted(set(cuts))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=split_output(), batch=st.sampled_from([1, 7, 64, 300, relay.LOG_BATCH_B]))
def test_the_log_copy_of_output_cut_inside_secrets_equals_redacting_it_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: tuple[bytes, list[int]], batch: int
) -> None:
    data, cuts = case
    monkeypatch.setattr(relay, "LOG_BATCH_B", batch)
    path = tmp_path / "run.log"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        log = relay._LogCopy(fd, {3: R.stream()})
        for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True):
            if b > a:
                log.add(3, data[a:b])
        log.close()
    finally:
        os.close(fd)
    stored = path.read_bytes()
    assert stored == R.redact_bytes(data)
    for secret in SECRETS:  # and no example secret survives, whole or in a piece the cut left
        if secret in data:
            assert secret not in stored
