"""gpuledger's start-up hook for commands metered by ``gpuledger run`` (gpuledger/integrations/autoload).

Python imports this file at start-up because ``gpuledger run`` put its folder first on PYTHONPATH.
It installs the import hooks of gpuledger's integrations, then loads the sitecustomize it hides.
It never raises and never prints on its own: the program must start exactly as it would without it.
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _gpuledger_hooks() -> None:
    if not (os.environ.get("GPULEDGER_RUN_ID") and os.environ.get("GPULEDGER_CONTROL")):
        return
    if sys.version_info < (3, 10) or os.environ.get("GPULEDGER_AUTOLOAD") == "0":
        return
    try:
        from gpuledger.integrations.autoload import hooks
    except ImportError:
        # CMD runs a Python without gpuledger (another venv): use the copy this file belongs to.
        import importlib.util

        package = os.path.dirname(os.path.dirname(os.path.dirname(_HERE)))
        spec = importlib.util.spec_from_file_location(
            "gpuledger", os.path.join(package, "__init__.py"), submodule_search_locations=[package]
        )
        if spec is None or spec.loader is None:
            return
        module = importlib.util.module_from_spec(spec)
        sys.modules["gpuledger"] = module
        spec.loader.exec_module(module)
        from gpuledger.integrations.autoload import hooks
    hooks.install()


def _user_sitecustomize() -> None:
    """Import the sitecustomize this file hides; its errors surface as they would without us."""
    import importlib

    ours = sys.modules.pop("sitecustomize", None)
    # Our folder leaves sys.path for good: nothing else in it is meant for the program.
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    try:
        importlib.import_module("sitecustomize")
    except ImportError as exc:
        if exc.name != "sitecustomize":
            raise
        if ours is not None:
            sys.modules["sitecustomize"] = ours


try:
    _gpuledger_hooks()
except Exception:
    if os.environ.get("GPULEDGER_DEBUG"):
        import traceback

        traceback.print_exc()
_user_sitecustomize()
