"""Post-import hooks: gpuledger's set-up for a library runs right after the program imports it.

Installed at start-up by ``sitedir/sitecustomize.py``; costs nothing until a target module is
imported. A hook that fails is ignored: the program's import must succeed regardless.
"""

from __future__ import annotations

import importlib.abc
import os
import sys
from collections.abc import Callable, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType


def _ultralytics(module: ModuleType) -> None:
    from gpuledger.integrations.ultralytics.callbacks import install

    install(module.default_callbacks)  # every trainer created from now on gets gpuledger's callbacks


def _ultralytics_benchmarks(module: ModuleType) -> None:
    from gpuledger.integrations.ultralytics.evaluation import wrap_benchmark

    module.benchmark = wrap_benchmark(module.benchmark)  # type: ignore[attr-defined]  # yolo benchmark, model.benchmark()


# module name -> set-up run right after that module is executed
TARGETS: dict[str, Callable[[ModuleType], None]] = {
    "ultralytics.utils.callbacks.base": _ultralytics,
    "ultralytics.utils.benchmarks": _ultralytics_benchmarks,
}


def _run(hook: Callable[[ModuleType], None], module: ModuleType) -> None:
    try:
        hook(module)
    except Exception:
        if os.environ.get("GPULEDGER_DEBUG"):
            import traceback

            traceback.print_exc()


class PostImportFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: asks the other finders, then wraps the target's exec_module."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        hook = TARGETS.get(fullname)
        if hook is None:
            return None
        spec = None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                break
        loader = getattr(spec, "loader", None)
        exec_module = getattr(loader, "exec_module", None)
        if exec_module is None:
            return spec

        def exec_then_hook(module: ModuleType) -> None:
            exec_module(module)
            _run(hook, module)

        loader.exec_module = exec_then_hook  # type: ignore[union-attr]  # this module's loader only
        return spec


def install() -> None:
    if not any(isinstance(f, PostImportFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, PostImportFinder())
    for name, hook in TARGETS.items():  # imported before we were installed
        if name in sys.modules:
            _run(hook, sys.modules[name])
