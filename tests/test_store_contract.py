"""The ledger contract, run against every backend (SQLite file and PostgreSQL schema)."""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Iterator

import pytest

from gpuledger.core.model import Event, Metric
from gpuledger.store import AmbiguousRun, Ledger, RunNotFound
from test_store_records import (
    T0,
    full_device,
    full_gpu,
    full_host,
    full_run,
    minimal_device,
    minimal_gpu,
    minimal_host,
    minimal_run,
    run_id,
    some_events,
    some_metrics,
)


@pytest.fixture
def ledger(ledger_url: str) -> Iterator[Ledger]:
    with Ledger(ledger_url) as led:
        yield led


# -- round trips -------------------------------------------------------------------------------


def test_run_round_trips_every_field(ledger: Ledger) -> None:
    full, minimal = full_run(run_id(1)), minimal_run(run_id(2))
    assert ledger.create_run(full) is True
    assert ledger.create_run(minimal) is True
    assert ledger.get_run(full.id) == full
    got = ledger.get_run(minimal.id)
    assert got == minimal
    assert got.ended_at is None and got.exit_code is None and got.name is None and got.labels == {}


def test_create_run_twice_keeps_the_first(ledger: Ledger) -> None:
    run = minimal_run(run_id(1), labels={"project": "a"})
    ledger.create_run(run)
    assert ledger.create_run(minimal_run(run_id(1), labels={"project": "b"}, name="other")) is False
    assert ledger.get_run(run.id) == run
    assert [r.id for r in ledger.list_runs(project="a")] == [run.id]


def test_devices_round_trip_and_upsert(ledger: Ledger) -> None:
    rid = run_id(1)
    ledger.create_run(minimal_run(rid))
    full, minimal = full_device(0, "GPU-aaaa"), minimal_device(1, "GPU-bbbb")
    ledger.add_devices(rid, [minimal, full])
    ledger.add_devices(rid, [full])  # idempotent
    assert ledger.devices(rid) == [full, minimal]
    renamed = dataclasses.replace(minimal, name="Tesla T4 (renamed)")
    ledger.add_devices(rid, [renamed])
    assert ledger.devices(rid) == [full, renamed]


def test_intervals_events_metrics_round_trip(ledger: Ledger) -> None:
    rid = run_id(1)
    ledger.create_run(minimal_run(rid))
    gpu = [full_gpu("GPU-a", 0), minimal_gpu("GPU-a", 1), full_gpu("GPU-b", 0)]
    host = [full_host(0), minimal_host(1)]
    ledger.append(rid, gpu, host, some_events(), some_metrics())
    assert ledger.gpu_intervals(rid) == gpu
    assert ledger.gpu_intervals(rid, device_uuid="GPU-b") == [gpu[2]]
    got_min = ledger.gpu_intervals(rid)[1]
    assert got_min.busy_s is None and got_min.energy_j is None and got_min.throttle_s is None
    assert ledger.host_intervals(rid) == host
    assert ledger.host_intervals(rid)[1].sys_cpu_util_avg_pct is None
    assert ledger.events(rid) == some_events()
    assert ledger.events(rid, kind="note") == [some_events()[2]]
    assert ledger.metrics(rid) == some_metrics()
    assert ledger.metrics(rid, key="lr") == [some_metrics()[2]]


def test_non_finite_values(ledger: Ledger) -> None:
    rid = run_id(1)
    ledger.create_run(minimal_run(rid))
    nan_reading = minimal_gpu("GPU-a", 0)
    nan_reading.power_max_w = float("nan")  # a NaN reading is no reading
    ledger.append(
        rid,
        [nan_reading],
        events=[Event(T0, "nan_loss", payload={"loss": float("nan"), "grad": float("inf")})],
        metrics=[Metric(T0, "loss", float("nan")), Metric(T0, "grad", float("inf"))],
    )
    assert ledger.gpu_intervals(rid)[0].power_max_w is None
    assert ledger.events(rid)[0].payload == {"loss": "NaN", "grad": "Infinity"}
    loss, grad = ledger.metrics(rid)
    assert math.isnan(loss.value) and grad.value == float("inf")


def test_logs(ledger: Ledger) -> None:
    rid = run_id(1)
    ledger.create_run(minimal_run(rid))
    assert ledger.get_log(rid) is None and ledger.log_info(rid) is None
    data = bytes(range(256)) * 4096  # 1 MiB with NULs and invalid UTF-8
    ledger.set_log(rid, data)
    assert ledger.get_log(rid) == data
    assert ledger.log_info(rid) == {
        "sha256": hashlib.sha256(data).hexdigest(),
        "size_b": len(data),
        "truncated": False,
    }
    ledger.set_log(rid, b"tail only", truncated=True)
    assert ledger.get_log(rid) == b"tail only"
    assert ledger.log_info(rid)["truncated"] is True  # type: ignore[index]
    with pytest.raises(RunNotFound):
        ledger.set_log(run_id(9), b"x")


# -- idempotency and atomicity -----------------------------------------------------------------


