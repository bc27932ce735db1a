"""``gpuledger lineage ID|MODEL_VERSION``: a model's line, version by version (reports/run/lineage.py)."""

from __future__ import annotations

import json
from typing import Any

import click

from gpuledger.cli.common import check_report_rate_card, cli_errors, db_option, format_option, open_ledger
from gpuledger.core.units import fmt_money, fmt_number


def _signed(value: float | None, unit: str, digits: int = 1) -> str | None:
    return None if value is None else f"{value:+.{digits}f}{unit}"


def _money(cost: str | None) -> str | None:
    """The exact "AMOUNT CURRENCY" of the JSON, in cents for people (as compare shows money)."""
    if not cost:
        return None
    amount, _, currency = cost.partition(" ")
    return fmt_money(amount, currency or None)


def _rows(model: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    names = {v["run_id"]: v["model_version"] or v["short_id"] for v in model["versions"]}
    versions, evals = [], []
    for v in model["versions"]:
        ch = v.get("change") or {}
        label = names[v["run_id"]]
        fp = (v.get("dataset") or {}).get("fingerprint")
        versions.append(
            {
                "version": label + (" *" if v["run_id"] == model["selected"] else ""),
                "run": v["short_id"],
                "from": names.get(v["parent_run"] or "", "–") if v["parent_run"] else "–",
                "host": v["host"],
                "gpu": v["gpu_model"],
                "dataset": None if not fp else f"{(v['dataset'] or {}).get('name') or ''} {fp[:12]}".strip(),
                "gpu_h": v["gpu_hours"],
                "kwh": v["energy_kwh"],
                "cost": _money(v["cost"]),
                "best_map": v["best_map"],
                "d_map": _signed(ch.get("best_map_points"), " pt"),
                "evals": len(v["evaluations"]),
            }
        )
        for e in v["evaluations"]:
            evals.append(
                {
                    "version": label,
                    "run": e["short_id"],
                    "mode": e["mode"],
                    "split": None if not e["split_fingerprint"] else e["split_fingerprint"][:12],
                    "imgsz": e["imgsz"],
                    "fps": None if e["fps_inference"] is None else fmt_number(e["fps_inference"], 4),
                    "j_img": e["j_per_image"],
                    "map": e["map50_95"],
                }
            )
    return versions, evals


@click.command("lineage")
@click.argument("ref")
@format_option("table", "json")
@click.option(
    "--cost/--no-cost",
    "cost",
    default=None,
    help="Price each version. Default: only when a rate card is configured ($GPULEDGER_RATES).",
)
@db_option
@cli_errors
def lineage_cmd(ref: str, fmt: str, cost: bool | None, db: str | None) -> None:
    """A model's whole line from one id: REF is a run id (training or evaluation) or a model_version label.

    Each version is a training; the next version is a training that started from its best.pt.
    Shown per version: run, parent, host, GPU, dataset, GPU-hours, energy, cost, best mAP, the mAP
    change against the previous version, and its evaluation runs. * marks the version REF names.
    """
    from gpuledger.cli.report_render import rows_table
    from gpuledger.reports.run import lineage
    from gpuledger.reports.run.cost_hook import rate_card_configured

    with_cost = rate_card_configured() if cost is None else cost
    check_report_rate_card(with_cost)
    ledger = open_ledger(db)
    try:
        model = lineage.build(ledger, ref, with_cost=with_cost)
    except lineage.NoLineage as exc:
        raise click.ClickException(str(exc)) from exc
    if fmt == "json":
        click.echo(json.dumps(model, indent=2))
        return
    versions, evals = _rows(model)
    title = f"gpuledger lineage {model['model_line'] or ''}".rstrip()
    columns = [
        ("version", "version"), ("run", "run"), ("from", "from"), ("best_map", "best mAP50-95"),
        ("d_map", "Δ mAP"), ("gpu_h", "GPU-h"), ("kwh", "kWh"), ("cost", "cost"), ("host", "host"),
        ("gpu", "GPU"), ("dataset", "dataset"), ("evals", "evals"),
    ]  # fmt: skip
    rows_table(title, columns, versions, whole=("version", "run"))
    if evals:
        eval_columns = [
            ("version", "version"), ("run", "evaluation"), ("mode", "mode"), ("fps", "FPS (inference)"),
            ("j_img", "J / image"), ("map", "mAP50-95"), ("imgsz", "imgsz"), ("split", "split"),
        ]  # fmt: skip
        rows_table("evaluations", eval_columns, evals, whole=("version", "run"))
    for v in model["versions"]:
        for finding in v.get("findings") or []:
            click.echo(f"{v['model_version'] or v['short_id']}: {finding['message']}")
