"""``phalanx.train``: the Python API. The CLI is a thin wrapper over it."""

from __future__ import annotations

import functools
import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from phalanx.config import RunConfig
from phalanx.data import DataOptions, Dataset, load_data
from phalanx.data.text import decode
from phalanx.entry.flags import LIMITS_VAR, apply_limits
from phalanx.entry.paths import check_resume_out, hold_run_dir, prepare_run_dir
from phalanx.entry.preflight import check_job_data
from phalanx.entry.resume import resume_config
from phalanx.errors import ConfigError
from phalanx.metrics import EventLog, read_events
from phalanx.metrics.events import finite_or_none, peak_memory
from phalanx.metrics.progress import StartupLines, say
from phalanx.metrics.throughput import measure
from phalanx.models import build_model, check_task, count_parameters, generate, model_options
from phalanx.parallel.base import Job, Outcome, ctr_figures, evaluate
from phalanx.parallel.divergence import check_parameters, diverged
from phalanx.parallel.registry import check_config, check_flags_apply, spec
from phalanx.parallel.spec import StrategySpec
from phalanx.runtime.placement import check_run
from phalanx.runtime.supervise import refuse_reimported_main

# the events a run's history is made of: its training curve and its test evaluations
HISTORY_KINDS = ("train", "eval", "lbfgs")


@dataclass
class RunResult:
    """What :func:`train` returns.

    ``summary``: the contents of ``summary.json`` (docs/events.md); ``history``: the
    ``train`` / ``eval`` (and Sandblaster's ``lbfgs``) events in the order written;
    ``events``: every event of ``events.jsonl``; ``model``: the trained model (CPU);
    ``out``: the run folder."""

    summary: dict[str, Any]
    history: list[dict[str, Any]]
    model: nn.Module
    out: Path
    events: list[dict[str, Any]]


def make_job(cfg: RunConfig, model: str | Callable[[], nn.Module] | None = None,
             data: tuple[Dataset, Dataset] | None = None) -> Job:
    train_set, test_set = data if data is not None else load_data(
        cfg.data, cfg.data_dir, cfg.seed, cfg.train_limit, cfg.test_limit,
        DataOptions(cfg.context, cfg.tokens))
    train_set, test_set = train_set.subset(cfg.train_limit), test_set.subset(cfg.test_limit)
    if model is None or isinstance(model, str):
        name = model or cfg.model
        cfg.model = name
        check_task(name, train_set.task, cfg.data if data is None else "(given)")
        model_fn = functools.partial(build_model, name, train_set.input_shape,
                                     train_set.num_classes, **model_options(cfg, train_set))
        model_fn()  # fail early, in this process, on a model/data mismatch
    elif callable(model):
        model_fn = model
        cfg.model = getattr(model, "__name__", type(model).__name__)
        check_factory(model_fn)  # before any folder is written or process started
    else:
        raise ConfigError(
            f"model: expected a name or a callable returning nn.Module, got {model!r}")
    return Job(cfg, model_fn, train_set, test_set, Path(cfg.out))


def check_factory(model_fn: Callable[[], nn.Module]) -> None:
    """A model factory is called once here: it must return an ``nn.Module`` with trainable
    parameters (a one-line :class:`ConfigError` otherwise, not a traceback at the first
    backward)."""
    built = model_fn()
    if not isinstance(built, nn.Module):
        raise ConfigError(f"model: the factory returned {built!r} ({type(built).__name__}), "
                          "not an nn.Module")
    if not any(p.requires_grad for p in built.parameters()):
        raise ConfigError(f"model: the factory's {type(built).__name__} has no trainable "
                          "parameters: nothing to train")


