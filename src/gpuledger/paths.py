"""Where gpuledger keeps its files on this machine."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path


def data_dir(env: Mapping[str, str] | None = None) -> Path:
    """``$GPULEDGER_HOME``, else ``$XDG_DATA_HOME/gpuledger``, else ``~/.local/share/gpuledger``."""
    env = os.environ if env is None else env
    if env.get("GPULEDGER_HOME"):
        return Path(env["GPULEDGER_HOME"]).expanduser()
    if env.get("XDG_DATA_HOME"):
        return Path(env["XDG_DATA_HOME"]).expanduser() / "gpuledger"
    home = env.get("HOME")
    return (Path(home) if home else Path.home()) / ".local" / "share" / "gpuledger"


def cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """Files gpuledger can rebuild (dataset file hashes, compiled Hyperscan databases): ``$GPULEDGER_HOME/cache``, else
    ``$XDG_CACHE_HOME/gpuledger``, else ``~/.cache/gpuledger``."""
    env = os.environ if env is None else env
    if env.get("GPULEDGER_HOME"):
        return Path(env["GPULEDGER_HOME"]).expanduser() / "cache"
    if env.get("XDG_CACHE_HOME"):
        return Path(env["XDG_CACHE_HOME"]).expanduser() / "gpuledger"
    home = env.get("HOME")
    return (Path(home) if home else Path.home()) / ".cache" / "gpuledger"


def log_dir(env: Mapping[str, str] | None = None) -> Path:
    path = data_dir(env) / "logs"
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path
