"""Seals (core/audit/seal.py): any edited row of a series is found, whatever its place in a hashed chunk;
gpuledger's own later changes (a derived column rewritten, a column added by a migration) never
look like tampering."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuledger.core.audit import seal
from gpuledger.core.audit.run_rules import Span, judge_record

GPU = "gpu_intervals/GPU-0"


def _rows(n: int) -> list[dict]:  # type: ignore[type-arg]
    return [
        {"device_uuid": "GPU-0", "seq": i, "t0": 5.0 * i, "t1": 5.0 * i + 5, "samples": 5, "busy_s": 2.5,
         "energy_j": 1000.0, "temp_max_c": 60.0 + i % 9, "throttle_s": {"power": 0.5}}
        for i in range(n)
    ]  # fmt: skip


def _seal(rows: list[dict], run: dict | None = None) -> dict:  # type: ignore[type-arg]
    return seal.seal(run or {"id": "r", "status": "succeeded"}, [], [], rows, [], [], [], None)


def _compare(old: list[dict], new: list[dict]) -> list[str]:  # type: ignore[type-arg]
    return seal.compare(_seal(old), _seal(new), {GPU: new})


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 3000), st.data())
def test_an_edited_gauge_in_any_row_is_named(n: int, data: st.DataObject) -> None:
    """A gauge (no total moves) edited in any row, first of its chunk or not: its chunk is named."""
    rows = _rows(n)
    target = data.draw(st.integers(0, n - 1))
    edited = [dict(r) for r in rows]
    edited[target]["temp_max_c"] = 99.5
    problems = _compare(rows, edited)
    chunk = max(1, math.ceil(n / seal.MAX_HASHES))
    first = target - target % chunk
    last = min(n - 1, first + chunk - 1)
    where = f"row seq {first}" if first == last else f"rows seq {first}-{last}"
    assert problems == [f"{GPU}: {where} edited"]


def test_a_row_inside_a_chunk_is_covered() -> None:
    rows = _rows(1100)  # chunks of 3 rows
    edited = [dict(r) for r in rows]
    edited[4]["temp_max_c"] = 10.0  # the middle row of chunk 3-5
    assert _compare(rows, edited) == [f"{GPU}: rows seq 3-5 edited"]
    assert _compare(rows, [dict(r) for r in rows]) == []


def test_derived_and_later_null_columns_are_not_sealed() -> None:
    run = {"id": "r", "status": "succeeded", "user": "ana", "rolled_up": False}
    sealed = _seal(_rows(10), run)
    later = [{**r, "util_idle_s": None, "proc_method": None} for r in _rows(10)]  # columns a migration added
    now = _seal(later, {**run, "rolled_up": True, "new_run_column": None})  # the rollup flag rewritten
    assert seal.compare(sealed, now, {GPU: later}) == []
    filled = [{**r, "proc_method": "nvml"} if r["seq"] == 2 else r for r in later]  # a value there is sealed
    assert seal.compare(sealed, _seal(filled, run), {GPU: filled}) == [f"{GPU}: row seq 2 edited"]
    legacy = {**sealed, "run": {**sealed["run"], "rolled_up": "0123456789abcdef"}}  # sealed by an older gpuledger
    assert seal.compare(legacy, now, {GPU: later}) == []
    assert seal.compare(sealed, _seal(_rows(10), {**run, "user": "eve"}), {GPU: _rows(10)}) == ["runs.user edited"]


def test_what_a_push_may_change_of_a_stored_run() -> None:
    stored = {"id": "r", "user": "ana", "host": "n1", "command": ["python"], "started_at": 100.0, "status": "running",
              "ended_at": None, "labels": {"team": "t"}, "meta": {}}  # fmt: skip
    assert judge_record("r", stored, {**stored, "labels": {"team": "u"}}).changes == {"labels": {"team": "u"}}
    assert "user" in (judge_record("r", stored, {**stored, "user": "eve"}).refusal or "")
    assert "started_at" in (judge_record("r", stored, {**stored, "started_at": 99.0}).refusal or "")
    done = {**stored, "status": "succeeded", "ended_at": 200.0}
    assert judge_record("r", done, done).changes == {}
    assert "final" in (judge_record("r", done, {**done, "status": "failed"}).refusal or "")
    assert "final" in (judge_record("r", done, {**done, "labels": {"team": "x"}}).refusal or "")
    assert judge_record("r", done, {**stored, "labels": {"team": "x"}}).stale  # an old running copy: ignored
    lost = {**done, "status": "lost"}  # a verdict from silence: its owner may still say how it ended
    assert judge_record("r", lost, done).changes == {"status": "succeeded"}
    assert Span.of(done).refusal(150.0, 201.0) is None  # within the slack
    assert "after the run ended" in (Span.of(done).refusal(150.0, 300.0) or "")
    assert "before the run started" in (Span.of(done).refusal(-1e9, 1.0) or "")
    assert Span.of(lost).refusal(150.0, 3000.0) is None  # a lost run may have run on a while ...
    assert "after the run ended" in (Span.of(lost).refusal(150.0, 9e9) or "")  # ... not for ever


_KEYS = st.text(max_size=5)
_LEAF = (
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8) | st.binary(max_size=4)
    | st.decimals(allow_nan=False, places=2)
)  # fmt: skip
_VALUES = st.recursive(
    _LEAF, lambda c: st.lists(c, max_size=4) | st.tuples(c, c) | st.dictionaries(_KEYS, c, max_size=4), max_leaves=20
)


@settings(max_examples=500, deadline=None)
@given(_VALUES)
def test_canonical_json_is_the_same_text_as_ever(value: object) -> None:
    """The fast path writes exactly what the spelled-out form wrote, so old hashes still verify."""
    import json

    from gpuledger.core.audit.chain import _plain, canonical_json

    spelled = json.dumps(_plain(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    assert canonical_json(value) == spelled