def prepare(model: str | Callable[[], nn.Module] | None = None,
            data: str | tuple[Dataset, Dataset] | None = None, *,
            config: RunConfig | None = None,
            **options: Any) -> tuple[RunConfig, StrategySpec, Job, float]:
    """What :func:`train` does before it writes in a run folder or starts a process: every
    check of the settings (each on its own, against the strategy's spec, the settings the
    strategy would ignore, ``--resume``'s folder), the device and backend on this machine,
    the data (loaded) and the model (built once). Returns the checked configuration, its
    strategy, the job and the seconds the data took to load; the strategy's own
    ``check_job`` runs next (:meth:`StrategySpec.run_job`). Raises
    :class:`~phalanx.errors.PhalanxError` in one line. tests/unit/test_gpu_test_settings.py
    runs it on the GPU tests' settings, the CPU standing in for the GPU."""
    if config is None:
        values = dict(options)
        if isinstance(data, str):
            values["data"] = data
        if isinstance(model, str):
            values["model"] = model
        cfg = RunConfig.from_mapping(values, source="phalanx.train")
    else:
        cfg = config
    apply_limits(cfg, os.environ.get(LIMITS_VAR, ""))  # a smoke run's caps (docs test)
    check_config(cfg)  # each setting, then against the strategy's spec
    if config is None and not cfg.resume:
        check_flags_apply(cfg)  # as `phalanx train`: a setting the strategy would ignore
    if cfg.resume:
        check_resume_out(cfg)
        cfg = resume_config(cfg)  # DIR/config.json; checkpoints checked before anything runs
    strategy = spec(cfg.strategy)
    # device, index, backend and strategy checked against this machine, before any data
    # is read or any process starts (phalanx.runtime.placement decides per rank later)
    check_run(cfg, strategy.world_size(cfg), strategy.device)
    if cfg.progress:
        say(f"{cfg.strategy}: loading {cfg.data if not isinstance(data, tuple) else 'data'}...")
    loading = time.perf_counter()
    job = make_job(cfg, model, data if isinstance(data, tuple) else None)
    data_s = time.perf_counter() - loading  # the start-up's data phase (summary's startup)
    check_job_data(job)  # no strategy may loop over empty epochs (phalanx.entry.preflight)
    return cfg, strategy, job, data_s


def train(model: str | Callable[[], nn.Module] | None = None,
          data: str | tuple[Dataset, Dataset] | None = None, *,
          config: RunConfig | None = None, **options: Any) -> RunResult:
    """Train a model with a strategy and return its summary and history.

    ``model`` is a model name (``mlp``, ``lenet5``, ``resnet``) or a factory returning any
    ``nn.Module`` (picklable when the strategy starts processes). ``data`` is a data-set
    name or a ``(train, test)`` pair of :class:`~phalanx.data.Dataset`. Every other option
    is a :class:`~phalanx.config.RunConfig` field (``strategy``, ``rule``, ``workers``, ...).
    """
    refuse_reimported_main()  # a script without `if __name__ == "__main__":`, in a rank
    cfg, strategy, job, data_s = prepare(model, data, config=config, **options)
    # empty, cleared by --overwrite, or resumed: never two runs mixed in one folder
    lock = hold_run_dir(job.run_dir)  # one run writes in a folder at a time (closed below)
    out = prepare_run_dir(job.run_dir, overwrite=cfg.overwrite, resume=bool(cfg.resume))
    events_path = out / "events.jsonl"
    if not cfg.resume:  # a resumed run keeps its log and its config
        (out / "config.json").write_text(json.dumps(cfg.to_json(), indent=2) + "\n")
    tb_dir = out / "tensorboard" if cfg.tensorboard else None
    threads_before = torch.get_num_threads()
    if cfg.threads:
        # on a shared or small machine, spinning OpenMP threads of several processes fight
        # over the cores (measured: 2 threads on a busy 2-core box ran 15x slower than 1)
        torch.set_num_threads(cfg.threads)
    try:
        return _run(cfg, job, strategy, out, events_path, tb_dir, data_s)
    finally:
        torch.set_num_threads(threads_before)
        lock.close()


# the untrained and the trained model are compared on the test set's first samples
START_SAMPLES = 1000


