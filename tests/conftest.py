"""Shared test set-up: one intra-op thread (2 cores are shared by many processes)."""

import torch

torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` need CUDA: without it they are skipped, saying so."""
    import pytest

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="CUDA not available")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
