"""Shared test set-up: one intra-op thread (2 cores are shared by many processes), and
Ctrl-C reaches the commands the tests start."""

import signal

import torch

torch.set_num_threads(1)

# a suite started in the background by a shell without job control inherits SIGINT ignored,
# and so would every command it starts (Python keeps an ignored SIGINT ignored): the tests
# that send SIGINT to a command would see it run on to the end. A handler here is reset to
# the default in each child at exec, where Python installs its own.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` need CUDA: without it they are skipped, saying so."""
    import pytest

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="CUDA not available")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