def _run(cfg: RunConfig, job: Job, strategy: StrategySpec, out: Path, events_path: Path,
         tb_dir: Path | None, data_s: float) -> RunResult:
    initial = job.build_model()  # the model every strategy starts from (seeded)
    parameters = count_parameters(initial)
    # before the clock starts, on the first test samples only (a whole LeNet-5 pass over
    # Fashion-MNIST's 10,000 is 0.56 s, a GPT's seconds: paid by every run for one figure)
    initial_test_loss = evaluate(initial, job.test.subset(START_SAMPLES))[0]
    del initial
    t0 = time.perf_counter()
    with EventLog(events_path, rank=-1, role="driver", tensorboard_dir=tb_dir) as log:
        log.log("start", strategy=cfg.strategy, workers=cfg.workers, model=cfg.model,
                data=cfg.data, parameters=parameters, data_s=data_s,
                initial_test_loss=initial_test_loss)
        if cfg.progress:
            say(f"{cfg.strategy}: starting {_processes(strategy, cfg)}...")
        with StartupLines(events_path, cfg.strategy, enabled=cfg.progress):
            outcome = strategy.run_job(job, log)
        summary = finish_run(job, outcome, time.perf_counter() - t0, log,
                             initial_test_loss=initial_test_loss)
    events = read_events(events_path)
    history = [e for e in events if e.get("kind") in HISTORY_KINDS]
    return RunResult(summary, history, outcome.model, out, events)


def _processes(strategy: StrategySpec, cfg: RunConfig) -> str:
    """What a run starts, in words: "4 workers + 1 server", "1 process (this one)"."""
    world = strategy.world_size(cfg)
    if world == 1:
        return "1 process (this one)"
    ranks, _ = strategy.compute_ranks(cfg)
    text = f"{ranks} worker{'s' if ranks != 1 else ''}"
    if world > ranks:
        text += f" + {world - ranks} server{'s' if world - ranks != 1 else ''}"
    return text + " (processes)"


SAMPLE_PROMPT, SAMPLE_TOKENS = 16, 200  # a generated sample: the test text's first tokens on


def lm_summary(job: Job, test_loss: float, samples_per_s: float | None,
               train_samples: int) -> dict[str, Any]:
    """A language model's figures: perplexity, tokens/s beside samples/s, the data's
    tokens (nats per token is ``test_loss`` itself; accuracy is next-token accuracy)."""
    if job.test.task != "lm":
        return {}
    context = job.train.x.shape[1]
    return {"test_perplexity": math.exp(test_loss) if test_loss < 700 else math.inf,
            "tokens_per_s": None if samples_per_s is None else samples_per_s * context,
            "train_tokens": train_samples * context,
            **{f"data_{k}": v for k, v in job.train.info.items()}}


def ctr_summary(job: Job, model: nn.Module) -> dict[str, Any]:
    """A click model's figures: the test AUC beside the log-loss (``test_loss``), and what
    the data says of itself (``data_synthetic``, the teacher's ``data_best_logloss`` and
    ``data_best_auc``, the base rate's ``data_base_logloss``)."""
    if job.test.task != "ctr":
        return {}
    info = {k: v for k, v in job.train.info.items() if k != "vocab_sizes"}
    return {**ctr_figures(model, job.test), **{f"data_{k}": v for k, v in info.items()}}


def sample_text(model: nn.Module, job: Job) -> str:
    """A seeded sample of ``SAMPLE_TOKENS`` tokens after the test text's first tokens."""
    prompt = job.test.x[0, :SAMPLE_PROMPT]
    ids = generate(model, prompt, SAMPLE_TOKENS, job.test.x.shape[1], seed=job.config.seed)
    return decode(ids.tolist(), job.test.vocab)


