"""The oracle for model / pipeline / hybrid parallelism: plain single-process training of
the whole model on exactly the batches the parallel run sees.

With ``replicas`` R the batch of step t is the concatenation of every replica's batch t
(replica r walks shard r of R, like a data-parallel worker): one large-batch SGD step is
what R replicas averaging their gradients must equal.

Exactness needs the same intra-op thread count on both sides: PyTorch's CPU GEMM and
convolution kernels split their sums by thread, so one LeNet-5 gradient differs by up to
2e-6 between 1 and 2 threads, and SGD at lr 0.05 amplifies that ~1e4-fold in 10 steps
(issue #25: `--strategy single` with 2 threads vs model parallel's 1 thread per stage
differed by 2e-6 at step 20 and 8e-3 at step 30; at 1 thread each, bit for bit after 3
epochs).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from phalanx.data import epoch_batches
from phalanx.models.loss import TokenCrossEntropy
from phalanx.parallel.base import Job, detached
from phalanx.rules import apply_updates, make_rule


@dataclass
class Reference:
    losses: list[float]  # loss of step 1, 2, ... (mean over the whole, concatenated batch)
    state: dict[str, torch.Tensor]  # model state dict after the last step


def _batches(job: Job, rank: int, world: int):
    cfg = job.config
    shard = job.shard(rank, world)
    epoch = 0
    while True:
        yield from epoch_batches(shard, cfg.batch_size, epoch, cfg.seed)
        epoch += 1


def reference_training(job: Job, steps: int, replicas: int = 1, threads: int = 1) -> Reference:
    """Train ``job``'s model for ``steps`` steps in this process (no augmentation, no
    gradient accumulation: the parallel runs compared against it use neither), with
    ``threads`` intra-op threads: the workers' count (``--worker-threads``), since the CPU
    kernels' sums depend on it (module docstring)."""
    cfg = job.config
    if cfg.augment or cfg.grad_accum != 1:
        raise ValueError("reference_training compares runs without augment and grad_accum")
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return _train(job, steps, replicas)
    finally:
        torch.set_num_threads(before)


def _train(job: Job, steps: int, replicas: int) -> Reference:
    cfg = job.config
    model = job.build_model()
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    weights = detached(params)
    shard_len = len(job.shard(0, replicas))
    rule = make_rule(cfg, job.planned_steps(shard_len))
    state = rule.init(weights)
    streams = [_batches(job, r, replicas) for r in range(replicas)]
    loss_fn = TokenCrossEntropy()
    losses = []
    for _ in range(steps):
        idx = torch.cat([next(s) for s in streams])
        loss = loss_fn(model(job.train.x[idx]), job.train.y[idx])
        grads = torch.autograd.grad(loss, params)
        updates, state = rule.update(list(grads), state, weights)
        apply_updates(weights, updates)
        losses.append(loss.item())
    return Reference(losses, {k: v.detach().clone() for k, v in model.state_dict().items()})


def max_state_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """Largest absolute difference between two state dicts with the same keys."""
    if a.keys() != b.keys():
        raise ValueError(f"state dicts differ in keys: {sorted(a.keys() ^ b.keys())}")
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a if a[k].numel())


def logged_losses(history: list[dict], rank: int | None = None) -> dict[int, float]:
    """step -> loss of the ``train`` events in an event history (of one rank if given)."""
    return {e["step"]: e["loss"] for e in history
            if e.get("kind") == "train" and (rank is None or e.get("rank") == rank)}
