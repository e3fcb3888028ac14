"""``--memory-limit BYTES`` (issue 47) with real processes: each rank caps its address
space (RLIMIT_AS) before it builds its model; a run inside its budget trains as without
it, one past it stops with one line naming the limit (no traceback) and exit 2.
"""

from __future__ import annotations

import resource

import pytest

import phalanx
from phalanx.cli import main
from phalanx.runtime import memlimit
from phalanx.runtime.launch import spawn

SMALL = {"model": "gpt", "data": "shakespeare", "gpt_layers": 2, "gpt_dim": 32,
         "gpt_heads": 2, "context": 32, "train_limit": 2000, "test_limit": 64,
         "max_steps": 3, "batch_size": 8, "rule": "adamw", "workers": 2, "seed": 1,
         "progress": False, "tensorboard": False}


def test_inside_its_budget_a_run_trains_as_without_it(tmp_path):
    free = phalanx.train(strategy="zero", zero_stage=3, out=str(tmp_path / "free"), **SMALL)
    capped = phalanx.train(strategy="zero", zero_stage=3, memory_limit=400 << 20,
                           out=str(tmp_path / "capped"), **SMALL)
    a, b = free.model.state_dict(), capped.model.state_dict()
    assert all((a[k] == b[k]).all() for k in a)  # the limit changes nothing it allows


def _limit_seen(rank: int, world: int, out: str) -> None:
    """A rank under a 64 MB budget: the kernel's limit is the one recorded, a 32 MB
    tensor fits, a 256 MB one is refused and explained in one line."""
    import torch

    b = memlimit.apply(64 << 20)
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    small = torch.ones(8 << 20)  # 32 MB
    try:
        torch.ones(64 << 20)  # 256 MB
        line = "allocated"
    except Exception as e:  # noqa: BLE001 - what the launcher would turn into a line
        line = str(memlimit.explain(e, rank))
    with open(f"{out}/rank{rank}.txt", "w") as f:
        f.write(f"{soft == b.limit} {small.numel()} {line}")


def test_the_limit_is_the_kernels_and_a_refused_allocation_is_one_line(tmp_path):
    spawn(_limit_seen, 2, (str(tmp_path),))
    for r in range(2):
        text = (tmp_path / f"rank{r}.txt").read_text()
        assert text.startswith(f"True {8 << 20} --memory-limit 67108864: rank {r} ran out"), text
        assert "RLIMIT_AS" in text and "\n" not in text


@pytest.mark.parametrize("strategy", ["zero", "sync"])
def test_past_its_budget_a_run_stops_with_one_line(tmp_path, capsys, strategy):
    # the 12 x 512 GPT's weights alone are 152 MB per rank under sync and zero stage 1
    args = ["train", "--model", "gpt", "--data", "shakespeare", "--gpt-layers", "12",
            "--gpt-dim", "512", "--gpt-heads", "8", "--strategy", strategy, "--workers", "2",
            "--max-steps", "1", "--batch-size", "4", "--train-limit", "1000", "--test-limit", "16",
            "--memory-limit", "100000000", "--out", str(tmp_path / "run")]
    if strategy == "zero":
        args += ["--zero-stage", "1"]
    try:
        code = main(args)
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert "--memory-limit 100000000: rank" in err[0] and "ran out of its budget" in err[0]
