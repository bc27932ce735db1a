"""GPU identities and the cost code: a run of another host naming a GPU's UUID does not split that
GPU's bill; migration 7 gives the GPUs already stored to the host that used them last (SQLite and
PostgreSQL)."""

from __future__ import annotations

import sqlalchemy as sa

from cost_support import H, card, ts
from gpuledger.core.model import GpuIdentity, GpuInterval, RunRecord
from gpuledger.reports.cost.costing import run_costs
from gpuledger.store import Ledger, audit, migrations, ownership, schema, schema_audit, schema_ingest
from gpuledger.store.engine import Database

CARD = card(
    """
[[gpu]]
model = "A100-80GB-SXM"
price_per_hour = "3.43"
"""
)


def _run(led: Ledger, run_id: str, host: str, start: str, hours: float, uuid: str = "GPU-x", **dev: object) -> None:
    t0 = ts(start)
    led.create_run(RunRecord(run_id, ["train"], "ana", host, "/", t0, status="succeeded", ended_at=t0 + hours * H,
                             labels={"project": "p", "team": "t"}))  # fmt: skip
    led.add_devices(run_id, [GpuIdentity(0, uuid, "NVIDIA A100-SXM4-80GB", **dev)])  # type: ignore[arg-type]
    n = int(hours * 6)
    led.append(run_id, [GpuInterval(uuid, i, t0 + i * 600, t0 + (i + 1) * 600, 10, busy_s=540.0,
                                    proc_sm_util_avg_pct=50.0) for i in range(n)])  # fmt: skip


def _allocated(led: Ledger, run_id: str) -> float:
    return float(
        run_costs(led, [run_id], scope=None, card=CARD, basis="allocated")["runs"][0]["total"]["allocated_gpu_h"]
    )


def test_a_run_of_another_host_does_not_split_a_gpus_bill(ledger_url: str) -> None:
    with Ledger(ledger_url) as led:
        _run(led, "mine", "node-1", "2026-03-11T12:00", 2)
        _run(led, "intruder", "node-9", "2026-03-11T13:00", 2)  # claims the same GPU over the same hour
        assert _allocated(led, "mine") < 2.0  # a GPU with no known host: every run on it shares
        ownership.rehome(led, "GPU-x", "node-1", None, actor="admin")  # the GPU is node-1's
        assert abs(_allocated(led, "mine") - 2.0) < 1e-9  # billed whole: node-9's claim is ignored
        _run(led, "neighbour", "node-1", "2026-03-11T13:00", 2)  # a real co-tenant of its own host
        assert _allocated(led, "mine") < 2.0


def _back_to_version_6(url: str) -> None:
    """Undo migrations 7 and 8 on a current ledger."""
    db = Database(url)

    def tx(c: sa.Connection) -> None:
        for name in (*schema_audit.NAMES, *schema_ingest.NAMES):
            c.execute(sa.text(f"DROP TABLE {name}"))
        c.execute(sa.text("ALTER TABLE audit_log DROP COLUMN key_id"))
        c.execute(sa.text("ALTER TABLE audit_log DROP COLUMN sig"))
        c.execute(sa.delete(schema.schema_version).where(schema.schema_version.c.version >= 7))

    try:
        db.write(tx)
    finally:
        db.close()


def _columns(url: str) -> dict[str, list[str]]:
    db = Database(url)
    try:
        return db.read(lambda c: {t: sorted(col["name"] for col in sa.inspect(c).get_columns(t))
                                  for t in sa.inspect(c).get_table_names()})  # fmt: skip
    finally:
        db.close()


def test_migration_7_gives_stored_gpus_to_the_host_that_used_them_last(ledger_url: str) -> None:
    with Ledger(ledger_url) as led:
        _run(led, "old", "node-1", "2026-01-01T00:00", 1)
        _run(led, "moved", "node-2", "2026-02-01T00:00", 1)  # the GPU moved to node-2
        _run(led, "slice", "node-3", "2026-02-01T00:00", 1, uuid="MIG-a", mig_parent_uuid="GPU-m")
    fresh = _columns(ledger_url)
    _back_to_version_6(ledger_url)
    with Ledger(ledger_url) as led:
        assert led.schema_version() == migrations.LATEST
        owners = {r.uuid: (r.host, r.user_name, r.source) for r in led.read(lambda c: list(
            c.execute(sa.select(schema.gpu_owners))))}  # fmt: skip
        assert owners == {"GPU-x": ("node-2", None, "migration"), "MIG-a": ("node-3", None, "migration"),
                          "GPU-m": ("node-3", None, "migration")}  # fmt: skip
        led.write(lambda c: c.execute(sa.update(schema.gpu_owners).where(schema.gpu_owners.c.uuid == "GPU-x")
                                      .values(host="node-7")))  # fmt: skip
        ownership.rehome(led, "GPU-unused", "node-1", None, actor="admin")  # gives the ledger an audit trail
        problems = audit.verify(led).problems
    assert _columns(ledger_url) == fresh
    assert any("gpu GPU-x: owner host 'node-7' is not in the audit trail" in p for p in problems), problems
    assert not any("gpu MIG-a" in p or "gpu GPU-m" in p for p in problems)  # the migration's rows, as they were
