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


# the files that take longest, longest first (a fresh-clone run's durations, issue 33):
# ``make test`` hands whole files to two workers in collection order
# (``--no-loadscope-reorder``), so these start first and the last files handed out are
# short ones. xdist's own order (most tests first) handed out the Ray and Slurm files, a
# few long tests each, last: one worker ran them alone at the end while the other idled.
LONGEST_FIRST = (
    "tests/cluster/test_ray_live.py",
    "tests/e2e/test_compare_experiments.py",
    "tests/cluster/test_slurm_live.py",
    "tests/unit/test_gpu_check.py",
    "tests/distributed/test_gpt_workloads.py",
    "tests/cluster/test_live_elastic.py",
    "tests/distributed/test_signals.py",
    "tests/e2e/test_cli.py",
    "tests/distributed/test_startup_death.py",
    "tests/multinode/test_strategies.py",
    "tests/cluster/test_cli_e2e.py",
    "tests/cluster/test_resize_ps.py",
    "tests/cluster/test_learned.py",
    "tests/cluster/test_live_restart.py",
    "tests/cluster/test_live_types.py",
    "tests/cluster/test_live.py",
)


def pytest_collection_modifyitems(config, items):
    """The longest files first (``LONGEST_FIRST``; the rest keep their order). Tests
    marked ``gpu`` need CUDA: without it they are skipped, saying so."""
    import pytest

    rank = {f: i for i, f in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="CUDA not available")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
