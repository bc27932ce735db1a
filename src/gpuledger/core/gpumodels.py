"""GPU models: the normalisation table (A100-equivalent factors), NVML name matching, MIG fractions.

The table is data (``gpu_models.toml``, shipped with the package; docs/CHARGEBACK.md). A rate card may
override any entry or add models and exact-name aliases (``ModelTable.with_overrides``).
"""

from __future__ import annotations

import functools
import importlib.resources
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from decimal import Decimal
from fractions import Fraction
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

__all__ = ["GpuModel", "ModelTable", "default_table", "mig_slices_of_profile"]

_MIG_SUFFIX = re.compile(r"\s+MIG\b.*$", re.IGNORECASE)
# "3g.40gb" -> 3 compute slices; "1c.3g.40gb" (a compute instance inside a 3g instance) -> 1.
_MIG_PROFILE = re.compile(r"^\s*(?:(\d+)c\.)?(\d+)g\.", re.IGNORECASE)
BASES = ("reference", "measured", "est.", "user")


@dataclass(frozen=True)
class GpuModel:
    key: str
    factor: Decimal | None  # A100-80GB-SXM = 1; None: unknown (no A100-equivalent hours)
    basis: str = "user"
    source: str = ""
    nvml: tuple[str, ...] = ()
    mig_slices: int | None = None
    patterns: tuple[re.Pattern[str], ...] = field(default=(), compare=False, repr=False)

    @classmethod
    def build(cls, key: str, **fields: Any) -> GpuModel:
        nvml = tuple(fields.pop("nvml", ()) or ())
        return cls(key=key, nvml=nvml, patterns=tuple(re.compile(p, re.IGNORECASE) for p in nvml), **fields)


def mig_slices_of_profile(profile: str) -> int | None:
    """Compute slices a MIG profile holds: "3g.40gb" -> 3, "1c.3g.40gb" -> 1, junk -> None."""
    m = _MIG_PROFILE.match(profile)
    if not m:
        return None
    return int(m.group(1) or m.group(2))


class ModelTable:
    """GPU model entries by key, with name matching. Immutable; overrides return a new table."""

    def __init__(self, models: Mapping[str, GpuModel], aliases: Mapping[str, str] | None = None) -> None:
        self.models: dict[str, GpuModel] = dict(models)
        # Exact NVML names (case-insensitive) -> key; checked before the patterns.
        self.aliases: dict[str, str] = {k.strip().lower(): v for k, v in (aliases or {}).items()}
        self._cache: dict[str, str | None] = {}
        self._by_lower = {k.lower(): k for k in self.models}

    @classmethod
    def from_toml(cls, text: str) -> ModelTable:
        doc = tomllib.loads(text)
        models = {key: GpuModel.build(key, **_entry(raw)) for key, raw in doc.get("models", {}).items()}
        return cls(models)

    def with_overrides(self, models: Mapping[str, Mapping[str, Any]], aliases: Mapping[str, str]) -> ModelTable:
        """A copy with ``models`` entries merged field by field (new keys added) and ``aliases`` added."""
        merged = dict(self.models)
        for key, raw in models.items():
            fields = _entry(raw)
            base = merged.get(self.canonical(key) or key)
            if base is None:
                merged[key] = GpuModel.build(key, **fields)
                continue
            nvml = fields.pop("nvml", None)
            updated = replace(base, **fields)
            if nvml is not None:
                updated = GpuModel.build(base.key, **{**_fields_of(updated), "nvml": nvml})
            merged[base.key] = updated
        return ModelTable(merged, {**self.aliases, **aliases})

    def canonical(self, key: str) -> str | None:
        """The table's spelling of a model key given in any case; None if unknown."""
        return self._by_lower.get(key.strip().lower())

    def match(self, name: str | None) -> str | None:
        """The model key of an NVML device name ("NVIDIA A100-SXM4-80GB" -> "A100-80GB-SXM")."""
        if not name:
            return None
        if name in self._cache:
            return self._cache[name]
        found = self._match(name)
        self._cache[name] = found
        return found

    def _match(self, name: str) -> str | None:
        plain = _MIG_SUFFIX.sub("", name).strip()
        for candidate in (name, plain):
            alias = self.aliases.get(candidate.lower())
            if alias is not None:
                return self.canonical(alias) or alias
        direct = self.canonical(plain)
        if direct is not None:  # a key given as the name (imported runs, hand-made records)
            return direct
        hits = [m.key for m in self.models.values() if any(p.search(plain) for p in m.patterns)]
        return hits[0] if hits else None

    def matches(self, name: str) -> list[str]:
        """Every model whose patterns match ``name`` (tests check the common names match one)."""
        plain = _MIG_SUFFIX.sub("", name).strip()
        return [m.key for m in self.models.values() if any(p.search(plain) for p in m.patterns)]

    def factor(self, key: str | None) -> Decimal | None:
        model = self.models.get(key) if key else None
        return model.factor if model else None

    def mig_fraction(self, key: str | None, profile: str | None) -> Fraction | None:
        """The share of the parent GPU a MIG slice represents (3g on a 7-slice A100 -> 3/7);
        1 for a whole GPU; None when the profile or the model's slice count is unknown."""
        if not profile:
            return Fraction(1)
        model = self.models.get(key) if key else None
        slices = mig_slices_of_profile(profile)
        if model is None or not model.mig_slices or slices is None:
            return None
        return min(Fraction(1), Fraction(slices, model.mig_slices))


def _entry(raw: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in raw.items():
        if name == "factor":
            out[name] = None if value is None else Decimal(str(value))
        elif name == "nvml":
            out[name] = tuple(str(p) for p in value)
        elif name == "mig_slices":
            out[name] = int(value)
        else:
            out[name] = str(value)
    return out


def _fields_of(model: GpuModel) -> dict[str, Any]:
    return {"factor": model.factor, "basis": model.basis, "source": model.source, "mig_slices": model.mig_slices}


@functools.lru_cache(maxsize=1)
def default_table() -> ModelTable:
    """The table shipped with gpuledger (``gpuledger/core/gpu_models.toml``)."""
    text = importlib.resources.files("gpuledger.core").joinpath("gpu_models.toml").read_text("utf-8")
    return ModelTable.from_toml(text)
