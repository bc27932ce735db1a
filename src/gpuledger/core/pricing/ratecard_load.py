"""Reading a rate card from TOML text, with errors that name the file, the line and the key.

tomllib reports line numbers only for syntax errors, so for a wrong value the line is found by
scanning the text for the entry's header and the key under it (``_Locator``): good enough for the
usual layout of one key per line. Every problem in the file is reported at once. Schema and
examples: docs/RATE_CARDS.md.
"""

from __future__ import annotations

import datetime as dt
import functools
import importlib.resources
import itertools
import re
from collections.abc import Mapping
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Any

from gpuledger.core.gpumodels import BASES as MODEL_BASES
from gpuledger.core.gpumodels import ModelTable, default_table
from gpuledger.core.money import PRICE_PLACES, PUE_PLACES, decimal_places, parse_decimal, price_units, tidy
from gpuledger.core.pricing.ratecard import BASES, Instance, RateCard, RateLine
from gpuledger.core.toml_lines import Locator, line_of

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

__all__ = ["SCHEMA", "RateCardError", "default_rate_card", "parse_rate_card"]

HOURS_PER_YEAR = Decimal(8760)  # 365 days: the amortisation year of an on-prem GPU
ONPREM_RATE_PLACES = Decimal("0.000001")  # a derived on-prem rate is rounded once, to 6 places
_PRICE_QUANTUM = Decimal(1).scaleb(-PRICE_PLACES)

# Every table and key a rate card may hold (docs/RATE_CARDS.md documents each; a test checks).
SCHEMA: dict[str, frozenset[str]] = {
    "card": frozenset({"name", "currency", "basis", "description"}),
    "defaults": frozenset({"power_price_per_kwh", "pue", "lifetime_years", "expected_utilisation"}),
    "gpu": frozenset(
        {
            "model",
            "price_per_hour",
            "purchase_price",
            "lifetime_years",
            "expected_utilisation",
            "power_price_per_kwh",
            "pue",
            "effective_from",
            "effective_to",
            "source",
        }
    ),
    "instance": frozenset(
        {
            "type",
            "gpu_model",
            "gpus",
            "price_per_hour",
            "vm_price_per_hour",
            "gpu_price_per_hour",
            "power_price_per_kwh",
            "pue",
            "effective_from",
            "effective_to",
            "source",
        }
    ),
    "models": frozenset({"factor", "basis", "source", "nvml", "mig_slices"}),
    "aliases": frozenset(),  # free keys: NVML name = model key
}
_ONPREM = ("purchase_price", "lifetime_years", "expected_utilisation")


