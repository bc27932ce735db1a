"""Helpers shared by the cost tests: small rate cards, epoch times, usage builders."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

from gpuledger.core.pricing.cost import Usage
from gpuledger.core.pricing.ratecard import RateCard
from gpuledger.core.pricing.ratecard_load import parse_rate_card

H = 3600.0


def ts(text: str) -> float:
    """'2026-03-15' or '2026-03-15T12:00' (UTC) -> epoch seconds."""
    parsed = dt.datetime.fromisoformat(text)
    return parsed.replace(tzinfo=dt.timezone.utc).timestamp()


def card(body: str, basis: str = "busy", currency: str = "USD") -> RateCard:
    return parse_rate_card(f'[card]\ncurrency = "{currency}"\nbasis = "{basis}"\n\n{body}', "test.toml")


def price_change(model: str, at: str, before: str, after: str, basis: str = "busy") -> RateCard:
    """A card pricing ``model`` at ``before`` until ``at`` (a TOML date-time), then at ``after``."""
    body = (f'[[gpu]]\nmodel = "{model}"\nprice_per_hour = "{before}"\neffective_to = {at}\n\n'
            f'[[gpu]]\nmodel = "{model}"\nprice_per_hour = "{after}"\neffective_from = {at}\n')  # fmt: skip
    return card(body, basis=basis)


A100_250 = """
[[gpu]]
model = "A100-40GB-SXM"
price_per_hour = "2.50"
"""


def usage(
    t0: float,
    hours: float,
    *,
    util: float | None = 0.5,
    name: str = "NVIDIA A100-SXM4-40GB",
    gpus: int = 1,
    watts: float | None = 300.0,
    run_id: str = "r1",
    instance: str | None = None,
    profile: str | None = None,
) -> Usage:
    seconds = hours * H * gpus
    return Usage(
        run_id=run_id,
        gpu_name=name,
        mig_profile=profile,
        instance_type=instance,
        t0=t0,
        t1=t0 + hours * H,
        alloc_s=seconds,
        busy_s=None if util is None else seconds * util,
        energy_j=None if watts is None else watts * seconds,
        gpus=gpus,
    )


def dec(value: str | None) -> Decimal:
    return Decimal(value or "0")
