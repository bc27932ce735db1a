"""``gpuledger audit verify`` of a signed 1,000,000-row audit trail on PostgreSQL (issue 14).

    python benchmarks/audit_verify.py [--rows 1000000] [--runs 85000] [--keep] [--pg URL]

Builds a team ledger the way a server would have written it, then times ``audit.verify`` with the
public key, and, for comparison, a bare pass over the same rows (read and hash-check only) and
``--all-signatures`` on a sample:

- accounts through the real code (store/accounts.py): 20 projects, 200 users and memberships, an
  agent user and token per host (100 hosts of 8 GPUs), member tokens, a tenth of them revoked;
- ``--runs`` finished runs, each on one GPU of its host: a run row with labels, its device, 6 GPU
  and 6 host intervals, an event, a metric and a small log (bulk inserts), their owners and GPU
  owners, and the cost rollups written by the real ``materialise_rollups`` (audited);
- for each run, the rows a server writes over its life (gpu.registered for a GPU's first run,
  run.created, run.changed, run.ended, run.sealed, log.stored, run.resealed, run.rolled_up and
  run.resealed twice more, log.deleted, run.resealed: 12 rows), with the seal computed from the
  stored rows by the same code verify uses, hashed, chained and signed with a fresh Ed25519 key
  (what store/audit.append does), bulk-inserted; then token and rate-card rows up to ``--rows``;
- one last row appended through the real ``audit.append``, whose check of the head validates the
  generated chain's last signature.

The figure is the wall time of one ``verify`` call on the finished ledger (all runs sealed, every
table consistent, so it must answer OK), beside the time of the chain alone (read, hash, links) and
what ``--all-signatures`` would add. Building takes several minutes and is not timed.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import sys
import time
import uuid
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import psycopg
import sqlalchemy as sa
from _common import machine_line, source_state, version

from gpuledger.core.audit.chain import canonical_json, check_chain, row_hash
from gpuledger.core.audit.signing import Keyring, SigningKey
from gpuledger.core.model import Event, GpuIdentity, GpuInterval, HostInterval, Metric, RunRecord
from gpuledger.store import Ledger, accounts, audit, audit_seals, audit_sign, codec, schema

PG = os.environ.get("GPULEDGER_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
HOSTS, GPUS_PER_HOST = 100, 8
START = time.time() - 120 * 86400
ROWS_PER_RUN = 12


def _url(name: str) -> str:
    return PG.replace("postgresql://", "postgresql+psycopg://", 1) + f"?options=-csearch_path%3D{name}"


def _accounts(led: Ledger) -> dict[str, str]:
    """Projects, users, memberships, agent and member tokens; host -> its agent's token id."""
    for p in range(20):
        accounts.add_project(led, f"project-{p}", actor="admin")
    agents = {}
    for h in range(HOSTS):
        host = f"node-{h:03d}"
        agents[host] = accounts.issue_token(led, host, role="agent", projects=[f"project-{h % 20}"], actor="admin",
                                            create_user=True)[0]  # fmt: skip
    for u in range(200):
        accounts.add_user(led, f"user-{u}", actor="admin")
        accounts.add_member(led, f"user-{u}", f"project-{u % 20}", actor="admin")
        token = accounts.issue_token(led, f"user-{u}", role="member", actor="admin")[0]
        if u % 10 == 0:
            accounts.revoke_token(led, token, actor="admin")
    return agents


