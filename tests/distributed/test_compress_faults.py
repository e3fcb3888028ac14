"""An injected inf and an injected overflow under every compressor, with real processes:
sync (2 ranks), averaging (2 ranks) and the parameter server (1 shard, 2 workers).

The second rank / worker's gradient of the first layer's bias gets ``inf`` at its 2nd
backward and a value beyond the codec's range at its 4th (fp16: 2e5 > 65504; bf16: 3.39e38;
the float32 codecs: 3e38 > 2^126); under averaging, whose messages are parameter deltas,
the bias itself is set to -inf and -big at those steps. The bias sinks (its unit's ReLU goes
quiet), so the run can go on. Each must: finish (no exception, finite weights, a summary),
keep every residual finite, and count what happened: one skipped message (sync / averaging:
``contributions_skipped``; PS: ``pushes_skipped`` and the shard's ``pushes_rejected``) and
the clipped values (``values_clipped``). One spawn per strategy runs every codec."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from phalanx.comm import exchange
from phalanx.config import RunConfig
from phalanx.data import load_data
from phalanx.entry.api import make_job
from phalanx.parallel import model_averaging, ps, replicas, sync_dp
from phalanx.parallel.base import Job, read_result
from phalanx.runtime.launch import spawn

STEPS, INF_AT, BIG_AT, LR = 8, 2, 4, 0.05
GROUP_CODECS = ["fp16", "bf16", "int8", "topk:0.1", "randk:0.1", "powersgd:2"]
PS_CODECS = ["none", "fp16", "bf16", "int8", "topk:0.1", "randk:0.1"]


def big_for(compress: str) -> float:
    return {"fp16": 2e5, "bf16": 3.39e38}.get(compress, 3e38)


def _injecting(job: Job, into_weights: bool) -> None:
    """This process's models get the injection: on the first layer's bias gradient, or
    (averaging, whose messages are parameter deltas) its value, set to -inf / -big."""
    build = job.build_model
    big = big_for(job.config.compress)

    def build_model():
        model = build()
        bias = list(model.parameters())[1]
        calls = [0]

        def hook(g: torch.Tensor) -> torch.Tensor:
            calls[0] += 1
            if calls[0] in (INF_AT, BIG_AT):
                g = g.clone()
                g[0] = float("inf") if calls[0] == INF_AT else big
            return g

        def set_weight(module, inputs) -> None:
            calls[0] += module.training
            if module.training and calls[0] in (INF_AT, BIG_AT):
                with torch.no_grad():
                    bias[0] = -float("inf") if calls[0] == INF_AT else -big

        if into_weights:
            model.register_forward_pre_hook(set_weight)
        else:
            bias.register_hook(hook)
        return model

    job.build_model = build_model


def _recording() -> list:
    """Every Compression this process makes (to check its residuals at the end)."""
    made: list = []
    init = exchange.Compression.__init__

    def recording_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        made.append(self)

    exchange.Compression.__init__ = recording_init
    return made


def _residuals_finite(made: list) -> bool:
    return all(bool(torch.isfinite(r).all()) for c in made for r in c.feedback.residual.values())


def _group(rank: int, world: int, jobs: list[Job]) -> None:
    made = _recording()
    for job in jobs:
        made.clear()
        average = job.config.strategy == "average"
        if rank == 1:
            _injecting(job, into_weights=average)
        module = model_averaging if average else sync_dp
        with replicas.open_log(job, rank) as log:
            module.train_worker(replicas.WorkerContext(job, rank, world, log, time.perf_counter()))
        (job.run_dir / f"residuals{rank}.json").write_text(json.dumps(_residuals_finite(made)))


def _ps(rank: int, world: int, jobs: list[Job]) -> None:
    made = _recording()
    for job in jobs:
        made.clear()
        if rank == world - 1:  # worker 1
            _injecting(job, into_weights=False)
        ps.process_main(rank, world, job)
        (job.run_dir / f"residuals{rank}.json").write_text(json.dumps(_residuals_finite(made)))
        dist.barrier()  # the next run starts only when this one's messages are all consumed


def _job(tmp: Path, strategy: str, compress: str, **kw) -> Job:
    cfg = RunConfig(**{"model": "mlp", "data": "synthetic", "strategy": strategy,
                       "workers": 2, "batch_size": 16, "lr": LR, "max_steps": STEPS,
                       "compress": compress, "progress": False, "tensorboard": False,
                       "test_limit": 100, "ps_timeout": 30.0,
                       "out": str(tmp / f"{strategy}-{compress}"), **kw}).validate()
    job = make_job(cfg, "mlp", load_data("synthetic", None, 0))
    job.run_dir.mkdir(parents=True, exist_ok=True)
    return job


@pytest.fixture(scope="module", params=["sync", "average", "asp"])
def runs(request, tmp_path_factory) -> tuple[str, dict[str, Job]]:
    strategy = request.param
    tmp = tmp_path_factory.mktemp(strategy)
    if strategy == "asp":
        jobs = {c: _job(tmp, "asp", c, servers=1) for c in PS_CODECS}
        spawn(_ps, 3, (list(jobs.values()),))
    else:
        extra = {"period": 2} if strategy == "average" else {}
        jobs = {c: _job(tmp, strategy, c, **extra) for c in GROUP_CODECS}
        spawn(_group, 2, (list(jobs.values()),))
    return strategy, jobs


def test_the_run_goes_on_and_the_counters_say_why(runs) -> None:
    strategy, jobs = runs
    for compress, job in jobs.items():
        out = read_result(job)
        s = out.stats
        assert all(torch.isfinite(v).all() for v in out.model.state_dict().values()), compress
        for f in job.run_dir.glob("residuals*.json"):
            assert json.loads(f.read_text()) is True, (strategy, compress, f.name)
        if strategy == "asp":
            # the inf push: skipped by the worker (compressed) or refused by the shard
            skipped = 0 if compress == "none" else 1
            assert s["pushes_skipped"] == skipped, (compress, s)
            assert s["pushes_rejected"] == 1 and s["pushes_applied"] == 2 * STEPS - 1, s
            # uncompressed, a finite 3e38 is sent as it is (float32 holds it)
            assert (s["values_clipped"] >= 1) == (compress != "none"), (compress, s)
        else:
            # averaging: the inf falls in a period's delta (skipped once), as does the spike
            assert s["contributions_skipped"] == 1, (strategy, compress, s)
            assert s["values_clipped"] >= 1, (strategy, compress, s)
        shown = ("pushes_applied", "pushes_rejected", "pushes_skipped", "contributions_skipped",
                 "values_clipped")
        print(strategy, compress, {k: s[k] for k in shown if k in s})
