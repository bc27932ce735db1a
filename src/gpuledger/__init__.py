"""gpuledger: meter, archive and price GPU training runs."""

__version__ = "0.1.0"

__all__ = ["__version__", "track"]


def track(**kwargs):
    """Meter the current process: ``with gpuledger.track(project="p") as run: ...``."""
    from gpuledger.api import track as _track

    return _track(**kwargs)
