"""Downpour's worker on the in-process transport, checked by value: each push carries the SUM
of its --npush gradients (not the last one), and the local steps between fetches follow
the learning-rate schedule step by step (a step-decay schedule, so a constant or shifted
lr is caught). The real-process version of the local-step check is
tests/distributed/test_downpour_local.py."""

from __future__ import annotations

import threading
from pathlib import Path

import torch

from phalanx.comm.transport import InProcNetwork
from phalanx.config import RunConfig
from phalanx.entry.api import make_job
from phalanx.metrics import EventLog
from phalanx.parallel.ps import server_main
from phalanx.parallel.ps_worker import PSWorker
from phalanx.ps.partition import flat_dense
from phalanx.ps.server import Layout

NFETCH, NPUSH, STEPS, LR, STEP_SIZE, GAMMA = 3, 2, 13, 0.05, 2, 0.5


def lr_at(step: int) -> float:
    """The schedule the worker must follow, written out here (not taken from phalanx)."""
    return LR * GAMMA ** (step // STEP_SIZE)


class Recording(PSWorker):
    """Records every training step's weights and gradient, and every push."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.weights: list[torch.Tensor] = []
        self.fetched: list[bool] = []
        self.grads: list[torch.Tensor] = []
        self.pushes: list[torch.Tensor] = []
        self._fetch = False
        self._grad: list[torch.Tensor | None] = [None] * len(self.params)
        self.model.register_forward_pre_hook(self._computing)
        for i, p in enumerate(self.params):
            p.register_hook(lambda g, i=i: self._on_grad(i, g))
        push = self.client.push

        def recording_push(clock, dense_grad, *args, **kwargs):
            self.pushes.append(dense_grad.detach().clone())
            return push(clock, dense_grad, *args, **kwargs)

        self.client.push = recording_push

    def pull(self, rows, dense, resume=False):
        super().pull(rows, dense, resume)
        self._fetch = self._fetch or dense

    def _on_grad(self, i: int, g: torch.Tensor) -> None:
        self._grad[i] = g.detach().clone()
        if all(x is not None for x in self._grad):
            self.grads.append(flat_dense(self.part, self._grad))
            self._grad = [None] * len(self.params)

    def _computing(self, module, inputs) -> None:
        if module.training:
            self.weights.append(torch.cat([p.detach().reshape(-1) for p in self.params]))
            self.fetched.append(self._fetch)
            self._fetch = False


def _run(tmp_path: Path, nfetch: int = NFETCH) -> Recording:
    cfg = RunConfig.from_mapping({
        "strategy": "downpour", "model": "mlp", "data": "synthetic", "batch_size": 16,
        "max_steps": STEPS, "lr": LR, "schedule": "step", "step_size": STEP_SIZE,
        "gamma": GAMMA, "rule": "sgd", "workers": 1, "servers": 1, "nfetch": nfetch,
        "npush": NPUSH, "progress": False, "tensorboard": False, "eval_every": 10**6,
        "out": str(tmp_path / "run"), "ps_timeout": 30.0}).validate()
    job = make_job(cfg)
    job.run_dir.mkdir(parents=True, exist_ok=True)
    layout = Layout(1, 1)
    net = InProcNetwork(layout.world)
    errors: list[BaseException] = []
    server = threading.Thread(target=lambda: _guard(errors, server_main, job, net.transport(0),
                                                    layout, 0, EventLog(None, rank=0)))
    server.start()
    worker = Recording(job, net.transport(1), layout, 0, EventLog(None, rank=1))
    try:
        worker.run()
    finally:
        server.join(60)
    assert not errors, errors
    return worker


def _guard(errors: list, fn, *args) -> None:
    try:
        fn(*args)
    except BaseException as e:  # noqa: BLE001 - re-raised in the test thread
        errors.append(e)


def test_pushes_carry_the_sum_and_local_steps_follow_the_schedule(tmp_path: Path) -> None:
    w = _run(tmp_path)
    assert len(w.grads) == STEPS and len(w.weights) == STEPS
    # every NPUSH steps (and at the end) the sum of that window's gradients
    windows = [range(s, min(s + NPUSH, STEPS)) for s in range(0, STEPS, NPUSH)]
    assert len(w.pushes) == len(windows)
    for push, window in zip(w.pushes, windows):
        want = sum(w.grads[s] for s in window)
        assert torch.allclose(push, want, atol=1e-6), (window, (push - want).abs().max())
        if len(window) > 1:  # not just the last one
            assert not torch.allclose(push, w.grads[window[-1]], atol=1e-4)
    # a fetch every NFETCH steps; in between, w_s = w_{s-1} - lr(s-1) g_{s-1}
    assert [s for s in range(STEPS) if w.fetched[s]] == list(range(0, STEPS, NFETCH))
    for s in range(STEPS):
        if w.fetched[s]:
            continue
        want = w.weights[s - 1] - lr_at(s - 1) * w.grads[s - 1]
        assert torch.allclose(w.weights[s], want, atol=1e-7), (s, (w.weights[s] - want).abs())
        moved = (w.weights[s] - w.weights[s - 1]).abs().max()
        assert moved > 1e-5  # the local step really moved the weights


def test_a_fetch_period_of_two_has_one_local_step(tmp_path: Path) -> None:
    w = _run(tmp_path, nfetch=2)
    assert [s for s in range(STEPS) if w.fetched[s]] == list(range(0, STEPS, 2))
    for s in range(1, STEPS, 2):
        want = w.weights[s - 1] - lr_at(s - 1) * w.grads[s - 1]
        assert torch.allclose(w.weights[s], want, atol=1e-7), s
