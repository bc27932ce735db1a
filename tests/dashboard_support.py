"""Helpers for the dashboard browser test: a real uvicorn server in a subprocess, Chromium pages."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from browser_support import ARTIFACTS
from prom_support import free_port, http_get


@contextmanager
def uvicorn_server(db_url: str, log: Path) -> Iterator[str]:
    """``gpuledger.server.app:app_from_env`` under uvicorn on a free port of 127.0.0.1; yields its URL."""
    port = free_port()
    env = dict(os.environ, GPULEDGER_SERVER_DB=db_url, GPULEDGER_TOKEN_CACHE_S="0")
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "uvicorn",
                "--factory",
                "gpuledger.server.app:app_from_env",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--log-level",
                "warning",
            ],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                http_get(url + "/healthz", timeout=1)
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the server did not start:\n" + log.read_text()) from None
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def wait_js(page, expr: str, timeout: float = 20.0, what: str | None = None):
    """Poll a JS expression from outside the page (the dashboard's CSP forbids the eval that
    Playwright's wait_for_function needs)."""
    deadline = time.monotonic() + timeout
    while True:
        value = page.evaluate(expr)
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what or expr}")
        time.sleep(0.25)


def wait_for(check: Callable[[], object], timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.25)


def watch(page, origin: str) -> list[str]:
    """Console errors and warnings, page errors, dialogs and any request leaving ``origin``."""
    problems: list[str] = []
    page.on(
        "console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type in ("error", "warning") else None
    )
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("dialog", lambda d: (problems.append(f"dialog: {d.message}"), d.dismiss()))
    page.on(
        "request",
        lambda r: problems.append(f"network: {r.url}") if not r.url.startswith((origin + "/", "data:")) else None,
    )
    return problems


def shot(page, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / name), full_page=True)