def _data(led: Ledger, runs: int) -> list[dict[str, Any]]:
    """Insert ``runs`` finished runs with their rows; returns per run what the audit rows need."""
    out, tables = [], {t.name: [] for t in (schema.runs, schema.run_labels, schema.devices, schema.gpu_intervals,
                                             schema.host_intervals, schema.events, schema.metrics, schema.logs,
                                             schema.run_owners)}  # fmt: skip
    for i in range(runs):
        run_id = str(uuid.UUID(int=i + 1))
        h, g = i % HOSTS, (i // HOSTS) % GPUS_PER_HOST
        host, gpu = f"node-{h:03d}", f"GPU-{h:03d}-{g}"
        t0 = START + i * 60.0
        labels = {"project": f"project-{h % 20}", "team": f"team-{h % 7}"}
        run = RunRecord(run_id, ["python", "train.py", f"--seed={i}"], f"user-{i % 200}", host, "/work", t0,
                        status="succeeded", ended_at=t0 + 6 * 60, exit_code=0, labels=labels)  # fmt: skip
        tables["runs"].append(codec.run_row(run))
        tables["run_labels"] += codec.label_rows(run_id, labels)
        tables["devices"].append(codec.to_row(GpuIdentity(0, gpu, "NVIDIA A100-SXM4-80GB", memory_total_b=80 << 30),
                                              run_id=run_id))  # fmt: skip
        for s in range(6):
            a, b = t0 + 60 * s, t0 + 60 * (s + 1)
            tables["gpu_intervals"].append(codec.to_row(GpuInterval(gpu, s, a, b, 12, busy_s=40.0 + s, energy_j=9e3,
                                                                     temp_max_c=60.0), run_id=run_id))  # fmt: skip
            tables["host_intervals"].append(codec.to_row(HostInterval(s, a, b, 12, cpu_s=30.0), run_id=run_id))
        event = codec.to_row(Event(t0 + 100, "epoch_end", "", {"epoch": 1}), run_id=run_id) | {"seq": 0}
        tables["events"].append(event)
        tables["metrics"].append(codec.to_row(Metric(t0 + 101, "loss", 0.5, epoch=1), run_id=run_id) | {"seq": 0})
        data = f"run {i}\n".encode()
        tables["logs"].append({"run_id": run_id, "data": data, "sha256": hashlib.sha256(data).hexdigest(),
                               "size_b": len(data), "truncated": False})  # fmt: skip
        tables["run_owners"].append({"run_id": run_id, "user_name": host, "token_id": None, "host": host, "since": t0})
        out.append({"id": run_id, "host": host, "gpu": gpu, "first_on_gpu": i < HOSTS * GPUS_PER_HOST,
                    "labels": labels, "t0": t0, "log_sha": hashlib.sha256(data).hexdigest()})  # fmt: skip

    def tx(conn: sa.Connection) -> None:
        for name, rows in tables.items():
            table = schema.metadata.tables[name]
            for k in range(0, len(rows), 5000):
                conn.execute(sa.insert(table), rows[k : k + 5000])
        owners = [{"uuid": f"GPU-{h:03d}-{g}", "host": f"node-{h:03d}", "user_name": f"node-{h:03d}", "since": START,
                   "source": "push"} for h in range(HOSTS) for g in range(GPUS_PER_HOST)]  # fmt: skip
        conn.execute(sa.insert(schema.gpu_owners), owners)

    led.write(tx)
    return out


def _seals(led: Ledger, runs: list[dict[str, Any]]) -> None:
    ids = [r["id"] for r in runs]
    by_id = {r["id"]: r for r in runs}

    def tx(conn: sa.Connection) -> None:
        for run_id, (digest, _) in audit_seals.current_seals(conn, ids):
            by_id[run_id]["seal"] = digest

    led.read(tx)


def _trail(runs: list[dict[str, Any]], agents: dict[str, str]) -> list[tuple[str, str, str, dict[str, Any]]]:
    """(actor, action, object, payload) rows for the runs, in chain order."""
    rows = []
    for r in runs:
        actor, obj = f"{r['host']} (token {agents[r['host']]})", f"run:{r['id']}"
        if r["first_on_gpu"]:
            rows.append((actor, "gpu.registered", f"gpu:{r['gpu']}", {"host": r["host"], "user": r["host"],
                                                                       "run": r["id"]}))  # fmt: skip
        rows.append((actor, "run.created", obj, {"project": r["labels"]["project"], "team": r["labels"]["team"],
                                                 "owner": r["host"], "token": agents[r["host"]],
                                                 "status": "running", "started_at": r["t0"]}))  # fmt: skip
        rows.append((actor, "run.changed", obj, {"old": {"labels": {}}, "new": {"labels": r["labels"]}}))
        rows.append((actor, "run.ended", obj, {"status": "succeeded", "ended_at": r["t0"] + 360, "exit_code": 0}))
        rows.append((actor, "run.sealed", obj, {"reason": "final push", "seal": r["seal"]}))
        rows.append((actor, "log.stored", obj, {"sha256": r["log_sha"], "size_b": 8, "truncated": False}))
        rows.append((actor, "run.resealed", obj, {"reason": "log stored", "seal": r["seal"]}))
        for level in (60, 3600):
            rows.append(("cli:cron@ops", "run.rolled_up", obj, {"level_s": level, "rows_before": 12, "rows_after": 12}))
            rows.append(("cli:cron@ops", "run.resealed", obj, {"reason": f"rolled up to {level} s intervals",
                                                                "seal": r["seal"]}))  # fmt: skip
        rows.append(("cli:cron@ops", "run.resealed", obj, {"reason": "retention check", "seal": r["seal"]}))
    return rows


def _append_generated(led: Ledger, key: SigningKey, rows: list[tuple[str, str, str, dict[str, Any]]]) -> None:
    """Hash, chain, sign and COPY ``rows`` after the current head, as store/audit.append would."""
    head = led.read(audit_sign.head)
    assert head is not None
    seq, prev = head.seq, head.hash
    t = time.time()
    out = []
    for actor, action, obj, payload in rows:
        seq += 1
        row = {"seq": seq, "t": t + seq * 1e-3, "actor": actor, "action": action, "object": obj,
               "payload": canonical_json(payload)}  # fmt: skip
        row["hash"] = row_hash(row, prev)
        out.append((seq, row["t"], actor, action, obj, row["payload"], prev, row["hash"], key.key_id,
                    key.sign(seq, row["hash"])))  # fmt: skip
        prev = row["hash"]

    def tx(conn: sa.Connection) -> None:
        raw = conn.connection.driver_connection
        with raw.cursor() as cur, cur.copy("COPY audit_log (seq, t, actor, action, object, payload, prev_hash, hash, "
                                           "key_id, sig) FROM STDIN") as cp:  # fmt: skip
            for r in out:
                cp.write_row(r)

    led.write(tx)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000, help="audit rows in the finished trail")
    ap.add_argument("--runs", type=int, default=80_000, help="sealed runs (12 audit rows each)")
    ap.add_argument("--keep", action="store_true", help="keep the benchmark schema")
    args = ap.parse_args()
    print(machine_line())
    print(source_state())
    print(f"gpuledger {version('gpuledger')}; cryptography {version('cryptography')}; PostgreSQL at {PG}")
    name = f"gl_verify_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{name}"')
    key = SigningKey.generate()
    os.environ[audit_sign.ENV_KEY] = key.text
    try:
        with Ledger(_url(name)) as led:
            t = time.perf_counter()
            agents = _accounts(led)
            runs = _data(led, args.runs)
            led.write(lambda c: c.exec_driver_sql("ANALYZE"))  # what autovacuum does to a real database
            from gpuledger.reports.cost.rollups import materialise_rollups

            materialise_rollups(led)
            _seals(led, runs)
            generated = _trail(runs, agents)
            have = led.read(lambda c: c.scalar(sa.select(sa.func.count()).select_from(schema.audit_log)))
            filler = max(0, args.rows - have - len(generated) - 1)
            generated += [("admin", "rate_card.changed", "rate_card:default", {"sha256": f"{i:064x}", "size_b": i})
                          for i in range(filler)]  # fmt: skip
            _append_generated(led, key, generated)
            audit.record_change(led, actor="admin", action="benchmark.built", obj="benchmark")  # the head, for real
            rows = led.read(lambda c: c.scalar(sa.select(sa.func.count()).select_from(schema.audit_log)))
            print(f"built: {rows:,} audit rows, {len(runs):,} sealed runs in {time.perf_counter() - t:.0f} s")
            ring = Keyring.of([key.public])

            t, cpu = time.perf_counter(), time.process_time()
            result = audit.verify(led, keyring=ring)
            wall, cpu = time.perf_counter() - t, time.process_time() - cpu
            print(f"verify: {wall:.1f} s wall ({cpu:.1f} s CPU of this process) for {result.rows:,} rows, "
                  f"{result.runs_checked:,} sealed runs; "
                  f"{'OK' if result.ok else 'FAILED'} ({len(result.problems)} problems), assurance {result.assurance}, "
                  f"signed through seq {result.signed_through:,}")  # fmt: skip
            for p in result.problems[:5]:
                print("  ", p)

            def chain_only(conn: sa.Connection) -> int:
                a = schema.audit_log.c
                q = sa.select(a.seq, a.t, a.actor, a.action, a.object, a.payload, a.prev_hash, a.hash).order_by(a.seq)
                cols = ("seq", "t", "actor", "action", "object", "payload", "prev_hash", "hash")
                stream = (dict(zip(cols, r, strict=True)) for r in conn.execute(q.execution_options(yield_per=5000)))
                return len(list(check_chain(stream)))

            t = time.perf_counter()
            led.read(chain_only)
            print(f"the chain alone (read + hash + links): {time.perf_counter() - t:.1f} s")
            sample = [r for r in led.read(lambda c: list(c.execute(sa.text(
                "SELECT seq, hash, key_id, sig FROM audit_log ORDER BY seq LIMIT 20000"))))]  # fmt: skip
            t = time.perf_counter()
            assert all(ring.verify(r.seq, r.key_id, r.hash, r.sig) for r in sample)
            per = (time.perf_counter() - t) / len(sample)
            print(f"--all-signatures adds {per * 1e6:.0f} us a row ({per * rows:.0f} s for this trail)")

    finally:
        os.environ.pop(audit_sign.ENV_KEY, None)
        if not args.keep:
            with contextlib.suppress(Exception), psycopg.connect(PG, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


if __name__ == "__main__":
    main()
