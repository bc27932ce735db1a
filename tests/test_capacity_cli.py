"""``gpuledger report capacity``, ``report fleet`` and ``report chargeback --share-idle`` as a user runs
them: every format, the rule written on the report, a wrapped-only ledger derived from its runs, and
one clear error line (never a traceback) for each mistake."""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from cost_support import ts
from gpuledger.cli.main import cli
from gpuledger.core.capacity.columns import COLUMNS
from gpuledger.core.capacity.model import DAY_MS, CapacityInterval, Sighting, States
from gpuledger.core.model import GpuIdentity, GpuInterval, RunRecord
from gpuledger.store import Ledger
from gpuledger.store.capacity import write_capacity
from gpuledger.store.capacity_queries import unmetered_devices

H = 3600.0
MARCH = ts("2026-03-01")


def _run(args: list[str], code: int = 0) -> str:
    result = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert result.exit_code == code, result.output
    return result.output


@pytest.fixture
def agent_db(tmp_path: Path) -> str:
    """Two H100s on one host for March: one busy half the time, one never used."""
    url = f"sqlite:///{tmp_path}/l.db"
    t0 = int(MARCH * 1000)
    ivs = []
    for d in range(31):
        a = t0 + d * DAY_MS
        ivs.append(CapacityInterval("GPU-busy", "gpu-1", a, a + DAY_MS, States(0, DAY_MS // 2, DAY_MS // 2, 0)))
        ivs.append(CapacityInterval("GPU-free", "gpu-1", a, a + DAY_MS, States(DAY_MS, 0, 0, 0)))
    sights = [
        Sighting(u, "NVIDIA H100 80GB HBM3", "gpu-1", MARCH, MARCH + 31 * 86400) for u in ("GPU-busy", "GPU-free")
    ]
    with Ledger(url) as led:
        led.write(lambda c: write_capacity(led.database, c, ivs, sights))
    return url


def test_every_format_says_the_same_and_names_the_rule(agent_db: str) -> None:
    base = ["report", "capacity", "--db", agent_db, "--month", "2026-03"]
    data = json.loads(_run([*base, "--json"]))
    assert data["total"]["fleet_gpu_h"] == 2 * 31 * 24 and data["total"]["busy_share"] == 0.25
    assert data["total"]["asset_cost"] == "10237.44"  # 1,488 GPU-h at the example card's 6.88 (H100)
    assert data["share_idle"] == "none" and data["month"] == "2026-03"
    table = _run(base)
    assert "Idle cost rule: none" in table and "10,237.44" in table
    rows = list(csv.DictReader(io.StringIO(_run([*base, "--format", "csv"]))))
    assert list(rows[0]) == ["host", *(c.name for c in COLUMNS["groups"])]
    assert rows[-1]["host"] == "TOTAL" and rows[-1]["unallocated_gpu_h"] == "744.0"
    md = _run([*base, "--format", "md", "--share-idle", "busy"])
    assert "**Idle cost rule: busy — shared in proportion to each team's busy GPU-hours**" in md
    html = _run([*base, "--format", "html"])
    embedded = re.search(r'<script type="application/json" id="capacity-data">(.*?)</script>', html, re.S)
    assert embedded and json.loads(embedded.group(1))["total"] == data["total"]
    assert "<svg" in html and not re.search(r'(src|href)="https?:', html)  # one offline file


def test_by_gpu_model_and_by_gpu(agent_db: str) -> None:
    data = json.loads(_run(["report", "capacity", "--db", agent_db, "--month", "2026-03", "--by", "gpu_model,gpu",
                            "--json"]))  # fmt: skip
    assert [(g["gpu_model"], g["gpu"]) for g in data["groups"]] == [("H100-SXM", "GPU-busy"), ("H100-SXM", "GPU-free")]


def test_the_fleet_lists_each_gpu(agent_db: str) -> None:
    out = _run(["report", "fleet", "--db", agent_db])
    assert "Fleet: 2 GPUs" in out and "GPU-free" in out and "H100-SXM" in out
    data = json.loads(_run(["report", "fleet", "--db", agent_db, "--json"]))
    assert {g["gpu"] for g in data["gpus"]} == {"GPU-busy", "GPU-free"}
    rows = list(csv.DictReader(io.StringIO(_run(["report", "fleet", "--db", agent_db, "--format", "csv"]))))
    assert list(rows[0]) == [c.name for c in COLUMNS["fleet"]]


def test_a_wrapped_only_ledger_is_derived_from_its_runs_and_says_what_it_cannot_see(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/w.db"
    with Ledger(url) as led:
        for n, (start, hours) in enumerate(((ts("2026-03-02"), 10), (ts("2026-03-04"), 14))):
            run = RunRecord(id=f"r{n}", command=["x"], user="u", host="ws-1", cwd="/", started_at=start,
                            ended_at=start + hours * H, status="succeeded", labels={"team": "vision"})  # fmt: skip
            led.create_run(run)
            led.add_devices(run.id, [GpuIdentity(0, "GPU-ws", "Tesla T4")])
            led.append(run.id, [GpuInterval("GPU-ws", k, start + k * H, start + (k + 1) * H, busy_s=H / 2)
                                for k in range(hours)])  # fmt: skip
    data = json.loads(_run(["report", "capacity", "--db", url, "--month", "2026-03", "--json"]))
    total = data["total"]
    assert total["fleet_gpu_h"] == 24 + 24 + 14  # from the first run's start to the last run's end
    assert (total["busy_attributed_gpu_h"], total["alloc_idle_gpu_h"], total["unallocated_gpu_h"]) == (12, 12, 38)
    assert data["sources"] == {"gpus": 1, "agent_gpus": 0, "run_gpus": 1}
    assert any("derived from the runs" in w and "not seen" in w for w in data["warnings"])
    fleet = json.loads(_run(["report", "fleet", "--db", url, "--json"]))["gpus"]
    assert [(g["gpu"], g["source"], g["host"]) for g in fleet] == [("GPU-ws", "runs", "ws-1")]


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--by", "team"], 2, "use one or more of host, gpu_model, pool, gpu"),
        (["--from", "2026-03-01T06:00:00", "--to", "2026-03-02"], 2, "capacity is kept per UTC day"),
        (["--month", "2026-13"], 2, "write it as YYYY-MM"),
        (["--share-idle", "everyone"], 2, "'everyone' is not one of"),
        (["--format", "csv", "--section", "shares"], 2, "--section shares needs --share-idle"),
        (["--pools", "{missing}"], 1, "cannot read the pools file"),
        (["--pools", "{bad}"], 1, "bad.toml:3: [[pool]] #1 hosts: required"),
    ],
)
def test_mistakes_are_one_clear_error_line(agent_db: str, tmp_path: Path, args: list[str], code: int,
                                           message: str) -> None:  # fmt: skip
    bad = tmp_path / "bad.toml"
    bad.write_text('[[pool]]\nname = "a"\nhosts = []\n')
    args = [a.replace("{missing}", str(tmp_path / "none.toml")).replace("{bad}", str(bad)) for a in args]
    result = CliRunner().invoke(cli, ["report", "capacity", "--db", agent_db, *args])
    assert result.exit_code == code, result.output
    assert message in result.output and "Traceback" not in result.output


def test_chargeback_share_idle_refuses_what_it_cannot_share(agent_db: str) -> None:
    base = ["report", "chargeback", "--db", agent_db, "--share-idle", "busy"]
    result = CliRunner().invoke(cli, [*base, "--month", "2026-03", "--project", "x"])
    assert result.exit_code == 2 and "leave out --project" in result.output
    result = CliRunner().invoke(cli, [*base, "--from", "2026-03-01T12:00:00"])
    assert result.exit_code == 2 and "capacity is kept per UTC day" in result.output
    data = json.loads(_run([*base, "--month", "2026-03", "--json"]))  # no runs: nothing billed, nobody to share to
    assert data["total"]["cost_with_shared_idle"] == "0.00" and data["fleet_cost"] == "10237.44"
    assert any("not shared" in w for w in data["warnings"])


def test_only_gpus_no_agent_watches_are_derived_from_runs(tmp_path: Path) -> None:
    # A MIG slice of a GPU an agent watches is that GPU (counted once, by the agent); a GPU no
    # agent has seen is derived from the run on it, however many unknown GPUs there are.
    url = f"sqlite:///{tmp_path}/m.db"
    start = ts("2026-03-02")
    with Ledger(url) as led:
        sight = Sighting("GPU-watched", "NVIDIA A100-SXM4-80GB", "gpu-1", MARCH, MARCH + 31 * 86400)
        led.write(lambda c: write_capacity(led.database, c, [], [sight]))
        gpus = {
            "r-slice": [GpuIdentity(0, "MIG-1", "NVIDIA A100 MIG 1g.10gb", mig_parent_uuid="GPU-watched")],
            "r-unknown": [GpuIdentity(0, "GPU-unknown", "Tesla T4")],
            "r-many": [GpuIdentity(i, f"GPU-x{i:05d}", "Tesla T4") for i in range(2100)],
        }
        for rid, devices in gpus.items():
            led.create_run(RunRecord(id=rid, command=["x"], user="u", host="gpu-1", cwd="/", started_at=start,
                                     ended_at=start + H, status="succeeded"))  # fmt: skip
            led.add_devices(rid, devices)
        found = led.read(lambda c: unmetered_devices(c, MARCH, MARCH + 31 * 86400))
    assert {(run, gpu) for run, gpu, *_ in found} == {("r-unknown", "GPU-unknown")} | {
        ("r-many", f"GPU-x{i:05d}") for i in range(2100)
    }
