"""In CI a missing extra or tool fails its tests: no test may skip on a missing import by itself.

``pytest.importorskip`` skips everywhere, CI included, so a dropped extra (grpcio, pyarrow) would
turn its tests into silent skips; ci_support.need_module / missing() skip only outside CI.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
IMPORTORSKIP = "importorskip"


def test_no_test_skips_on_a_missing_import_in_ci() -> None:
    offenders = [
        f"{path.name}:{n}"
        for path in sorted(TESTS.rglob("*.py"))
        if path.name != Path(__file__).name
        for n, line in enumerate(path.read_text().splitlines(), start=1)
        if re.search(rf"\.{IMPORTORSKIP}\(", line)
    ]
    assert offenders == [], "use ci_support.need_module (fails in CI) instead of pytest.importorskip"


MISSING_EXTRA = """
from importlib.util import find_spec
from ci_support import missing
if find_spec("surely_not_an_installed_module_xyz") is None:
    missing("the example extra", "pip install example")
def test_never_runs():
    pass
"""


def run_pytest(tmp_path: Path, ci: str | None) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_needs_extra.py").write_text(MISSING_EXTRA)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci is not None:
        env["CI"] = ci
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path / "test_needs_extra.py")],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120,
    )  # fmt: skip


def test_a_module_missing_its_extra_skips_outside_ci_and_fails_in_ci(tmp_path: Path) -> None:
    outside = run_pytest(tmp_path, None)
    assert outside.returncode == 5 and "1 skipped" in outside.stdout, outside.stdout  # 5: nothing ran
    inside = run_pytest(tmp_path, "1")
    assert inside.returncode != 0, inside.stdout
    assert "missing in CI" in inside.stdout and "pip install example" in inside.stdout
