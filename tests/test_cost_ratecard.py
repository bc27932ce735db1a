"""Rate cards: the shipped example, overrides, and clear errors (file, line, key) on bad files."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest

from cost_support import card, ts
from gpuledger.core.gpumodels import default_table, mig_slices_of_profile
from gpuledger.core.pricing.ratecard_load import RateCardError, default_rate_card, parse_rate_card
from gpuledger.reports.cost.costing import load_rate_card

NVML_NAMES = {
    "NVIDIA A100-SXM4-80GB": "A100-80GB-SXM",
    "NVIDIA A100-SXM4-40GB": "A100-40GB-SXM",
    "NVIDIA A100-PCIE-40GB": "A100-40GB-PCIE",
    "NVIDIA A100 80GB PCIe": "A100-80GB-PCIE",
    "NVIDIA H100 80GB HBM3": "H100-SXM",
    "NVIDIA H100 PCIe": "H100-PCIE",
    "NVIDIA H200": "H200",
    "Tesla V100-SXM2-16GB": "V100",
    "Tesla V100-SXM2-32GB": "V100",
    "Tesla V100-PCIE-16GB": "V100",
    "Tesla T4": "T4",
    "NVIDIA A10G": "A10G",
    "NVIDIA A10": "A10",
    "NVIDIA L4": "L4",
    "NVIDIA L40S": "L40S",
    "NVIDIA GeForce RTX 4090": "RTX-4090",
    "NVIDIA GeForce RTX 3090": "RTX-3090",
    "NVIDIA A100-SXM4-80GB MIG 3g.40gb": "A100-80GB-SXM",
    "NVIDIA H100 NVL": "H100-NVL",
    "NVIDIA H200 NVL": "H200-NVL",
    "NVIDIA GeForce RTX 3090 Ti": "RTX-3090-TI",
    "NVIDIA H100 NVL MIG 1g.12gb": "H100-NVL",
}


@pytest.mark.parametrize(("name", "key"), sorted(NVML_NAMES.items()))
def test_nvml_names_match_exactly_one_table_entry(name: str, key: str) -> None:
    table = default_table()
    assert table.matches(name) == [key]
    assert table.match(name) == key


def test_unknown_names_stay_unknown_rather_than_guessed() -> None:
    table = default_table()
    for name in ("Quadro RTX 8000", "NVIDIA RTX A6000", "", "NVIDIA A100", "NVIDIA H100"):
        assert table.match(name) is None


def test_the_table_has_the_required_models_with_sources_and_a100_as_reference() -> None:
    table = default_table()
    required = [
        "T4",
        "A10",
        "A10G",
        "L4",
        "L40S",
        "V100",
        "A100-40GB-PCIE",
        "A100-40GB-SXM",
        "A100-80GB-PCIE",
        "A100-80GB-SXM",
        "H100-PCIE",
        "H100-SXM",
        "H200",
        "RTX-3090",
        "RTX-4090",
    ]
    for key in required:
        model = table.models[key]
        assert (
            model.factor is not None
            and model.factor > 0
            and model.source
            and model.basis in ("reference", "measured", "est.")
        )
    assert table.factor("A100-80GB-SXM") == Decimal("1.0")
    assert table.factor("H100-SXM") == Decimal("1.75")


def test_mig_profiles() -> None:
    assert mig_slices_of_profile("3g.40gb") == 3
    assert mig_slices_of_profile("1g.10gb+me") == 1
    assert mig_slices_of_profile("1c.3g.40gb") == 1
    assert mig_slices_of_profile("weird") is None
    table = default_table()
    assert (
        table.mig_fraction("H100-SXM", "2g.20gb") == Decimal(2) / 7
        or str(table.mig_fraction("H100-SXM", "2g.20gb")) == "2/7"
    )
    assert table.mig_fraction("T4", "1g.5gb") is None  # T4 has no MIG: unknown, priced whole and flagged


def test_default_card_has_the_design_prices_dated_and_the_instance_families() -> None:
    c = default_rate_card()
    assert c.currency == "USD" and c.basis == "busy"
    prices = {ln.model: str(ln.rate) for ln in c.gpu_lines}
    assert prices == {
        "T4": "0.526",
        "A10G": "1.006",
        "L4": "0.805",
        "L40S": "2.62",
        "V100": "3.06",
        "A100-40GB-SXM": "2.74",
        "A100-80GB-SXM": "3.43",
        "H100-SXM": "6.88",
        "H200": "7.91",
    }
    assert all(ln.start == ts("2025-01-01") and ln.source for ln in c.gpu_lines)
    families = {i.type.split(".")[0].split("-")[0].lower() for i in c.instances.values()}
    for family in ("p3", "p4d", "p4de", "p5", "p5en", "g4dn", "g5", "g6", "g6e", "a2", "a3", "g2"):
        assert family in families, family
    assert c.instance("p5en.48xlarge").gpus == 8 and c.instance("P5EN.48XLARGE").model == "H200"
    assert any(t.startswith("standard_nc") for t in c.instances) and any(
        t.startswith("standard_nd") for t in c.instances
    )


def test_card_overrides_factors_and_names() -> None:
    c = card(
        """
