"""The GPU tests' settings, checked here without a GPU, so that they cannot rot unseen: the
first GPU check (2026-11-27) found tests/gpu/test_cuda_strategies.py giving ``workers=2``
to pipeline, which refuses it, because nothing had run those settings without a GPU.

Every ``phalanx.train`` call of the GPU tests (their modules list them: ``every_run``,
``settings``) goes through what ``phalanx.train`` checks before it writes a run folder or
starts a process (:func:`phalanx.entry.api.prepare`: each setting, the strategy's spec, the
settings it would ignore, the placement, the data, the model), then the strategy's own
``check_job``. ``--device cuda:0`` stays as written: the placement is decided for a machine
with one CUDA device (``placement.device_count`` says 1), so the CPU only stands in for
the GPU where the data and the model are built. The GPU tests' one-line refusals are
checked to be refused with the words they expect.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from phalanx.cli import build_parser
from phalanx.entry.api import prepare
from phalanx.entry.flags import config_from_args
from phalanx.errors import ConfigError, PhalanxError
from phalanx.parallel.registry import check_flags_apply, spec
from phalanx.runtime import placement
from phalanx.runtime.placement import check_run, compute_world

GPU_TESTS = Path(__file__).resolve().parents[1] / "gpu"
OUT = Path("/nonexistent/gpu-settings")  # prepare() writes nothing: no folder is made


def load(name: str):
    """A module of tests/gpu, imported by its path (its own marks do not apply here)."""
    key = f"gpu_settings_{name}"
    if key not in sys.modules:
        found = importlib.util.spec_from_file_location(key, GPU_TESTS / f"{name}.py")
        module = importlib.util.module_from_spec(found)
        found.loader.exec_module(module)
        sys.modules[key] = module
    return sys.modules[key]


strategies = load("test_cuda_strategies")
ctr = load("test_cuda_ctr")
RUNS = {**strategies.every_run(OUT),
        **{f"ctr-{name}": ctr.settings(name, str(OUT / name)) for name in ctr.RUNS}}


@pytest.fixture
def one_gpu(monkeypatch):
    """This machine, as far as the placement is concerned, has one CUDA device."""
    monkeypatch.setattr(placement, "device_count", lambda: 1)


def accepted(options: dict):
    """What phalanx.train checks before training, then the strategy's own check_job."""
    cfg, strategy, job, _ = prepare(**options)
    strategy.check_job(job)
    return cfg, strategy, job


def test_the_gpu_tests_are_all_listed():
    # every parametrised GPU test's runs are in the list the checks below read
    assert {f"equal-{n}-{d}" for n in strategies.EQUAL for d in ("cuda:0", "cpu")} <= set(RUNS)
    assert {f"learn-{n}" for n in strategies.LEARN} <= set(RUNS)
    assert {"data-yes", "data-no", "data-cpu", "ctr-asp", "ctr-sync"} <= set(RUNS)
    assert len(RUNS) == 2 * len(strategies.EQUAL) + len(strategies.LEARN) + 3 + len(ctr.RUNS)


@pytest.mark.parametrize("name", list(RUNS))
def test_each_gpu_test_run_is_accepted(one_gpu, name):
    options = RUNS[name]
    try:
        cfg, strategy, job = accepted(options)
    except PhalanxError as e:
        pytest.fail(f"{name}: phalanx refuses the GPU test's settings: {e}")
    assert cfg.device == options["device"] and cfg.strategy == options["strategy"]
    if options["device"].startswith("cuda"):
        assert strategy.device.cuda, strategy.device.reason
        # two ranks share the one GPU: gloo, through pinned host buffers (the module's doc)
        assert check_run(cfg, strategy.world_size(cfg), strategy.device) == "gloo"
    # "2 ranks": each run computes on two processes (the servers of the PS aside)
    assert compute_world(cfg, strategy.world_size(cfg), strategy.device) == 2, name
    assert cfg.max_steps == options["max_steps"] and len(job.train) > 0


def test_the_checks_refuse_the_settings_the_first_gpu_check_failed_on(one_gpu):
    """The check above would have failed on the old settings: pipeline given workers=2."""
    old = {**strategies.BASE, "out": str(OUT / "old"), "device": "cuda:0",
           **strategies.EQUAL["pipeline-gpipe"]}
    assert old["workers"] == 2
    with pytest.raises(ConfigError, match=r"^--workers: --strategy pipeline does not use it"):
        accepted(old)
    # and a fixed worker count (single: 1) given another is refused too
    with pytest.raises(ConfigError, match=r"^--workers: --strategy single trains with 1"):
        accepted({**strategies.BASE, "out": str(OUT / "single"), "device": "cuda:0",
                  "strategy": "single"})


def refusal(argv: list[str]) -> str:
    args = build_parser().parse_args(["train", *argv, "--out", str(OUT / "cli")])
    cfg = config_from_args(args)
    check_flags_apply(cfg)
    s = spec(cfg.strategy)
    with pytest.raises(ConfigError) as e:
        check_run(cfg, s.world_size(cfg), s.device)
    return str(e.value)


def test_the_gpu_tests_refusals_are_refused_in_their_words(one_gpu):
    # test_nccl_for_ranks_sharing_a_gpu_is_one_line: its flags pass every other check
    assert refusal(strategies.NCCL_SHARED).startswith(
        "--backend nccl: 2 ranks would share a GPU")
    # test_unknown_device_index_is_one_line, on a machine with one device
    argv = ["--model", "mlp", "--data", "synthetic", "--device", "cuda:1", "--no-progress"]
    assert refusal(argv) == "--device cuda:1: this machine has 1 CUDA device(s), cuda:0..cuda:0"
