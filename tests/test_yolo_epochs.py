"""Per-epoch resource accounting (core/training/epochs.py): spans from boundary events, sums that add up."""

from __future__ import annotations

import itertools
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuledger.core.model import Event, GpuInterval, HostInterval
from gpuledger.core.training.epochs import AFTER, BETWEEN, EPOCH, SETUP, account, merge_phases, spans, totals


def ev(t: float, kind: str, **payload: object) -> Event:
    return Event(t=t, kind=kind, message=kind, payload=payload)


def host(seq: int, t0: float, t1: float, cpu: float, rss: int = 100) -> HostInterval:
    return HostInterval(seq=seq, t0=t0, t1=t1, samples=1, cpu_s=cpu, rss_max_b=rss)


def gpu(seq: int, t0: float, t1: float, busy: float | None, energy: float | None, mem: int = 10) -> GpuInterval:
    return GpuInterval(device_uuid="GPU-a", seq=seq, t0=t0, t1=t1, busy_s=busy, energy_j=energy, mem_used_max_b=mem)


YOLO_EVENTS = [
    ev(10.0, "epoch_start", epoch=1),
    ev(20.0, "epoch_end", epoch=1, images=80, train_s=8.0),
    ev(20.0001, "epoch_start", epoch=2),
    ev(30.0, "epoch_end", epoch=2, images=80, train_s=5.0),
    ev(31.0, "phase", name="final validation"),
    ev(33.0, "phase", name="after training"),
]


def test_spans_of_a_yolo_training() -> None:
    found = spans(YOLO_EVENTS, 0.0, 35.0)
    assert [(s.phase, s.epoch, s.t0, s.t1) for s in found] == [
        (SETUP, None, 0.0, 10.0),
        (EPOCH, 1, 10.0, 20.0),
        (BETWEEN, None, 20.0, 20.0001),
        (EPOCH, 2, 20.0001, 30.0),
        ("final validation", None, 30.0, 31.0),  # saving weights before it counts as part of it
        ("final validation", None, 31.0, 33.0),
        ("after training", None, 33.0, 35.0),
    ]


def test_intervals_cut_at_the_boundaries_split_exactly() -> None:
    hosts = [host(0, 0, 10, 1.0), host(1, 10, 20, 4.0), host(2, 20.0001, 30, 3.0), host(3, 30, 35, 2.0)]
    gpus = [gpu(0, 0, 10, 0.5, 100.0), gpu(1, 10, 20, 9.0, 2000.0, mem=70), gpu(2, 20.0001, 35, 8.0, 1500.0)]
    usage = account(YOLO_EVENTS, gpus, hosts, 0.0, 35.0)
    rows = merge_phases(usage)
    by = {(r.phase, r.epoch): r for r in rows}
    e1, e2 = by[(EPOCH, 1)], by[(EPOCH, 2)]
    assert e1.exact and e1.cpu_s == 4.0 and e1.gpu_busy_s == 9.0 and e1.gpu_energy_j == 2000.0
    assert e1.gpu_mem_peak_b == 70
    assert e1.images == 80 and e1.train_s == 8.0 and e1.images_per_s == 10.0 and e1.wall_s == 10.0
    assert not e2.exact  # the last GPU interval runs on into the final validation
    assert math.isclose(e2.cpu_s, 3.0)
    total = totals(usage)
    assert math.isclose(total.cpu_s, 10.0) and math.isclose(total.gpu_busy_s, 17.5)
    assert math.isclose(total.gpu_energy_j, 3600.0) and math.isclose(total.wall_s, 35.0)
    assert [r.phase for r in rows] == [SETUP, EPOCH, EPOCH, BETWEEN, "final validation", "after training"]


