"""Zero-code capture: the sitecustomize ``gpuledger run`` puts in front of CMD's Python."""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from ci_support import need_module
from gpuledger.integrations.autoload import SITE_DIR, autoload_env

SRC = str(Path(__file__).resolve().parents[1] / "src")
RUN_ENV = {"GPULEDGER_RUN_ID": "01a20000-0000-7000-8000-000000000000", "GPULEDGER_CONTROL": "/nonexistent.sock"}

PROBE = """
import sys
print("finders", [type(f).__name__ for f in sys.meta_path])
print("sitedir_on_path", any(p.endswith("sitedir") for p in sys.path))
print("user_site", getattr(sys.modules.get("sitecustomize"), "USER_MARK", None))
"""


def _python(
    code: str, pythonpath: list[str], extra: dict[str, str] | None = None, python: str = sys.executable
) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULEDGER_")}
    env["PYTHONPATH"] = os.pathsep.join(pythonpath)
    env.update(extra or {})
    return subprocess.run([python, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def test_autoload_env_puts_the_site_dir_first_once() -> None:
    env = autoload_env({"PYTHONPATH": "/mine"})
    assert env == {"PYTHONPATH": os.pathsep.join([SITE_DIR, "/mine"])}
    assert autoload_env(env) == {}  # a gpuledger run inside a gpuledger run
    assert autoload_env({"GPULEDGER_AUTOLOAD": "0"}) == {}
    assert [f for f in os.listdir(SITE_DIR) if f.endswith(".py")] == ["sitecustomize.py"]  # nothing else to shadow


@pytest.fixture
def user_site(tmp_path: Path) -> Path:
    folder = tmp_path / "user"
    folder.mkdir()
    (folder / "sitecustomize.py").write_text("USER_MARK = 'loaded'\n")
    return folder


def test_outside_gpuledger_nothing_is_installed_and_the_users_sitecustomize_still_loads(user_site: Path) -> None:
    out = _python(PROBE, [SITE_DIR, str(user_site), SRC])
    assert out.returncode == 0, out.stderr
    assert "PostImportFinder" not in out.stdout
    assert "user_site loaded" in out.stdout and "sitedir_on_path False" in out.stdout
    assert out.stderr == ""


def test_inside_gpuledger_run_the_hook_is_installed_and_chains(user_site: Path) -> None:
    out = _python(PROBE, [SITE_DIR, str(user_site), SRC], RUN_ENV)
    assert out.returncode == 0, out.stderr
    assert "PostImportFinder" in out.stdout and "user_site loaded" in out.stdout
    assert out.stderr == ""


def test_a_broken_user_sitecustomize_fails_as_it_would_without_gpuledger(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text("raise ValueError('user bug')\n")
    out = _python("print('program ran')", [SITE_DIR, str(tmp_path), SRC], RUN_ENV)
    bare = _python("print('program ran')", [str(tmp_path), SRC])
    assert out.returncode == bare.returncode == 0
    assert out.stdout == bare.stdout == "program ran\n"
    assert "Error in sitecustomize" in out.stderr and "user bug" in out.stderr
    assert "Error in sitecustomize" in bare.stderr


def test_ultralytics_trainers_get_the_callbacks_only_inside_a_run() -> None:
    need_module("ultralytics", "pip install -r requirements-test.txt")
    code = (
        "from ultralytics.utils.callbacks import base\n"
        "from gpuledger.integrations.ultralytics.callbacks import CALLBACKS\n"
        "print(all(fn in base.default_callbacks[e] for e, fn in CALLBACKS.items()))\n"
        "print(sum(fn is CALLBACKS['on_fit_epoch_end'] for fn in base.get_default_callbacks()['on_fit_epoch_end']))\n"
    )
    inside = _python(code, [SITE_DIR, SRC], RUN_ENV)
    outside = _python(code, [SITE_DIR, SRC])
    assert inside.stdout.split() == ["True", "1"], inside.stderr
    assert outside.stdout.split() == ["False", "0"], outside.stderr


def test_a_python_without_gpuledger_uses_the_copy_next_to_the_hook(tmp_path: Path) -> None:
    venv.create(tmp_path / "venv", with_pip=False)
    python = str(tmp_path / "venv" / "bin" / "python")
    code = PROBE + "import gpuledger; print('from', gpuledger.__file__)\n"
    out = _python(code, [SITE_DIR], RUN_ENV, python=python)
    assert out.returncode == 0, out.stderr
    assert "PostImportFinder" in out.stdout
    assert f"from {Path(SITE_DIR).parents[2] / '__init__.py'}" in out.stdout
