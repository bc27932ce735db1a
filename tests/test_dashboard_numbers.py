"""The dashboard formats numbers and short ids exactly as the CLI does.

The dashboard's pages carry no data: the browser reads the JSON API and formats it with
static/fmt.js. Here Debian's Chromium runs that script on values drawn by hypothesis and every
string must equal core/units.py's (and core/ids.short_id's) for the same value.
"""

from __future__ import annotations

import math
from decimal import Decimal
from importlib import resources

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from browser_support import ARGS, CHROMIUM, need_browser
from gpuledger.core import units
from gpuledger.core.ids import short_id

FMT_JS = resources.files("gpuledger.server.dashboard").joinpath("static/fmt.js").read_text(encoding="utf-8")
SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def page():
    sync_playwright = need_browser()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        pg = browser.new_page()
        pg.set_content("<!doctype html><title>fmt</title>")
        pg.add_script_tag(content=FMT_JS)
        yield pg
        browser.close()


def _js(page, fn: str, values: list, *extra) -> list[str]:
    return page.evaluate(
        "([fn, values, extra]) => values.map(v => window.GLFmt[fn](v, ...extra))", [fn, values, list(extra)]
    )


# Magnitudes a ledger shows: from a few nanoseconds' worth of GPU-hours to a fleet's year.
def _spread() -> st.SearchStrategy[float]:
    scaled = st.tuples(
        st.floats(min_value=1.0, max_value=10.0, allow_nan=False), st.integers(min_value=-10, max_value=11)
    ).map(lambda t: t[0] * 10.0 ** t[1])
    edges = st.sampled_from(
        [0.0, 9.995, 9.996, 0.0099996, 99.95, 999.5, 1000.0, 0.00999949, 59.95, 2.675, 1.125, 1234.5, 1e-9]
    )
    signed = st.tuples(st.one_of(scaled, edges), st.booleans()).map(lambda t: -t[0] if t[1] else t[0])
    return st.one_of(signed, st.floats(min_value=-1e6, max_value=1e6, allow_nan=False))


@SETTINGS
@given(st.lists(_spread(), min_size=1, max_size=60))
def test_quantities_read_as_the_cli_prints_them(page, values: list[float]) -> None:
    assert _js(page, "number", values) == [units.fmt_number(v) for v in values]
    assert _js(page, "kwh", values) == [units.fmt_kwh(v) for v in values]
    assert _js(page, "seconds", values) == [units.fmt_seconds(v) for v in values]
    assert _js(page, "gpuSeconds", values) == [units.fmt_gpu_seconds(v) for v in values]
    assert _js(page, "duration", values) == [units.fmt_duration(v) for v in values]
    assert _js(page, "change", values) == [units.fmt_change(v) for v in values]


@SETTINGS
@given(st.lists(st.floats(min_value=-2.0, max_value=2.0, allow_nan=False), min_size=1, max_size=60))
def test_shares_read_as_the_cli_prints_them(page, ratios: list[float]) -> None:
    ratios += [0.0005, 0.0004999, 0.0995, 0.125, 0.995]
    assert _js(page, "pct", ratios) == [units.fmt_pct(r) for r in ratios]
    assert _js(page, "percent", ratios) == [units.fmt_percent(r) for r in ratios]


@SETTINGS
@given(
    st.lists(
        st.decimals(min_value=Decimal("-1e9"), max_value=Decimal("1e9"), places=21, allow_nan=False),
        min_size=1,
        max_size=60,
    )
)
def test_money_reads_as_the_cli_prints_it(page, amounts: list[Decimal]) -> None:
    texts = [format(a, "f") for a in amounts] + ["0.0049", "0.005", "0.015", "0.025", "0.00", "1234.565", "0.0000125"]
    assert _js(page, "money", texts, "USD") == [units.fmt_money(t, "USD") for t in texts]
    assert _js(page, "money", texts) == [units.fmt_money(t) for t in texts]


@SETTINGS
@given(st.lists(st.integers(min_value=0, max_value=2**62), min_size=1, max_size=60))
def test_bytes_and_counts_read_as_the_cli_prints_them(page, sizes: list[int]) -> None:
    sizes += [1023, 1024, 1048575, 10239, 1023 * 2**30 + 2**29]
    assert _js(page, "bytes", sizes) == [units.fmt_bytes(n) for n in sizes]
    small = [n % 5000 for n in sizes]
    assert _js(page, "count", small, "run") == [units.fmt_count(n, "run") for n in small]


@SETTINGS
@given(st.lists(st.uuids(), min_size=1, max_size=60))
def test_short_ids_are_the_clis(page, ids: list) -> None:
    texts = [str(u) for u in ids] + ["not-a-uuid", "01900000-0000-7000-8000-0000000000A1"]
    assert _js(page, "shortId", texts) == [short_id(t) for t in texts]


def test_absent_is_na_never_zero(page) -> None:
    absent = [None, "", float("nan"), float("inf")]
    shown = page.evaluate(
        "() => [null, '', NaN, Infinity].map(v => [GLFmt.number(v), GLFmt.pct(v), GLFmt.kwh(v), GLFmt.money(v)])"
    )
    assert all(cell == "n/a" for row in shown for cell in row), shown
    assert all(units.fmt_number(v) == "n/a" for v in absent if not isinstance(v, str))
    assert math.isnan(float("nan"))