def test_append_is_idempotent(ledger: Ledger) -> None:
    rid = run_id(1)
    ledger.create_run(minimal_run(rid))
    batch = ([full_gpu("GPU-a", 0), full_gpu("GPU-b", 0)], [full_host(0)], some_events(), some_metrics())
    for _ in range(3):
        ledger.append(rid, *batch)
    assert len(ledger.gpu_intervals(rid)) == 2 and len(ledger.host_intervals(rid)) == 1
    assert ledger.events(rid) == some_events() and ledger.metrics(rid) == some_metrics()
    # A later batch is numbered after the stored ones, and a replay of it is skipped too.
    later = [Event(T0 + 10, "epoch_end", "epoch 2")]
    ledger.append(rid, events=later)
    ledger.append(rid, events=some_events() + later)
    assert ledger.events(rid) == some_events() + later


def test_append_with_caller_numbering(ledger: Ledger) -> None:
    rid = run_id(1)
    ledger.create_run(minimal_run(rid))
    first, second = some_events()[:2], some_events()[2:]
    ledger.append(rid, events=first, event_seq=0)
    ledger.append(rid, events=second, event_seq=2)
    ledger.append(rid, events=second, event_seq=2)  # resent after a lost reply
    # Two identical events at the same time are kept apart when the caller numbers them.
    same = [Event(T0 + 5, "note", "tick"), Event(T0 + 5, "note", "tick")]
    ledger.append(rid, events=same, event_seq=3)
    assert ledger.events(rid) == some_events() + same
    ledger.append(rid, metrics=some_metrics(), metric_seq=0)
    ledger.append(rid, metrics=some_metrics(), metric_seq=0)
    assert ledger.metrics(rid) == some_metrics()


def test_append_is_one_transaction(ledger: Ledger) -> None:
    rid = run_id(1)
    ledger.create_run(minimal_run(rid))
    bad = Metric(T0, "loss", None)  # type: ignore[arg-type]  # NOT NULL: fails the whole batch
    with pytest.raises(Exception):  # noqa: B017 - the driver's IntegrityError
        ledger.append(rid, [full_gpu("GPU-a", 0)], [full_host(0)], some_events(), [bad])
    assert ledger.gpu_intervals(rid) == [] and ledger.host_intervals(rid) == []
    assert ledger.events(rid) == []
    ledger.append(rid, [full_gpu("GPU-a", 0)])  # the ledger is still usable
    assert len(ledger.gpu_intervals(rid)) == 1


def test_writes_to_unknown_run(ledger: Ledger) -> None:
    with pytest.raises(RunNotFound):
        ledger.append(run_id(9), [full_gpu("GPU-a", 0)])
    with pytest.raises(RunNotFound):
        ledger.add_devices(run_id(9), [full_device()])
    with pytest.raises(RunNotFound):
        ledger.update_run(run_id(9), status="lost")
    with pytest.raises(RunNotFound):
        ledger.delete_run(run_id(9))
    with pytest.raises(RunNotFound):
        ledger.get_run(run_id(9))


def test_append_to_a_run_deleted_by_another_process_is_refused(ledger: Ledger, ledger_url: str) -> None:
    run = minimal_run(run_id(1))
    ledger.create_run(run)
    ledger.append(run.id, [full_gpu("GPU-a", 0)])  # the run is now known: appends skip the look-up
    with Ledger(ledger_url) as other:
        other.delete_run(run.id)
    with pytest.raises(RunNotFound):
        ledger.append(run.id, [full_gpu("GPU-a", 1)])  # the foreign key still guards it


# -- updates and deletes -----------------------------------------------------------------------


def test_update_run(ledger: Ledger) -> None:
    rid = run_id(1)
    ledger.create_run(minimal_run(rid, labels={"project": "old", "team": "t1"}))
    ledger.update_run(
        rid,
        status="succeeded",
        ended_at=T0 + 60,
        exit_code=0,
        labels={"project": "new", "k": "v"},
        gpu_note="no GPU",
        name="renamed",
        attempt_of=run_id(7),
    )
    run = ledger.get_run(rid)
    assert (run.status, run.ended_at, run.exit_code, run.name) == ("succeeded", T0 + 60, 0, "renamed")
    assert run.labels == {"project": "new", "k": "v"} and run.attempt_of == run_id(7)
    assert ledger.list_runs(project="old") == [] and ledger.list_runs(team="t1") == []
    assert [r.id for r in ledger.list_runs(project="new", labels={"k": "v"})] == [rid]
    ledger.update_run(rid, exit_code=None, gpu_note=None)  # back to absent
    assert ledger.get_run(rid).exit_code is None and ledger.get_run(rid).gpu_note is None
    with pytest.raises(ValueError, match="colour"):
        ledger.update_run(rid, colour="red")
    with pytest.raises(ValueError, match="id"):
        ledger.update_run(rid, id=run_id(2))
    with pytest.raises(ValueError, match="status"):
        ledger.update_run(rid, status="exploded")


