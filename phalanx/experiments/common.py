"""Shared set-up of the studies: one base configuration, quick (CI-sized) or full."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from phalanx.config import RunConfig
from phalanx.experiments.compare import plan_evals


def base_config(out: Path, *, quick: bool, data: str | None, seed: int, **overrides: Any
                ) -> RunConfig:
    """Quick: MLP on 2,000 synthetic samples, one epoch (CI-sized). Full: LeNet-5 on
    Fashion-MNIST for 2 epochs."""
    if quick:
        cfg = RunConfig(model="mlp", data=data or "synthetic", epochs=1, batch_size=32,
                        train_limit=2000,
                        lr=0.05, seed=seed, out=str(out), progress=False, tensorboard=False,
                        threads=1)
    else:
        cfg = RunConfig(model="lenet5", data=data or "fashion-mnist", epochs=2, batch_size=32,
                        lr=0.05, seed=seed, out=str(out), progress=False, threads=1)
    for key, value in overrides.items():
        setattr(cfg, key, value)
    return cfg


def variant(base: RunConfig, out: Path, label: str, **changes: Any) -> tuple[str, RunConfig]:
    cfg = dataclasses.replace(base, out=str(out / label.replace(" ", "_")), **changes)
    return label, plan_evals(cfg).validate()


def verdict_block(claim: str, measured: str, holds: bool | None | str) -> str:
    """``holds``: True/False/None, or a word of :mod:`phalanx.experiments.stats`."""
    if isinstance(holds, str):
        holds = {"holds": True, "does not hold": False}.get(holds)
    word = {True: "**holds**", False: "**does not hold here**", None: "is **inconclusive**"}[holds]
    return f"**Claim.** {claim}\n\n**Measured.** {measured}\n\n**Verdict.** The claim {word}."