def test_a_boundary_inside_an_interval_shares_it_by_time() -> None:
    usage = account(
        [ev(5.0, "epoch_start", epoch=1), ev(8.0, "epoch_end", epoch=1)], [], [host(0, 0, 10, 10.0)], 0.0, 10.0
    )
    cpu = {(u.phase, u.epoch): u.cpu_s for u in usage}
    assert cpu == {(SETUP, None): 5.0, (EPOCH, 1): 3.0, (AFTER, None): 2.0}
    assert not any(u.exact for u in usage)


def test_a_boundary_a_few_ms_off_the_interval_edge_is_the_edge() -> None:
    # the recorder cuts, then writes the event a moment later
    usage = account(
        [ev(5.002, "epoch_start", epoch=1), ev(9.001, "epoch_end", epoch=1)],
        [],
        [host(0, 0, 5, 1.0), host(1, 5, 9, 2.0), host(2, 9, 10, 3.0)],
        0.0,
        10.0,
    )
    assert [(u.phase, u.cpu_s, u.exact) for u in usage] == [(SETUP, 1.0, True), (EPOCH, 2.0, True), (AFTER, 3.0, True)]


def test_absent_gpu_figures_stay_absent() -> None:
    usage = account(YOLO_EVENTS, [gpu(0, 0, 35, None, None)], [host(0, 0, 35, 1.0)], 0.0, 35.0)
    assert all(u.gpu_busy_s is None and u.gpu_energy_j is None for u in usage)
    assert totals(usage).gpu_busy_s is None


def test_a_restarted_epoch_is_one_epoch_and_an_end_without_start_still_counts() -> None:
    events = [
        ev(1, "epoch_start", epoch=1),
        ev(2, "epoch_start", epoch=1),
        ev(3, "epoch_end", epoch=1),
        ev(5, "epoch_end", epoch=2),
    ]
    found = spans(events, 0.0, 6.0)
    assert [(s.phase, s.epoch, s.t0, s.t1) for s in found] == [
        (SETUP, None, 0.0, 1.0),
        (EPOCH, 1, 1.0, 3.0),
        (EPOCH, 2, 3.0, 5.0),
        (AFTER, None, 5.0, 6.0),
    ]


times = st.lists(st.floats(min_value=0.0, max_value=100.0, allow_nan=False), min_size=1, max_size=12)


@settings(max_examples=200, deadline=None)
@given(
    cuts=times,
    bounds=times,
    cpu=st.lists(st.floats(0, 50), min_size=12, max_size=12),
    busy=st.lists(st.one_of(st.none(), st.floats(0, 50)), min_size=12, max_size=12),
)
def test_spans_always_add_up_to_the_run_totals(
    cuts: list[float], bounds: list[float], cpu: list[float], busy: list[float | None]
) -> None:
    edges = sorted({0.0, 100.0, *cuts})
    hosts = [host(i, a, b, cpu[i % 12]) for i, (a, b) in enumerate(itertools.pairwise(edges))]
    gpus = [gpu(i, a, b, busy[i % 12], busy[i % 12]) for i, (a, b) in enumerate(itertools.pairwise(edges))]
    events = []
    for i, t in enumerate(sorted(bounds)):
        kind = ("epoch_start", "epoch_end", "phase")[i % 3]
        events.append(ev(t, kind, epoch=i // 3 + 1, name="final validation"))
    usage = account(events, gpus, hosts, 0.0, 100.0)
    total = totals(usage)
    assert math.isclose(total.cpu_s or 0.0, sum(h.cpu_s for h in hosts), rel_tol=1e-9, abs_tol=1e-9)
    present = [g.busy_s for g in gpus if g.busy_s is not None]
    if present:
        assert math.isclose(total.gpu_busy_s, sum(present), rel_tol=1e-9, abs_tol=1e-9)
    else:
        assert total.gpu_busy_s is None
    assert math.isclose(total.wall_s, 100.0)
    merged = totals(merge_phases(usage))
    assert math.isclose(merged.cpu_s or 0.0, total.cpu_s or 0.0, rel_tol=1e-9, abs_tol=1e-9)
