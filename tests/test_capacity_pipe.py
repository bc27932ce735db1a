"""Piped (or ``-o FILE``) ``report capacity`` and ``report fleet``: columns aligned up to 40
characters, so one 10 kB host or pool name pushes its own line only, every value still whole."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from cost_support import ts
from gpuledger.cli.main import cli
from gpuledger.core.capacity.model import DAY_MS, CapacityInterval, Sighting, States
from gpuledger.store import Ledger
from gpuledger.store.capacity import write_capacity

LONG = "h" * 10_000
MARCH = ts("2026-03-01")


def _run(args: list[str]) -> str:
    result = CliRunner().invoke(cli, args, catch_exceptions=False)  # stdout is not a terminal: piped
    assert result.exit_code == 0, result.output
    return result.output


@pytest.fixture
def long_host_db(tmp_path: Path) -> str:
    """A day of March on two hosts: one with a 10 kB name, one with a short one."""
    url = f"sqlite:///{tmp_path}/l.db"
    a = int(MARCH * 1000)
    ivs = [
        CapacityInterval("GPU-long", LONG, a, a + DAY_MS, States(DAY_MS, 0, 0, 0)),
        CapacityInterval("GPU-short", "gpu-2", a, a + DAY_MS, States(DAY_MS, 0, 0, 0)),
    ]
    sights = [
        Sighting("GPU-long", "NVIDIA H100 80GB HBM3", LONG, MARCH, MARCH + 86400),
        Sighting("GPU-short", "NVIDIA H100 80GB HBM3", "gpu-2", MARCH, MARCH + 86400),
    ]
    with Ledger(url) as led:
        led.write(lambda c: write_capacity(led.database, c, ivs, sights))
    return url


def _check(text: str, short_row: str) -> None:
    lines = text.splitlines()
    (long_line,) = [line for line in lines if LONG in line]  # the name whole, on its own row
    others = [line for line in lines if LONG not in line]
    assert max(map(len, others)) < 400, max(map(len, others))  # not padded to 10 kB
    assert len(long_line) < len(LONG) + 400  # and the long row itself carries no extra padding
    (short,) = [line for line in others if short_row in line.split()]
    assert short.split()[1:] == long_line.split()[1:]  # the same figures, whole, on both rows


def test_capacity_by_host_and_by_pool_are_not_padded_to_a_10kb_name(long_host_db: str, tmp_path: Path) -> None:
    base = ["report", "capacity", "--db", long_host_db, "--month", "2026-03"]
    _check(_run(base), "gpu-2")
    out = tmp_path / "capacity.txt"
    _run([*base, "-o", str(out)])
    _check(out.read_text(), "gpu-2")
    pools = tmp_path / "pools.toml"
    pools.write_text(f'[[pool]]\nname = "{LONG}"\nhosts = ["{LONG}"]\n\n[[pool]]\nname = "small"\nhosts = ["gpu-2"]\n')
    _check(_run([*base, "--by", "pool", "--pools", str(pools)]), "small")


def test_the_fleet_is_not_padded_to_a_10kb_host_name(long_host_db: str) -> None:
    lines = _run(["report", "fleet", "--db", long_host_db]).splitlines()
    (long_line,) = [line for line in lines if LONG in line]
    assert long_line.split()[0] == "GPU-long" and max(len(x) for x in lines if LONG not in x) < 400
