"""Downpour's local steps over real processes (1 server, 2 workers, gloo).

Dean et al. 2012 (Algorithm 7.1): between fetches a worker applies its own gradients to
its local weights, so the 2nd..nfetch-th step of a fetch period is computed on the
fetched weights moved by the earlier steps' SGD updates. ``--no-downpour-local-steps``
computes them on the fetched weights themselves.

The workers here are the real :class:`PSWorker` with two read-only probes on its model:
a forward pre-hook that records the weights each training step is computed on, and
gradient hooks that record the gradient of that step; its pull records what a fetch
brought. The check runs inside the worker process (the weights are too big to ship) and
writes one line per step.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.distributed as dist

import phalanx
from phalanx.comm.transport import GlooTransport
from phalanx.config import RunConfig
from phalanx.entry.api import make_job
from phalanx.metrics import EventLog
from phalanx.parallel import ps
from phalanx.parallel.base import Job, read_result
from phalanx.parallel.ps_worker import PSWorker
from phalanx.ps.server import Layout
from phalanx.runtime.launch import spawn

NFETCH, NPUSH, STEPS, LR = 3, 2, 30, 0.05


class TracedWorker(PSWorker):
    """A PS worker that checks, at every training step, which weights it computes on."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.expected: torch.Tensor | None = None  # the weights the next step should see
        self.fetched: torch.Tensor | None = None  # the weights the last fetch brought
        self.fetch_pending = False
        self.grads: list[torch.Tensor | None] = [None] * len(self.params)
        self.records: list[dict] = []
        self.model.register_forward_pre_hook(self._computing)
        for i, p in enumerate(self.params):
            p.register_hook(lambda g, i=i: self.grads.__setitem__(i, g.detach().clone()))

    def _flat(self) -> torch.Tensor:
        return torch.cat([p.detach().reshape(-1) for p in self.params]).clone()

    def pull(self, rows, dense, resume=False):
        super().pull(rows, dense, resume)
        if dense:
            self.fetched = self.expected = self._flat()
            self.fetch_pending = True

    def _computing(self, module, inputs) -> None:
        if not module.training:
            return  # worker 0 evaluating the servers' weights, not a training step
        if self.records and self.expected is not None and not self.fetch_pending:
            # no fetch since the last step: its gradient moves the weights (local steps) or not
            if self.cfg.downpour_local_steps:
                g = torch.cat([x.reshape(-1) for x in self.grads])
                self.expected = self.expected - self.cfg.lr * g
        w = self._flat()
        self.records.append({
            "step": self.step, "fetch": self.fetch_pending,
            "err": (w - self.expected).abs().max().item(),
            "moved": (w - self.fetched).abs().max().item(),
        })
        self.expected, self.fetch_pending = w, False


def _traced(rank: int, world: int, jobs: list[Job]) -> None:
    for job in jobs:
        cfg = job.config
        layout = Layout(cfg.servers, cfg.workers)
        if rank < layout.servers:
            ps.process_main(rank, world, job)
        else:
            worker = rank - layout.servers
            with EventLog(job.run_dir / "events.jsonl", rank=rank, role="worker") as log:
                traced = TracedWorker(job, GlooTransport(rank, world), layout, worker, log)
                traced.run()
            (job.run_dir / f"trace{worker}.json").write_text(json.dumps(traced.records))
        dist.barrier()  # the next run starts only when this one's messages are all consumed


def _job(tmp: Path, local: bool) -> Job:
    cfg = RunConfig.from_mapping({
        "strategy": "downpour", "model": "mlp", "data": "synthetic", "batch_size": 32,
        "max_steps": STEPS, "lr": LR, "rule": "sgd", "workers": 2, "servers": 1,
        "nfetch": NFETCH, "npush": NPUSH, "downpour_local_steps": local, "progress": False,
        "tensorboard": False, "out": str(tmp / ("local" if local else "stale")),
        "ps_timeout": 30.0}).validate()
    job = make_job(cfg)
    job.run_dir.mkdir(parents=True, exist_ok=True)
    return job


def test_local_steps_between_fetches_and_the_stale_mode(tmp_path):
    jobs = [_job(tmp_path, local=True), _job(tmp_path, local=False)]
    spawn(_traced, 3, (jobs,))
    for job in jobs:
        local = job.config.downpour_local_steps
        for w in range(2):
            records = json.loads((job.run_dir / f"trace{w}.json").read_text())
            assert [r["step"] for r in records] == list(range(STEPS))
            # a fetch every NFETCH steps (and nowhere else: worker 0 evaluates at the end)
            assert [r["step"] for r in records if r["fetch"]] == list(range(0, STEPS, NFETCH))
            for r in records:
                # every step sees exactly the weights the rule predicts: the fetched ones,
                # moved by lr x each earlier gradient of the period in local mode
                assert r["err"] <= 1e-6, (local, w, r)
                if r["fetch"]:
                    assert r["moved"] == 0.0
                elif local:
                    assert r["moved"] > 1e-4, (w, r)  # the local steps really moved them
                else:
                    assert r["moved"] == 0.0, (w, r)  # stale: bit for bit the fetched ones
        # the servers still get the summed gradients every NPUSH steps, whatever the mode
        s = read_result(job).stats
        assert s["pushes_applied"] == 2 * STEPS // NPUSH and s["pushes_rejected"] == 0


def test_both_modes_train(tmp_path):
    """Loss falls in both modes (a sanity check, not a comparison: 40 steps, one seed)."""
    for local in (True, False):
        out = tmp_path / str(local)
        phalanx.train("mlp", "synthetic", strategy="downpour", workers=2, servers=1,
                      nfetch=NFETCH, npush=NPUSH, downpour_local_steps=local, rule="sgd",
                      lr=LR, batch_size=32, max_steps=40, progress=False, tensorboard=False,
                      out=str(out))
        events = [json.loads(ln) for ln in (out / "events.jsonl").read_text().splitlines()]
        evals = [e for e in events if e["kind"] == "eval"]
        summary = json.loads((out / "summary.json").read_text())
        init = make_job(RunConfig.from_mapping({"model": "mlp", "data": "synthetic"})
                        .validate())
        init_loss, _ = phalanx.parallel.base.evaluate(init.build_model(), init.test)
        assert evals and summary["test_loss"] < 0.7 * init_loss, (local, init_loss, summary)


def test_the_flag_is_for_downpour_only(tmp_path, capsys):
    from phalanx.cli import main

    code = main(["train", "--strategy", "asp", "--workers", "2", "--no-downpour-local-steps",
                 "--out", str(tmp_path / "x")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert err.startswith("phalanx: error: --downpour-local-steps: --strategy asp does not")
