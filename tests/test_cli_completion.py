"""``gpuledger completion bash|zsh|fish``: the script, and real bash completing with it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ci_support import missing
from e2e_helpers import GPULEDGER


def _script(shell: str) -> str:
    out = subprocess.run([*GPULEDGER, "completion", shell], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def _bash_complete(words: list[str]) -> list[str]:
    """COMPREPLY after Tab on ``words`` (the last one being completed), in a real bash."""
    bash = shutil.which("bash")
    if bash is None:
        missing("bash", "apt-get install bash")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    array = " ".join(f"'{w}'" for w in words)
    code = (f'eval "$(gpuledger completion bash)"; COMP_WORDS=({array}); COMP_CWORD={len(words) - 1}; '
            '_gpuledger_completion gpuledger; printf "%s\\n" "${COMPREPLY[@]}"')  # fmt: skip
    out = subprocess.run([bash, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_bash_completes_commands_options_and_choices() -> None:
    assert shutil.which("gpuledger", path=str(Path(sys.executable).parent))  # the installed entry point
    assert _bash_complete(["gpuledger", "ru"]) == ["run", "runs"]
    assert _bash_complete(["gpuledger", "runs", "--sta"]) == ["--status"]
    assert "succeeded" in _bash_complete(["gpuledger", "runs", "--status", ""])
    assert "capacity" in _bash_complete(["gpuledger", "report", ""])  # a subcommand attached lazily


@pytest.mark.parametrize("shell", ["zsh", "fish"])
def test_zsh_and_fish_scripts_ask_gpuledger(shell: str) -> None:
    script = _script(shell)
    assert f"_GPULEDGER_COMPLETE={shell}_complete" in script and "gpuledger" in script


def test_an_unknown_shell_is_one_error_line() -> None:
    out = subprocess.run([*GPULEDGER, "completion", "tcsh"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip().splitlines()[-1].startswith("Error: Invalid value")