class RateCardError(ValueError):
    """A rate card that cannot be used; ``problems`` holds one line per problem found."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("\n".join(problems))


class _Parser:
    def __init__(self, text: str, source: str, models: ModelTable) -> None:
        self.source = source
        self.loc = Locator(text)
        self.base_models = models
        self.problems: list[str] = []

    # -- problem reporting -----------------------------------------------------------------------

    def where(self, table: str, index: int | None = None, sub: str | None = None, key: str | None = None) -> str:
        head = self.loc.header(table, index, sub)
        line = self.loc.key(head, key) if key is not None else head
        if line is None:
            line = head
        return f"{self.source}:{line + 1}" if line is not None else self.source

    def fail(
        self, message: str, table: str, index: int | None = None, sub: str | None = None, key: str | None = None
    ) -> None:
        entry = f"[[{table}]] #{index + 1}" if index is not None else f"[{table}.{sub}]" if sub else f"[{table}]"
        what = f"{entry} {key}" if key else entry
        self.problems.append(f"{self.where(table, index, sub, key)}: {what}: {message}")

    # -- sections --------------------------------------------------------------------------------

    def parse(self, doc: Mapping[str, Any]) -> RateCard:
        for name in doc:
            if name not in SCHEMA:
                self.problems.append(
                    f"{self.where(name)}: unknown table or key {name!r} (expected one of: {', '.join(SCHEMA)})"
                )
        card = self.table(doc, "card")
        defaults = self.table(doc, "defaults")
        currency = str(card.get("currency", ""))
        if not re.fullmatch(r"[A-Z]{3}", currency):
            # a key left out is "missing", as elsewhere in the card, not the repr of a default ('' or None)
            given = f"{currency!r} is not" if "currency" in card else "missing: write"
            self.fail(f'{given} a 3-letter ISO 4217 code such as "USD" or "EUR"', "card", key="currency")
        basis = card.get("basis")
        if basis not in BASES:
            given = f"{basis!r}:" if "basis" in card else "missing:"
            self.fail(f'{given} write "allocated" (what a cloud charges) or "busy" (used time)', "card", key="basis")
        models = self.models(doc)
        gpu_lines = [
            ln for i, raw in enumerate(self.array(doc, "gpu")) if (ln := self.gpu_line(raw, i, defaults, models))
        ]
        instances: dict[str, Instance] = {}
        instance_lines: list[RateLine] = []
        for i, raw in enumerate(self.array(doc, "instance")):
            self.instance_entry(raw, i, models, instances, instance_lines)
        self.no_overlaps(gpu_lines, "gpu")
        self.no_overlaps(instance_lines, "instance")
        if self.problems:
            raise RateCardError(sorted(self.problems, key=line_of))
        return RateCard(
            currency=currency,
            basis=str(basis),
            models=models,
            gpu_lines=gpu_lines,
            instance_lines=instance_lines,
            instances=list(instances.values()),
            name=str(card.get("name", "")),
            source=self.source,
            description=str(card.get("description", "")),
        )

    def table(self, doc: Mapping[str, Any], name: str) -> dict[str, Any]:
        raw = doc.get(name, {})
        if not isinstance(raw, dict):
            self.fail("must be a table", name)
            return {}
        self.unknown_keys(raw, name)
        return raw

    def array(self, doc: Mapping[str, Any], name: str) -> list[dict[str, Any]]:
        raw = doc.get(name, [])
        if not isinstance(raw, list) or not all(isinstance(x, dict) for x in raw):
            self.problems.append(f"{self.where(name)}: {name}: write each entry as a [[{name}]] table")
            return []
        for i, entry in enumerate(raw):
            self.unknown_keys(entry, name, i)
        return raw

    def unknown_keys(
        self, raw: Mapping[str, Any], table: str, index: int | None = None, sub: str | None = None
    ) -> None:
        allowed = SCHEMA["models"] if sub is not None else SCHEMA[table]
        for key in raw:
            if key not in allowed:
                hint = f" (expected one of: {', '.join(sorted(allowed))})"
                self.fail(f"unknown key{hint}", table, index, sub, key)

    def models(self, doc: Mapping[str, Any]) -> ModelTable:
        raw_models = doc.get("models", {})
        raw_aliases = doc.get("aliases", {})
        overrides: dict[str, dict[str, Any]] = {}
        for key, raw in raw_models.items() if isinstance(raw_models, dict) else ():
            if not isinstance(raw, dict):
                self.fail("must be a table of factor, basis, source, nvml, mig_slices", "models", sub=key)
                continue
            self.unknown_keys(raw, "models", sub=key)
            entry = {k: v for k, v in raw.items() if k in SCHEMA["models"]}
            if "factor" in entry:
                factor = self.amount(entry["factor"], "models", None, key, "factor", places=4, positive=True)
                entry["factor"] = factor
            if "basis" in entry and entry["basis"] not in MODEL_BASES:
                self.fail(f"{entry['basis']!r}: use one of {', '.join(MODEL_BASES)}", "models", sub=key, key="basis")
            if "nvml" in entry:
                entry["nvml"] = self.patterns(entry["nvml"], key)
            if "mig_slices" in entry and not (isinstance(entry["mig_slices"], int) and entry["mig_slices"] > 0):
                self.fail("must be a positive integer", "models", sub=key, key="mig_slices")
            if self.base_models.canonical(key) is None and entry.get("factor") is None:
                self.fail(
                    "a new GPU model needs a factor (and nvml patterns or [aliases] to match it)", "models", sub=key
                )
                continue
            overrides[key] = entry
        aliases: dict[str, str] = {}
        if not isinstance(raw_aliases, dict):
            self.fail('must be a table of "NVML name" = "model key"', "aliases")
            raw_aliases = {}
        table = self.base_models.with_overrides(overrides, {})
        for name, target in raw_aliases.items():
            if not isinstance(target, str) or table.canonical(target) is None:
                self.fail(f"{target!r} is not a GPU model key{self.suggest(str(target), table)}", "aliases", key=name)
                continue
            aliases[name] = str(table.canonical(target))
        return table.with_overrides({}, aliases)

    def patterns(self, value: Any, key: str) -> tuple[str, ...]:
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list) or not all(isinstance(p, str) for p in items):
            self.fail("must be a list of regular expressions", "models", sub=key, key="nvml")
            return ()
        valid = []
        for p in items:
            try:
                re.compile(p)
                valid.append(p)
            except re.error as exc:
                self.fail(f"{p!r} is not a regular expression: {exc}", "models", sub=key, key="nvml")
        return tuple(valid)

    # -- values ----------------------------------------------------------------------------------

    def amount(
        self,
        value: Any,
        table: str,
        index: int | None,
        sub: str | None,
        key: str,
        *,
        places: int = PRICE_PLACES,
        positive: bool = False,
    ) -> Decimal | None:
        try:
            out = parse_decimal(value)
        except ValueError as exc:
            self.fail(str(exc), table, index, sub, key)
            return None
        if out < 0 or (positive and out == 0):
            self.fail(f"{out} must be {'positive' if positive else 'zero or more'}", table, index, sub, key)
            return None
        if decimal_places(out) > places:
            self.fail(f"{out} has more than {places} decimal places", table, index, sub, key)
            return None
        return out

    def when(self, value: Any, table: str, index: int, key: str) -> float | None:
        if value is None:
            return None
        if isinstance(value, str):
            try:
                value = (
                    dt.datetime.fromisoformat(value) if "T" in value or " " in value else dt.date.fromisoformat(value)
                )
            except ValueError:
                self.fail(f"{value!r} is not a date: write a TOML date such as 2026-03-15", table, index, key=key)
                return None
        if isinstance(value, dt.datetime):
            # A date-time without an offset is UTC, like every time gpuledger reports.
            return (value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)).timestamp()
        if isinstance(value, dt.date):
            return dt.datetime(value.year, value.month, value.day, tzinfo=dt.timezone.utc).timestamp()
        self.fail("must be a TOML date (2026-03-15) or date-time (2026-03-15T12:00:00Z)", table, index, key=key)
        return None

    def model_key(self, value: Any, models: ModelTable, table: str, index: int, key: str) -> str | None:
        found = models.canonical(value) if isinstance(value, str) else None
        if found is None:
            self.fail(f"{value!r} is not a GPU model key{self.suggest(str(value), models)}", table, index, key=key)
        return found

    @staticmethod
    def suggest(value: str, models: ModelTable) -> str:
        import difflib

        keys = [k.upper() for k in models.models]
        prefixed = [k for k in keys if value and k.startswith(value.upper())]
        close = prefixed or difflib.get_close_matches(value.upper(), keys, n=3, cutoff=0.5)
        named = [models.canonical(c) for c in close]
        known = ", ".join(sorted(models.models))
        return f" (did you mean {' or '.join(str(n) for n in named)}?)" if named else f" (known: {known})"

    def span(self, raw: Mapping[str, Any], table: str, index: int) -> tuple[float | None, float | None, bool]:
        start = self.when(raw.get("effective_from"), table, index, "effective_from")
        end = self.when(raw.get("effective_to"), table, index, "effective_to")
        ok = start is None or end is None or start < end
        if not ok:
            self.fail("effective_to must be after effective_from", table, index, key="effective_to")
        return start, end, ok

    def energy(
        self, raw: Mapping[str, Any], table: str, index: int, defaults: Mapping[str, Any]
    ) -> tuple[Decimal | None, Decimal]:
        price_raw = raw.get("power_price_per_kwh", defaults.get("power_price_per_kwh"))
        pue_raw = raw.get("pue", defaults.get("pue", 1))
        price = None if price_raw is None else self.amount(price_raw, table, index, None, "power_price_per_kwh")
        pue = self.amount(pue_raw, table, index, None, "pue", places=PUE_PLACES)
        if pue is not None and pue < 1:
            self.fail(f"{pue} is below 1: PUE is facility energy / IT energy", table, index, key="pue")
            pue = None
        return price, Decimal(1) if pue is None else pue

    # -- entries ---------------------------------------------------------------------------------

    def gpu_line(
        self, raw: Mapping[str, Any], i: int, defaults: Mapping[str, Any], models: ModelTable
    ) -> RateLine | None:
        model = self.model_key(raw.get("model"), models, "gpu", i, "model")
        start, end, span_ok = self.span(raw, "gpu", i)
        onprem = any(k in raw for k in ("purchase_price",))
        if onprem and "price_per_hour" in raw:
            self.fail("give price_per_hour or purchase_price (on-prem), not both", "gpu", i, key="price_per_hour")
            return None
        derivation = ""
        if onprem:
            rate, derivation = self.onprem_rate(raw, i, defaults)
            energy_defaults = defaults
        elif "price_per_hour" in raw:
            rate = self.amount(raw["price_per_hour"], "gpu", i, None, "price_per_hour")
            energy_defaults = {}  # site power price and PUE apply to on-prem lines only
        else:
            self.fail("needs price_per_hour, or purchase_price + lifetime_years + expected_utilisation", "gpu", i)
            return None
        energy_price, pue = self.energy(raw, "gpu", i, energy_defaults)
        if model is None or rate is None or not span_ok:
            return None
        return self.line("gpu", model, model, rate, 1, energy_price, pue, start, end, raw, i, derivation)

    def onprem_rate(self, raw: Mapping[str, Any], i: int, defaults: Mapping[str, Any]) -> tuple[Decimal | None, str]:
        values = {}
        for key in _ONPREM:
            value = raw.get(key, defaults.get(key))
            if value is None:
                self.fail(
                    "missing (on-prem lines need purchase_price, lifetime_years, expected_utilisation)",
                    "gpu",
                    i,
                    key=key,
                )
                return None, ""
            values[key] = self.amount(value, "gpu", i, None, key, positive=True)
        price, years, util = (values[k] for k in _ONPREM)
        if price is None or years is None or util is None:
            return None, ""
        if util > 1:
            self.fail(
                f"{util} is above 1: the share of the GPU's lifetime hours that get billed",
                "gpu",
                i,
                key="expected_utilisation",
            )
            return None, ""
        rate = (price / (years * HOURS_PER_YEAR * util)).quantize(ONPREM_RATE_PLACES, ROUND_HALF_EVEN)
        return rate, f"{price} / ({years} y x 8760 h x {util})"

    def instance_entry(
        self, raw: Mapping[str, Any], i: int, models: ModelTable, instances: dict[str, Instance], lines: list[RateLine]
    ) -> None:
        itype = raw.get("type")
        if not isinstance(itype, str) or not itype.strip():
            self.fail('missing the instance type name (type = "p4d.24xlarge")', "instance", i, key="type")
            return
        model = self.model_key(raw.get("gpu_model"), models, "instance", i, "gpu_model")
        gpus = raw.get("gpus")
        if not isinstance(gpus, int) or isinstance(gpus, bool) or gpus < 1:
            self.fail(f"{gpus!r}: the number of GPUs, a positive integer", "instance", i, key="gpus")
            return
        if model is None:
            return
        where = self.where("instance", i)
        known = instances.get(itype.lower())
        if known is not None and (known.model, known.gpus) != (model, gpus):
            self.fail(
                f"{itype} was declared with {known.gpus} x {known.model} at {known.where}",
                "instance",
                i,
                key="gpu_model",
            )
            return
        instances.setdefault(itype.lower(), Instance(itype, model, gpus, where))
        start, end, span_ok = self.span(raw, "instance", i)
        total, derivation = self.instance_price(raw, i, gpus)
        energy_price, pue = self.energy(raw, "instance", i, {})
        if total is None or not span_ok:
            return  # a mapping only: its GPUs are priced by the model's lines
        rate = tidy((total / gpus).quantize(_PRICE_QUANTUM, ROUND_HALF_EVEN))
        lines.append(self.line("instance", itype, model, rate, gpus, energy_price, pue, start, end, raw, i, derivation))

    def instance_price(self, raw: Mapping[str, Any], i: int, gpus: int) -> tuple[Decimal | None, str]:
        whole = "price_per_hour" in raw
        split = "vm_price_per_hour" in raw or "gpu_price_per_hour" in raw
        if whole and split:
            self.fail(
                "give price_per_hour or vm_price_per_hour + gpu_price_per_hour, not both",
                "instance",
                i,
                key="price_per_hour",
            )
            return None, ""
        if whole:
            total = self.amount(raw["price_per_hour"], "instance", i, None, "price_per_hour")
            return total, "" if total is None or gpus == 1 else f"{total} / {gpus} GPUs"
        if split:
            vm = self.amount(raw.get("vm_price_per_hour", 0), "instance", i, None, "vm_price_per_hour")
            gpu = self.amount(raw.get("gpu_price_per_hour", 0), "instance", i, None, "gpu_price_per_hour")
            if vm is None or gpu is None:
                return None, ""
            return vm + gpus * gpu, f"(VM {vm} + {gpus} x GPU {gpu}) / {gpus} GPUs"
        return None, ""

    def line(
        self,
        kind: str,
        key: str,
        model: str,
        rate: Decimal,
        gpus: int,
        energy_price: Decimal | None,
        pue: Decimal,
        start: float | None,
        end: float | None,
        raw: Mapping[str, Any],
        i: int,
        derivation: str,
    ) -> RateLine:
        return RateLine(
            kind=kind,
            key=key,
            model=model,
            rate=rate,
            rate_u=price_units(rate),
            energy_price=energy_price,
            energy_u=0 if energy_price is None else price_units(energy_price),
            pue=pue,
            pue_m=price_units(pue, PUE_PLACES),
            start=start,
            end=end,
            gpus=gpus,
            source=str(raw.get("source", "")),
            where=self.where(kind, i),
            derivation=derivation,
        )

    def no_overlaps(self, lines: list[RateLine], kind: str) -> None:
        by_key: dict[str, list[RateLine]] = {}
        for ln in lines:
            by_key.setdefault(ln.key.lower(), []).append(ln)
        for same in by_key.values():
            same.sort(key=lambda ln: float("-inf") if ln.start is None else ln.start)
            for a, b in itertools.pairwise(same):
                if a.end is None or b.start is None or a.end > b.start:
                    self.problems.append(
                        f"{b.where}: [[{kind}]] {b.key}: its effective dates overlap the line at {a.where}; "
                        "give the earlier line an effective_to no later than this one's effective_from"
                    )


def parse_rate_card(text: str, source: str = "<rate card>", *, models: ModelTable | None = None) -> RateCard:
    """Validate a rate card's TOML text; RateCardError lists every problem as ``source:line: ...``."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise RateCardError([f"{source}: not valid TOML: {exc}"]) from exc
    return _Parser(text, source, models or default_table()).parse(doc)


@functools.lru_cache(maxsize=1)
def default_rate_card() -> RateCard:
    """The example card shipped with gpuledger (``gpuledger/core/pricing/default_rates.toml``)."""
    text = importlib.resources.files("gpuledger.core.pricing").joinpath("default_rates.toml").read_text("utf-8")
    return parse_rate_card(text, "default_rates.toml")