[models.A100-40GB-SXM]
factor = 0.9
source = "calibrated on our YOLOv8m runs"

[models.MI300X]
factor = 1.3
nvml = ['MI300X']

[aliases]
"Custom A100 Board" = "a100-80gb-sxm"
"""
    )
    assert c.models.factor("A100-40GB-SXM") == Decimal("0.9")
    assert c.models.models["A100-40GB-SXM"].nvml  # patterns kept
    assert c.models.match("AMD Instinct MI300X") == "MI300X"
    assert c.models.match("custom a100 board") == "A100-80GB-SXM"
    assert default_table().factor("A100-40GB-SXM") == Decimal("0.93")  # the shipped table is untouched


HEAD = '[card]\ncurrency = "USD"\nbasis = "busy"\n'


def _problems(text: str) -> list[str]:
    with pytest.raises(RateCardError) as err:
        parse_rate_card(text, "cards/team.toml")
    return err.value.problems


def test_errors_name_the_file_the_line_and_the_key() -> None:
    problems = _problems(
        """[card]
currency = "usd"
basis = "wallclock"

[[gpu]]
model = "A100"
price_per_hour = "2.5.0"

[[gpu]]
model = "H100-SXM"
price_per_hr = 3
price_per_hour = -3
effective_from = 2026-02-01
effective_to = 2026-01-01
"""
    )
    text = "\n".join(problems)
    assert "cards/team.toml:2: [card] currency: 'usd' is not a 3-letter ISO 4217 code" in text
    assert "cards/team.toml:3: [card] basis: 'wallclock'" in text
    assert "cards/team.toml:6: [[gpu]] #1 model: 'A100' is not a GPU model key (did you mean A100-40GB-PCIE" in text
    assert "cards/team.toml:7: [[gpu]] #1 price_per_hour: '2.5.0' is not a decimal amount" in text
    assert "cards/team.toml:11: [[gpu]] #2 price_per_hr: unknown key" in text
    assert "cards/team.toml:12: [[gpu]] #2 price_per_hour: -3 must be zero or more" in text
    assert "cards/team.toml:14: [[gpu]] #2 effective_to: effective_to must be after effective_from" in text
    assert problems == sorted(problems, key=lambda p: int(p.split(":")[1]))  # in file order


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (
            '[card]\ncurrency = "USD"\nbasis = "busy"\n[[gpu]]\nmodel = "T4"\n',
            "test.toml:4: [[gpu]] #1: needs price_per_hour",
        ),
        (
            '[card]\ncurrency = "USD"\nbasis = "busy"\n[[gpu]]\nmodel = "T4"\nprice_per_hour = 1\npurchase_price = 9\n',
            "test.toml:6: [[gpu]] #1 price_per_hour: give price_per_hour or purchase_price",
        ),
        (
            HEAD + '[[gpu]]\nmodel = "T4"\npurchase_price = 9000\nlifetime_years = 3\n',
            "[[gpu]] #1 expected_utilisation: missing",
        ),
        (
            HEAD + '[[gpu]]\nmodel = "T4"\npurchase_price = 9000\nlifetime_years = 3\nexpected_utilisation = 1.5\n',
            "test.toml:8: [[gpu]] #1 expected_utilisation: 1.5 is above 1",
        ),
        (
            '[card]\ncurrency = "USD"\nbasis = "busy"\n[[gpu]]\nmodel = "T4"\nprice_per_hour = "0.1234567890123"\n',
            "more than 12 decimal places",
        ),
        (
            '[card]\ncurrency = "USD"\nbasis = "busy"\n[[gpu]]\nmodel = "T4"\nprice_per_hour = 1\npue = 0.9\n',
            "test.toml:7: [[gpu]] #1 pue: 0.9 is below 1",
        ),
        (
            HEAD + '[[gpu]]\nmodel = "T4"\nprice_per_hour = 1\neffective_from = "soon"\n',
            "'soon' is not a date",
        ),
        (
            '[card]\ncurrency = "USD"\nbasis = "busy"\n[[instance]]\ntype = "p9"\ngpu_model = "T4"\ngpus = 0\n',
            "test.toml:7: [[instance]] #1 gpus: 0",
        ),
        (
            '[card]\ncurrency = "USD"\nbasis = "busy"\n[[instance]]\ngpu_model = "T4"\ngpus = 1\n',
            "[[instance]] #1 type: missing",
        ),
        (
            '[card]\ncurrency = "USD"\nbasis = "busy"\n[[instance]]\ntype = "x"\ngpu_model = "T4"\ngpus = 1\n'
            "price_per_hour = 1\nvm_price_per_hour = 1\n",
            "give price_per_hour or vm_price_per_hour + gpu_price_per_hour",
        ),
        (
            '[card]\ncurrency = "USD"\nbasis = "busy"\n[[instance]]\ntype = "x"\ngpu_model = "T4"\ngpus = 1\n'
            '[[instance]]\ntype = "X"\ngpu_model = "L4"\ngpus = 1\n',
            "test.toml:10: [[instance]] #2 gpu_model: X was declared with 1 x T4 at test.toml:4",
        ),
        (
            '[card]\ncurrency = "USD"\nbasis = "busy"\n[[gpu]]\nmodel = "T4"\nprice_per_hour = 1\n'
            '[[gpu]]\nmodel = "T4"\nprice_per_hour = 2\neffective_from = 2026-01-01\n',
            "test.toml:7: [[gpu]] T4: its effective dates overlap the line at test.toml:4",
        ),
        (
            '[card]\ncurrency = "USD"\nbasis = "busy"\n[models.NEW]\nbasis = "user"\n',
            "test.toml:4: [models.NEW]: a new GPU model needs a factor",
        ),
        (
            '[card]\ncurrency = "USD"\nbasis = "busy"\n[models.T4]\nfactor = 0\n',
            "test.toml:5: [models.T4] factor: 0 must be positive",
        ),
        (
            '[card]\ncurrency = "USD"\nbasis = "busy"\n[aliases]\n"My GPU" = "Z9"\n',
            "test.toml:5: [aliases] My GPU: 'Z9' is not a GPU model key",
        ),
        ('[card]\ncurrency = "USD"\nbasis = "busy"\n[tarifs]\nx = 1\n', "test.toml:4: unknown table or key 'tarifs'"),
        (
            '[card\ncurrency = "USD"\n',
            "test.toml: not valid TOML: Expected ']' at the end of a table declaration (at line 1",
        ),
        ('[card]\nbasis = "busy"\n', "[card] currency: missing: write a 3-letter ISO 4217 code"),
        ('[card]\ncurrency = ""\nbasis = "busy"\n', "[card] currency: '' is not a 3-letter"),
        ('[card]\ncurrency = "USD"\n', '[card] basis: missing: write "allocated"'),
    ],
)
def test_malformed_cards_get_clear_errors(body: str, expected: str) -> None:
    with pytest.raises(RateCardError) as err:
        parse_rate_card(body, "test.toml")
    assert expected in str(err.value), str(err.value)


def test_inline_instance_arrays_point_at_their_own_line() -> None:
    body = '[[gpu]]\nmodel = "T4"\nprice_per_hour = 1\n'
    rows = '  { type = "a", gpu_model = "T4", gpus = 1 },\n  { type = "b", gpu_model = "T9", gpus = 1 },\n'
    text = f'instance = [\n{rows}]\n[card]\ncurrency = "USD"\nbasis = "busy"\n{body}'
    with pytest.raises(RateCardError) as err:
        parse_rate_card(text, "inline.toml")
    assert "inline.toml:3: [[instance]] #2 gpu_model: 'T9'" in str(err.value)


def test_loading_a_card_file_and_a_missing_one(tmp_path: Path) -> None:
    path = tmp_path / "rates.toml"
    path.write_text('[card]\ncurrency = "EUR"\nbasis = "allocated"\n[[gpu]]\nmodel = "L4"\nprice_per_hour = "0.70"\n')
    assert load_rate_card(path).currency == "EUR"
    with pytest.raises(RateCardError, match="cannot read the rate card"):
        load_rate_card(tmp_path / "nope.toml")
    assert load_rate_card(None) is default_rate_card()
