"""The stored log's compression (store/log_codec.py) is ISA-L's deflate, or zlib's level 1 where
isal cannot be imported: either way a standard zlib stream that any zlib reads back byte for byte."""

from __future__ import annotations

import builtins
import random
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuledger.store import log_codec


def _training_log(size: int) -> bytes:
    rng = random.Random(size)
    rows = [
        b"\r   %d/100   2.31G   1.%04d   %d%%|####  | %d/50 [00:01<00:02, 9.1it/s]"
        % (e, rng.randrange(10_000), rng.randrange(100), rng.randrange(50))
        for e in range(size // 60 + 1)
    ]
    return b"".join(rows)[:size]


@pytest.fixture(params=["isal", "zlib"])
def compressor(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "zlib":
        real_import = builtins.__import__

        def no_isal(name: str, *args, **kwargs):
            if name == "isal" or name.startswith("isal."):
                raise ImportError(name)
            return real_import(name, *args, **kwargs)

        monkeypatch.setattr(builtins, "__import__", no_isal)
    return request.param


def test_isal_is_installed() -> None:
    # A declared dependency: without it every stored log costs zlib's slower deflate.
    from isal import isal_zlib

    assert zlib.decompress(isal_zlib.compress(b"x" * 1000)) == b"x" * 1000


def test_a_training_log_is_stored_as_a_zlib_stream(compressor: str) -> None:
    log = _training_log(2_000_000)
    stored = log_codec.encode(log)
    assert len(stored) * 3 < len(log)  # progress rows compress several-fold
    assert zlib.decompress(stored) == log  # the standard format, whoever wrote it
    assert log_codec.decode(stored, len(log)) == log


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=5000))
def test_any_bytes_round_trip(data: bytes) -> None:
    stored = log_codec.encode(data)
    assert len(stored) <= len(data)  # never longer than the log itself
    assert log_codec.decode(stored, len(data)) == data
