"""Property: the ledger's SQL totals equal Python sums over the same random intervals."""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuledger.core.model import GpuInterval, HostInterval
from gpuledger.store import Ledger
from test_store_records import minimal_run

seconds = st.floats(min_value=0, max_value=1e5, allow_nan=False, allow_infinity=False)
maybe_seconds = st.none() | seconds
maybe_bytes = st.none() | st.integers(min_value=0, max_value=2**40)
pct = st.none() | st.floats(min_value=0, max_value=100, allow_nan=False)


@st.composite
def gpu_batches(draw: st.DrawFn) -> list[GpuInterval]:
    out = []
    for uuid_ in draw(st.lists(st.sampled_from(["GPU-a", "GPU-b", "GPU-c"]), min_size=1, max_size=3, unique=True)):
        for seq in range(draw(st.integers(1, 8))):
            t0 = draw(st.floats(min_value=1e9, max_value=2e9, allow_nan=False))
            out.append(
                GpuInterval(
                    device_uuid=uuid_,
                    seq=seq,
                    t0=t0,
                    t1=t0 + draw(seconds),
                    samples=draw(st.integers(0, 1000)),
                    busy_s=draw(maybe_seconds),
                    energy_j=draw(maybe_seconds),
                    power_max_w=draw(maybe_seconds),
                    mem_used_max_b=draw(maybe_bytes),
                    proc_mem_max_b=draw(maybe_bytes),
                    temp_max_c=draw(pct),
                )
            )
    return out


@st.composite
def host_batches(draw: st.DrawFn) -> list[HostInterval]:
    out = []
    for seq in range(draw(st.integers(0, 8))):
        t0 = 1e9 + seq * 10
        out.append(
            HostInterval(
                seq=seq,
                t0=t0,
                t1=t0 + draw(st.floats(min_value=0.1, max_value=10)),
                samples=draw(st.integers(0, 100)),
                cpu_s=draw(seconds),
                rss_max_b=draw(st.integers(0, 2**40)),
                read_b=draw(st.integers(0, 2**40)),
                write_b=draw(st.integers(0, 2**40)),
                sys_cpu_util_avg_pct=draw(pct),
                iowait_s=draw(maybe_seconds),
                net_rx_b=draw(maybe_bytes),
            )
        )
    return out


def _sum(values: list[Any]) -> Any:
    known = [v for v in values if v is not None]
    return None if not known else (sum(known) if all(isinstance(v, int) for v in known) else math.fsum(known))


def _max(values: list[Any]) -> Any:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def _close(got: Any, want: Any) -> bool:
    if want is None or got is None:
        return got is want
    return math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-6)


@pytest.fixture
def ledger(ledger_url: str) -> Iterator[Ledger]:
    with Ledger(ledger_url) as led:
        yield led


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(gpu=gpu_batches(), host=host_batches())
def test_totals_equal_python_sums(ledger: Ledger, gpu: list[GpuInterval], host: list[HostInterval]) -> None:
    rid = str(uuid.uuid4())  # a new run per example: the ledger fixture is shared by all examples
    ledger.create_run(minimal_run(rid))
    ledger.append(rid, gpu, host)
    totals = ledger.gpu_totals(rid)
    assert set(totals) == {g.device_uuid for g in gpu}
    for uuid_, got in totals.items():
        mine = [g for g in gpu if g.device_uuid == uuid_]
        assert got["count"] == len(mine) and got["samples"] == sum(g.samples for g in mine)
        assert got["t0"] == min(g.t0 for g in mine) and got["t1"] == max(g.t1 for g in mine)
        for key in ("busy_s", "energy_j"):
            assert _close(got[key], _sum([getattr(g, key) for g in mine])), key
        for key in ("power_max_w", "mem_used_max_b", "proc_mem_max_b", "temp_max_c"):
            assert got[key] == _max([getattr(g, key) for g in mine]), key
    h = ledger.host_totals(rid)
    assert h["count"] == len(host)
    for key in ("cpu_s", "read_b", "write_b", "iowait_s", "net_rx_b"):
        assert _close(h[key], _sum([getattr(i, key) for i in host])), key
    assert h["rss_max_b"] == _max([i.rss_max_b for i in host])
    weighted = [(i.sys_cpu_util_avg_pct, i.t1 - i.t0) for i in host if i.sys_cpu_util_avg_pct is not None]
    want = math.fsum(u * d for u, d in weighted) / math.fsum(d for _, d in weighted) if weighted else None
    assert _close(h["sys_cpu_util_avg_pct"], want)
    assert ledger.last_flush_t(rid) == _max([g.t1 for g in gpu] + [i.t1 for i in host])
