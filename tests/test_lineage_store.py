"""run_lineage on SQLite and PostgreSQL: kept in step with runs.meta by every write path (a local
ledger, update_run, a push to the team server), parents found whatever order runs arrive in, and
filled for runs stored before migration 17 (issue 37)."""

from __future__ import annotations

import json
import time

import sqlalchemy as sa
from click.testing import CliRunner
from fastapi.testclient import TestClient

from gpuledger.cli.main import cli
from gpuledger.core.model import RunRecord
from gpuledger.server.app import create_app
from gpuledger.store import Ledger
from gpuledger.store import lineage as store_lineage
from server_support import bearer, gpu_rows, run_doc, setup_accounts

W1, W2, W3 = ("1" * 64, "2" * 64, "3" * 64)  # best.pt of v1, v2, v3
IDS = {v: f"0190c0c0-0000-7000-8000-00000000010{i}" for i, v in enumerate(("v1", "v2", "v3", "ev"), 1)}
T = time.time() - 10 * 3600


def lineage(version: str, produced: str, source: str | None) -> dict:
    return {
        "framework": "ultralytics",
        "lineage": {
            "model_line": "yolov8n" if source is None else None,  # a fine-tune does not know its line
            "model_version": version,
            "weights_sha256": produced,
            "source_weights": None if source is None else {"path": "/runs/best.pt", "sha256": source},
            "parent_run": None,  # as pushed by an agent that could not look it up
        },
    }


METAS = {"v1": lineage("v1", W1, None), "v2": lineage("v2", W2, W1), "v3": lineage("v3", W3, W2)}
STARTS = {"v1": T, "v2": T + 3600, "v3": T + 7200, "ev": T + 8000}
EVAL_META = {"kind": "evaluation", "evaluation": {"mode": "val", "weights": {"path": "/x/best.pt", "sha256": W2}}}


def _run(name: str, meta: dict) -> RunRecord:
    return RunRecord(id=IDS[name], command=["yolo"], user="u", host="h", cwd="/", started_at=STARTS[name], meta=meta)


def _rows(url: str) -> dict[str, dict]:
    with Ledger(url) as led:
        rows = led.read(lambda c: c.execute(sa.select(sa.text("* FROM run_lineage"))).mappings().all())
    return {r["run_id"]: dict(r) for r in rows}


def _check_chain(url: str) -> None:
    rows = _rows(url)
    assert rows[IDS["v1"]]["parent_run"] is None
    assert rows[IDS["v2"]]["parent_run"] == IDS["v1"] and rows[IDS["v3"]]["parent_run"] == IDS["v2"]
    assert {r["model_line"] for r in rows.values() if r["kind"] == "training"} == {"yolov8n"}


def test_parents_are_found_whatever_order_runs_are_written_in(ledger_url: str) -> None:
    with Ledger(ledger_url) as led:
        for name in ("v3", "v1", "v2"):  # a child before its parent
            led.create_run(_run(name, METAS[name]))
        led.create_run(_run("ev", {}))
        led.update_run(IDS["ev"], meta=EVAL_META)  # meta written at the end of the run
    _check_chain(ledger_url)
    assert _rows(ledger_url)[IDS["ev"]]["weights_sha256"] == W2
    out = CliRunner().invoke(cli, ["lineage", "v3", "--json", "--db", ledger_url])
    assert out.exit_code == 0, out.output
    model = json.loads(out.stdout)
    assert [v["model_version"] for v in model["versions"]] == ["v1", "v2", "v3"]
    assert [e["run_id"] for e in model["versions"][1]["evaluations"]] == [IDS["ev"]]
    with Ledger(ledger_url) as led:
        led.delete_run(IDS["ev"])
        assert led.read(lambda c: store_lineage.evaluations(c, W2)) == []


def test_runs_pushed_to_the_server_carry_their_lineage(ledger_url: str) -> None:
    tokens = setup_accounts(ledger_url)
    with TestClient(create_app(ledger_url)) as client:
        for name, meta in (("v2", {}), ("v3", METAS["v3"]), ("v1", METAS["v1"]), ("v2", METAS["v2"])):
            doc = run_doc(IDS[name], started_at=STARTS[name], meta=meta)  # v2's meta comes with a later push
            body = {"run": doc, "gpu_intervals": gpu_rows(2, start=STARTS[name])}
            got = client.post("/api/v1/ingest", json=body, headers=bearer(tokens.agent_a))
            assert got.status_code == 200, got.text
    _check_chain(ledger_url)


def test_migration_17_fills_the_table_from_stored_runs(ledger_url: str) -> None:
    with Ledger(ledger_url) as led:
        for name in ("v1", "v2", "v3"):
            led.create_run(_run(name, METAS[name]))
        led.write(lambda c: c.execute(sa.text("DROP TABLE run_lineage")))
        led.write(lambda c: c.execute(sa.text("DELETE FROM schema_version WHERE version >= 17")))
    with Ledger(ledger_url) as led:  # migrates
        assert led.read(lambda c: c.scalar(sa.text("SELECT max(version) FROM schema_version"))) >= 17
    _check_chain(ledger_url)