def memory_summary(events: list[dict[str, Any]]) -> dict[str, Any]:
    """Peak memory per process of the latest attempt (each rank's ``memory`` event at its
    end, the driver's own now): ``peak_rss_bytes`` (the largest) and per process, keyed
    by rank (-1: the driver); ``max_memory_allocated`` likewise where a rank used CUDA."""
    starts = [i for i, e in enumerate(events) if e["kind"] == "start" and e["rank"] == -1]
    latest = events[starts[-1]:] if starts else events
    per = {str(e["rank"]): e for e in latest if e["kind"] == "memory"}
    per["-1"] = peak_memory()
    out: dict[str, Any] = {
        "peak_rss_bytes": max(e["peak_rss_bytes"] for e in per.values()),
        "peak_rss_bytes_per_process": {k: e["peak_rss_bytes"] for k, e in per.items()}}
    cuda = {k: e["max_memory_allocated"] for k, e in per.items() if "max_memory_allocated" in e}
    if cuda:
        out["max_memory_allocated"] = max(cuda.values())
        out["max_memory_allocated_per_process"] = cuda
    return out


def finish_run(job: Job, outcome: Outcome, wall: float, log: EventLog,
               initial_test_loss: float | None = None, **extra: Any) -> dict[str, Any]:
    """The one place a run's summary is made and written (``phalanx train``, the API and
    the ``torchrun`` entry): the trained model is checked for non-finite parameters and a
    non-finite test loss (one line naming the run), evaluated (against
    ``initial_test_loss``, the untrained model's, when given), and the summary is logged as
    a ``summary`` event and written to ``summary.json`` with any non-finite statistic as
    null (strict JSON)."""
    cfg = job.config
    check_parameters(cfg, outcome.model.parameters())  # every strategy, before a summary
    test_loss, test_acc = evaluate(outcome.model, job.test)
    if not math.isfinite(test_loss):
        raise diverged(cfg, f"the test loss of the trained model is {test_loss}")
    if initial_test_loss is not None:
        # a run that ends worse than it started says so (summary, log; `phalanx train`
        # exits 2 after writing its results): both losses on the same first test samples
        start = job.test.subset(START_SAMPLES)
        final = test_loss if start is job.test else evaluate(outcome.model, start)[0]
        extra.update(initial_test_loss=initial_test_loss, start_samples=len(start),
                     start_samples_test_loss=final,
                     worse_than_start=bool(final > initial_test_loss))
        if extra["worse_than_start"]:
            log.log("warning", what="worse than start", initial_test_loss=initial_test_loss,
                    test_loss=final, samples=len(start), steps=outcome.steps)
    events = job.run_dir / "events.jsonl"
    seen = read_events(events) if events.is_file() else []
    rate = measure(seen, outcome.train_samples)
    summary: dict[str, Any] = {
        "strategy": cfg.strategy,
        "model": cfg.model,
        "data": cfg.data,
        # what computed: data-parallel workers, stages, stages x replicas (hybrid)
        "workers": spec(cfg.strategy).compute_ranks(cfg)[0],
        "test_accuracy": test_acc,
        "test_loss": test_loss,
        "train_samples": outcome.train_samples,
        "steps": outcome.steps,
        "wall_s": wall,
        # steady state: from every rank ready to the last step (phalanx.metrics.throughput)
        "samples_per_s": rate.samples_per_s,
        "startup_s": rate.startup_s,
        "startup": rate.startup,  # its phases (phalanx.metrics.throughput)
        "train_s": rate.train_s,
        **lm_summary(job, test_loss, rate.samples_per_s, outcome.train_samples),
        **ctr_summary(job, outcome.model),
        **extra,
        **memory_summary(seen),
        **outcome.stats_dict(),
    }
    summary = finite_or_none(summary)
    if job.test.task == "lm":  # what the model writes, in the log (and the CLI prints it)
        summary["sample_text"] = sample_text(outcome.model, job)
        log.log("sample", prompt_tokens=SAMPLE_PROMPT, text=summary["sample_text"])
    log.log("summary", **summary)
    (job.run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary
