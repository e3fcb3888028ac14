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
LONGEST_FIRST = (  # seconds: a loaded (load ~9) two-worker run, 2026-11-29
    "tests/cluster/test_ray_live.py",            # 226 s
    "tests/distributed/test_gpt_workloads.py",   # 145 s
    "tests/cluster/test_slurm_live.py",          # 139 s
    "tests/cluster/test_live_elastic.py",        # 127 s
    "tests/e2e/test_compare_experiments.py",     # 88 s
    "tests/cluster/test_live_types.py",          # 82 s
    "tests/unit/test_gpu_check.py",              # 75 s
    "tests/distributed/test_fork_server.py",     # 58 s
    "tests/multinode/test_strategies.py",        # 55 s
    "tests/conformance/test_strategy_conformance.py",  # 40 s
    "tests/distributed/test_ps_preempt.py",      # 39 s
    "tests/chaos/test_chaos_run.py",             # ~40-50 s (one seeded chaos run)
    "tests/cluster/test_live.py",                # 37 s
    "tests/distributed/test_sync_ddp.py",        # 37 s
    "tests/cluster/test_live_restart.py",        # 36 s
    "tests/multinode/test_node_loss.py",         # 33 s
    "tests/distributed/test_signals.py",         # 33 s
    "tests/e2e/test_cli.py",                     # 33 s
    "tests/distributed/test_zero.py",            # 30 s
    "tests/distributed/test_startup_death.py",   # 29 s
    "tests/cluster/test_resize_ps.py",           # 28 s
    "tests/distributed/test_precision.py",       # 27 s (59 s before its batch of 16)
    "tests/e2e/test_dashboard_browser.py",       # 27 s
    "tests/distributed/test_zero_resize.py",     # ~17 s alone
    "tests/distributed/test_sync_faults.py",     # 24 s
)


def pytest_addoption(parser):
    parser.addoption("--file-order-seed", type=int, default=None,
                     help="hand out the test files in an order shuffled with this seed "
                          "(the tests of a file keep theirs) instead of longest first: "
                          "tools/flakes.py's random order")


def pytest_collection_modifyitems(config, items):
    """The longest files first (``LONGEST_FIRST``; the rest keep their order), or the files
    shuffled (``--file-order-seed``). Tests marked ``gpu`` need CUDA: without it they are
    skipped, saying so."""
    import random

    import pytest

    seed = config.getoption("--file-order-seed")
    if seed is None:
        rank = {f: i for i, f in enumerate(LONGEST_FIRST)}
    else:
        files = sorted({item.nodeid.split("::")[0] for item in items})
        random.Random(seed).shuffle(files)
        rank = {f: i for i, f in enumerate(files)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="CUDA not available")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
