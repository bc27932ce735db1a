"""A ClickHouse insert killed between its raw part and its rollup views' parts (issue 38): the
resend through ``LiveSeries`` (as ``serve --series-live`` writes it, per push and grouped) leaves
out the rows the store holds, and repairs the rollups those rows lack (series/clickhouse_repair.py).

The kill point is made on the real engine (chDB) deterministically: the views are detached while
the killed write inserts its rows with its token (the raw part committed, no view part), then
attached again, as a restarted server finds them. What a user would notice: raw rows, the per
GPU × day rollups and the run × day rollups chargeback reads all equal what was sent, exactly
(against the same rows sent without a kill, as another run), and sending again changes nothing.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ci_support import need_module

need_module("chdb", "pip install 'gpuledger[clickhouse]'")

from gpuledger.series.clickhouse import ClickHouseSeries  # noqa: E402
from gpuledger.store.retention import DAY_S  # noqa: E402
from gpuledger.store.series_live import LiveSeries, batch_token, group_token  # noqa: E402

MIDNIGHT = (int(time.time()) // DAY_S - 2) * DAY_S  # inside the stores' raw window (7 days)
WAIT = 60.0  # s: a thread that takes longer is stuck
Rows = list[dict[str, Any]]


def _rows(gpus: int, first: int, n: int, start: float = MIDNIGHT - 32) -> Rows:
    """``n`` 5 s intervals per GPU from seq ``first``; seq 6 crosses midnight (split between two days)."""
    out = []
    for g in range(gpus):
        for seq in range(first, first + n):
            t0 = start + seq * 5
            out.append({
                "device_uuid": f"GPU-{g}", "seq": seq, "t0": t0, "t1": t0 + 5, "samples": 5,
                "busy_s": 1.25 + g + seq % 3, "util_idle_s": 3.75 - seq % 3 * 0.5, "energy_j": 301.5 + seq * 7 + g,
                "util_method": "samples", "energy_method": "counter",
            })  # fmt: skip
    return out


@contextlib.contextmanager
def _killed(store: ClickHouseSeries, *views: str) -> Iterator[None]:
    """Writes inside commit their raw parts but not the parts of ``views`` (the kill point)."""
    for v in views:
        store.client.command(f"DETACH TABLE {store.layout.table(v)}")
    try:
        yield
    finally:
        for v in views:
            store.client.command(f"ATTACH TABLE {store.layout.table(v)}")


BOTH = ("gpu_day_rollups_mv", "run_day_rollups_mv")


def _state(store: ClickHouseSeries, run_id: str) -> dict[str, Any]:
    """What a user reads of a run: its raw rows, its per GPU day rollups, its run × day rollups."""
    raw = [{k: v for k, v in r.items() if k != "run_id"} for r in store.gpu_intervals(run_id)]
    days = [
        {k: v for k, v in vars(r).items() if k != "run_id"}
        for r in store.day_rollups(MIDNIGHT - 2 * DAY_S, MIDNIGHT + 2 * DAY_S)
        if r.run_id == run_id
    ]
    run_days = store.client.query(
        f"SELECT toString(day), sum(allocated_ms), sum(busy_ms), sum(energy_mj) FROM "
        f"{store.layout.table('run_day_rollups')} WHERE run = {{r:UInt64}} GROUP BY day ORDER BY day",
        {"r": store._key("run", run_id)},
    )
    return {"raw": raw, "days": days, "run_days": [[d, *(int(x) for x in v)] for d, *v in run_days]}


@pytest.fixture
def live(tmp_path: Path) -> Iterator[LiveSeries]:
    live = LiveSeries(f"chdb://{tmp_path}/series", create=True, batch_rows=0)
    yield live
    live.close()
    live.reader.close()  # type: ignore[union-attr]


@pytest.fixture
def grouped(tmp_path: Path) -> Iterator[LiveSeries]:
    live = LiveSeries(f"chdb://{tmp_path}/series", create=True, batch_rows=10**6, batch_ms=3_600_000)
    yield live
    live.close()
    live.reader.close()  # type: ignore[union-attr]


def _store(live: LiveSeries) -> ClickHouseSeries:
    store = live.reader
    assert isinstance(store, ClickHouseSeries)
    return store


def test_a_resend_after_a_kill_before_the_views_repairs_both_rollups(live: LiveSeries) -> None:
    store = _store(live)
    first, second = _rows(2, 0, 12), _rows(2, 12, 12)
    for rows in (first, second):  # the control: the same rows, never killed
        assert live.write("control", rows, []) == len(rows)
    live.write("neighbour", _rows(2, 0, 24), [])  # another run on the same GPUs and times
    neighbour = _state(store, "neighbour")
    assert live.write("run", first, []) == len(first)
    with _killed(store, *BOTH):  # the second push: raw part written, then killed
        store.write("run", second, [], token=batch_token("run", second, []))
    short = _state(store, "run")
    assert short["raw"] == _state(store, "control")["raw"] and short["days"] != _state(store, "control")["days"]
    # The agent resends the unacknowledged push together with its next one (another token).
    third = _rows(2, 24, 12)
    assert live.write("run", second + third, []) == len(third)
    for rows in (third,):
        live.write("control", rows, [])
    assert _state(store, "run") == _state(store, "control")
    want = sum(round(r["busy_s"] * 1000) for r in first + second + third)
    assert sum(d["busy_s"] for d in _state(store, "run")["days"]) * 1000 == pytest.approx(want, abs=0.5)
    assert sum(d[2] for d in _state(store, "run")["run_days"]) == want  # what chargeback sums
    assert len(_state(store, "run")["days"]) == 4  # 2 GPUs x 2 days: midnight crossed
    assert _state(store, "neighbour") == neighbour  # keyed by run: other runs untouched
    # Sent again (another lost acknowledgement): nothing stored, nothing repaired, nothing doubled.
    before = _state(store, "run")
    assert live.write("run", first + second + third, []) == 0
    assert store.repair_rollups([("run", first + second + third)]) == 0
    assert _state(store, "run") == before


def test_a_kill_between_the_two_views_repairs_the_run_day_rollups(live: LiveSeries) -> None:
    store = _store(live)
    rows = _rows(3, 0, 12)
    live.write("control", rows, [])
    with _killed(store, "run_day_rollups_mv"):  # the per GPU day part written, the run × day one not
        store.write("run", rows, [], token=batch_token("run", rows, []))
    assert _state(store, "run")["days"] == _state(store, "control")["days"]
    assert _state(store, "run")["run_days"] == []  # chargeback would miss the run
    assert live.write("run", rows, []) == 0
    assert _state(store, "run") == _state(store, "control")
    assert live.write("run", rows, []) == 0
    assert _state(store, "run") == _state(store, "control")


def _together(live: LiveSeries, pushes: list[tuple[str, Rows]]) -> list[int]:
    """The pushes written by threads all on their way before any writes: one group carries them."""
    ready = threading.Barrier(len(pushes))
    out: list[Any] = [None] * len(pushes)

    def go(i: int) -> None:
        with live.pushing():
            ready.wait(WAIT)
            out[i] = live.write(pushes[i][0], pushes[i][1], [])

    threads = [threading.Thread(target=go, args=(i,), daemon=True) for i in range(len(pushes))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    assert not any(t.is_alive() for t in threads) and None not in out, out
    return out


def test_a_group_commit_killed_before_the_views_is_repaired_by_the_next_group(grouped: LiveSeries) -> None:
    store = _store(grouped)
    runs = [f"run-{i}" for i in range(3)]
    first = {r: _rows(2, 0, 12) for r in runs}
    for r in runs:
        _together(grouped, [(f"control-{r}", first[r])])
    with _killed(store, *BOTH):  # the group of the three runs' pushes: raw part, no views
        token = group_token([batch_token(r, first[r], []) for r in runs])
        store.write_group([(r, first[r], []) for r in runs], token)
    # Resent in another grouping: two of them with their next rows, beside a new run's push.
    nxt = {r: _rows(2, 12, 12) for r in runs}
    got = _together(
        grouped, [(runs[0], first[runs[0]] + nxt[runs[0]]), (runs[1], first[runs[1]]), ("new", nxt[runs[0]])]
    )
    assert got == [len(nxt[runs[0]]), 0, len(nxt[runs[0]])]
    _together(grouped, [(f"control-{runs[0]}", nxt[runs[0]])])
    assert _state(store, runs[0]) == _state(store, f"control-{runs[0]}")
    assert _state(store, runs[1]) == _state(store, f"control-{runs[1]}")
    assert _state(store, runs[2])["days"] == []  # not resent yet: its raw rows wait for their resend
    assert _together(grouped, [(runs[2], first[runs[2]])]) == [0]
    assert _state(store, runs[2]) == _state(store, f"control-{runs[2]}")
    before = [_state(store, r) for r in runs]
    assert _together(grouped, [(r, first[r]) for r in runs]) == [0, 0, 0]  # again: nothing changes
    assert [_state(store, r) for r in runs] == before


def test_a_rollup_above_its_raw_rows_is_left_as_is(live: LiveSeries) -> None:
    """Raw days the store's window dropped keep their rollups: the repair never lowers them."""
    store = _store(live)
    rows = _rows(1, 0, 24)
    live.write("run", rows, [])
    kept = _state(store, "run")
    day = time.strftime("%Y%m%d", time.gmtime(MIDNIGHT - DAY_S))  # the first day's raw rows dropped
    store.client.command(f"ALTER TABLE {store.layout.table('gpu_intervals')} DROP PARTITION ID '{day}'")
    assert 0 < len(_state(store, "run")["raw"]) < len(rows)
    assert store.repair_rollups([("run", rows)]) == 0
    assert _state(store, "run")["days"] == kept["days"] and _state(store, "run")["run_days"] == kept["run_days"]
