"""Debian's headless Chromium driven by Playwright, for the browser tests (never a downloaded browser)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"


def need_browser():
    """sync_playwright; in CI a missing browser or package fails the test, elsewhere it skips."""
    in_ci = bool(os.environ.get("CI"))
    if not os.path.exists(CHROMIUM):
        if in_ci:
            pytest.fail(f"{CHROMIUM} is missing in CI: apt-get install -y chromium")
        pytest.skip(f"{CHROMIUM} is not installed (apt-get install chromium) and CI is not set")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        if in_ci:
            pytest.fail("playwright is missing in CI: pip install playwright (never `playwright install`)")
        pytest.skip("the playwright package is not installed (pip install playwright)")
    return sync_playwright
