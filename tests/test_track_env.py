"""gpuledger.track() names the run in GPULEDGER_RUN_ID only while the block runs: integrations in the
process attach to it. After the block, even when recording the run's end failed, code in the same
process must not attach to a finished run."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import gpuledger
from gpuledger.recorder.session import Session


def test_run_id_is_set_inside_and_removed_after(tmp_path: Path) -> None:
    with gpuledger.track(interval=0.5, no_gpu=True, db=f"sqlite:///{tmp_path}/l.db") as run:
        assert os.environ["GPULEDGER_RUN_ID"] == run.id
    assert "GPULEDGER_RUN_ID" not in os.environ


def test_run_id_is_removed_when_finishing_the_run_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken_finish(self: Session, *args: object, **kwargs: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(Session, "finish", broken_finish)
    with (
        pytest.raises(OSError, match="disk full"),
        gpuledger.track(interval=0.5, no_gpu=True, db=f"sqlite:///{tmp_path}/l.db"),
    ):
        pass
    assert "GPULEDGER_RUN_ID" not in os.environ