def test_delete_run(ledger: Ledger) -> None:
    keep, drop = run_id(1), run_id(2)
    for rid in (keep, drop):
        ledger.create_run(full_run(rid))
        ledger.add_devices(rid, [full_device()])
        ledger.append(rid, [full_gpu("GPU-a", 0)], [full_host(0)], some_events(), some_metrics())
        ledger.set_log(rid, b"log")
    ledger.delete_run(drop)
    with pytest.raises(RunNotFound):
        ledger.get_run(drop)
    assert ledger.gpu_intervals(drop) == [] and ledger.events(drop) == [] and ledger.get_log(drop) is None
    assert ledger.devices(drop) == [] and ledger.list_runs(labels={"model": "yolov8n"})[0].id == keep
    assert len(ledger.gpu_intervals(keep)) == 1 and ledger.get_log(keep) == b"log"


# -- resolve and list --------------------------------------------------------------------------


def test_resolve(ledger: Ledger) -> None:
    a, b, c = run_id(1, "0190aaaa"), run_id(2, "0190aaaa"), run_id(3, "0190bbbb")
    for rid in (a, b, c):
        ledger.create_run(minimal_run(rid))
    assert ledger.resolve(a) == a
    assert ledger.resolve(" 0190bb ") == c
    assert ledger.resolve("0190aaaa-0002") == b
    with pytest.raises(AmbiguousRun) as amb:
        ledger.resolve("0190a")
    assert sorted(amb.value.candidates) == [a, b] and a in str(amb.value)
    with pytest.raises(RunNotFound):
        ledger.resolve("0190cccc")
    with pytest.raises(RunNotFound, match="at least 4"):
        ledger.resolve("019")
    with pytest.raises(RunNotFound):
        ledger.resolve("0190%")  # LIKE wildcards are literal


def test_list_runs_filters(ledger: Ledger) -> None:
    specs = [  # (n, started offset, project, team, user, status, extra labels)
        (1, 0, "vision", "perception", "ana", "succeeded", {"model": "yolov8n"}),
        (2, 10, "vision", "perception", "bo", "failed", {"model": "yolov8s"}),
        (3, 20, "nlp", "language", "ana", "running", {"model": "yolov8n"}),
        (4, 30, None, None, "cy", "lost", {}),
    ]
    for n, dt, project, team, user, status, extra in specs:
        labels = {**({"project": project} if project else {}), **({"team": team} if team else {}), **extra}
        ledger.create_run(minimal_run(run_id(n), T0 + dt, user=user, status=status, labels=labels))

    def ids(**kw: object) -> list[int]:
        return [int(r.id[-12:], 16) for r in ledger.list_runs(**kw)]  # type: ignore[arg-type]

    assert ids() == [4, 3, 2, 1]  # newest first
    assert ids(project="vision") == [2, 1]
    assert ids(team="language") == [3]
    assert ids(user="ana") == [3, 1]
    assert ids(status="lost") == [4]
    assert ids(since=T0 + 10) == [4, 3, 2]
    assert ids(labels={"model": "yolov8n"}) == [3, 1]
    assert ids(labels={"model": "yolov8n", "project": "vision"}) == [1]
    assert ids(labels={"model": "nope"}) == []
    assert ids(project="vision", user="bo", status="failed") == [2]
    assert ids(limit=2) == [4, 3]


# -- totals ------------------------------------------------------------------------------------


def test_totals_are_sums(ledger: Ledger) -> None:
    rid = run_id(1)
    ledger.create_run(minimal_run(rid))
    assert ledger.gpu_totals(rid) == {} and ledger.last_flush_t(rid) is None
    empty = ledger.host_totals(rid)
    assert empty["count"] == 0 and empty["cpu_s"] is None and empty["read_b"] is None
    gpu = [full_gpu("GPU-a", i) for i in range(3)] + [minimal_gpu("GPU-b", 0)]
    host = [full_host(0), full_host(1), minimal_host(2)]
    ledger.append(rid, gpu, host)
    totals = ledger.gpu_totals(rid)
    a, b = totals["GPU-a"], totals["GPU-b"]
    assert a["count"] == 3 and a["samples"] == 18 and a["busy_count"] == 3
    assert a["busy_s"] == pytest.approx(3 * 0.781) and a["energy_j"] == pytest.approx(3 * 312.5)
    assert (a["t0"], a["t1"]) == (T0, T0 + 3)
    assert a["mem_used_max_b"] == 60_000_000_002 and a["power_max_w"] == 351.25 and a["temp_max_c"] == 71.0
    assert b["count"] == 1 and b["busy_s"] is None and b["energy_j"] is None and b["energy_count"] == 0
    assert b["power_max_w"] is None and b["mem_used_max_b"] is None
    h = ledger.host_totals(rid)
    assert h["count"] == 3 and h["cpu_s"] == pytest.approx(7.0) and h["read_b"] == 10_000_000_000
    assert isinstance(h["read_b"], int) and isinstance(a["samples"], int)
    assert h["rss_max_b"] == 12_000_000_000 and h["net_rx_b"] == 6_000 and h["iowait_s"] == pytest.approx(0.04)
    assert h["sys_cpu_util_avg_pct"] == pytest.approx(55.5)  # the minimal interval did not measure it
    assert (h["t0"], h["t1"]) == (T0, T0 + 3)
    assert ledger.last_flush_t(rid) == T0 + 3
