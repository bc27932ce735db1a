"""Value for money of a training run: what an epoch, a thousand training images and a point of
mAP50-95 cost. Pure; ``gpuledger compare`` and the run reports call it.

mAP50-95 is Ultralytics' 0-1 figure; a "point" is one percentage point (0.01), so a run that cost
$41.20 and reached mAP50-95 0.412 cost $1.00 per point. Ratios are rounded half-even to 6 places.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Any

from gpuledger.core.model import Metric
from gpuledger.core.money import EXACT

__all__ = ["MAP50_95_KEYS", "ValueForMoney", "value_for_money", "yolo_inputs"]

# The mAP50-95 metric of each Ultralytics task (detect, segment, pose), then YOLOv5's name.
MAP50_95_KEYS = ("metrics/mAP50-95(B)", "metrics/mAP50-95(M)", "metrics/mAP50-95(P)", "metrics/mAP_0.5:0.95")
_Q = Decimal("0.000001")


@dataclass(frozen=True)
class ValueForMoney:
    cost: Decimal
    epochs: int | None
    train_images: int | None  # training images per epoch
    images_seen: int | None  # epochs x train_images
    map50_95: float | None  # 0-1
    cost_per_epoch: Decimal | None
    cost_per_1k_images: Decimal | None
    cost_per_map_point: Decimal | None  # per percentage point of mAP50-95
    currency: str = ""

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: money as decimal strings."""

        def s(v: Decimal | None) -> str | None:
            return None if v is None else format(v, "f")

        return {
            "currency": self.currency,
            "cost": s(self.cost),
            "epochs": self.epochs,
            "train_images": self.train_images,
            "images_seen": self.images_seen,
            "map50_95": self.map50_95,
            "cost_per_epoch": s(self.cost_per_epoch),
            "cost_per_1k_images": s(self.cost_per_1k_images),
            "cost_per_map_point": s(self.cost_per_map_point),
        }


def _div(amount: Decimal, by: Decimal) -> Decimal | None:
    if by <= 0:
        return None
    return EXACT.divide(amount, by).quantize(_Q, ROUND_HALF_EVEN, EXACT)


def value_for_money(
    cost: Decimal,
    *,
    epochs: int | None,
    train_images: int | None,
    map50_95: float | None,
    currency: str = "",
) -> ValueForMoney:
    """Cost per epoch, per 1,000 training images seen (epochs x images per epoch) and per mAP50-95
    point. A figure whose input is missing, zero or not finite is None."""
    images_seen = epochs * train_images if epochs and train_images else None
    usable_map = map50_95 if map50_95 is not None and math.isfinite(map50_95) and map50_95 > 0 else None
    return ValueForMoney(
        cost=cost,
        epochs=epochs,
        train_images=train_images,
        images_seen=images_seen,
        map50_95=map50_95,
        cost_per_epoch=_div(cost, Decimal(epochs)) if epochs else None,
        cost_per_1k_images=_div(cost * 1000, Decimal(images_seen)) if images_seen else None,
        cost_per_map_point=None if usable_map is None else _div(cost, Decimal(repr(usable_map)) * 100),
        currency=currency,
    )


def yolo_inputs(meta: Mapping[str, Any], metrics: Iterable[Metric]) -> dict[str, Any]:
    """epochs, train_images and map50_95 of a YOLO run (or of all attempts of a resumed one: pass
    their metrics together) from the integration's ``run.meta`` and per-epoch metrics."""
    epochs: set[int] = set()
    best: float | None = None
    for m in metrics:
        if m.epoch is not None:
            epochs.add(m.epoch)
        if m.key in MAP50_95_KEYS and math.isfinite(m.value) and (best is None or m.value > best):
            best = m.value
    result = meta.get("result") or {}
    reported = result.get("best_map50_95") if isinstance(result, Mapping) else None
    if isinstance(reported, (int, float)) and math.isfinite(reported):
        best = float(reported)
    dataset = meta.get("dataset") or {}
    images = dataset.get("images") if isinstance(dataset, Mapping) else None
    train = images.get("train") if isinstance(images, Mapping) else None
    return {
        "epochs": len(epochs) or None,
        "train_images": int(train) if isinstance(train, (int, float)) and train > 0 else None,
        "map50_95": best,
    }
