"""phalanx: distributed deep learning under every synchronisation protocol, and a
topology-aware scheduler for DL jobs on GPU clusters."""

__version__ = "0.1.0"


def train(*args, **kwargs):
    """See :func:`phalanx.entry.api.train` (imported lazily so ``import phalanx`` stays cheap)."""
    from phalanx.entry.api import train as _train

    return _train(*args, **kwargs)


__all__ = ["train", "__version__"]
