"""The strategy interface: what a strategy module declares, and what everyone else reads.

Each strategy module ends with one :class:`StrategySpec` (the parameter-server module with
one per preset); :mod:`phalanx.parallel.registry` lists them. The configuration checks, the
CLI's help, the fault and compression flags, placement on devices, ``--resume``, the
``torchrun`` entry, the experiments and the docs all read the spec, never a strategy name:
adding a strategy is its module plus one registry line (docs/architecture.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from phalanx.config import RunConfig
from phalanx.errors import ConfigError
from phalanx.metrics import EventLog
from phalanx.parallel.base import Job, Outcome, read_result
from phalanx.parallel.dp_checkpoint import spawn_workers
from phalanx.rules import RULES
from phalanx.runtime.placement import DeviceSupport, spawn_backend
from phalanx.runtime.supervise import preload

# what a strategy may declare in ``supports`` (anything else is a typo, refused at import)
FEATURES = frozenset({
    "kill_worker",    # --kill-worker RANK@STEP: the run survives (or stops cleanly) a dead worker
    "kill_server",    # --kill-server SHARD@UPDATE: a parameter-server shard dies
    "drop_messages",  # --drop-messages P: pushes are lost on the way
    "compress",       # --compress: lossy codecs on its traffic
    "powersgd",       # --compress powersgd: needs an allreduce group (two rounds per step)
    "compress_checkpoint",  # --compress with --checkpoint-every: residuals are checkpointed
    "outer_rule",     # --outer-rule: a DiLoCo outer optimizer on the averaged delta
    "sparse_grads",   # a model whose embedding table has sparse gradients (--model ctr)
    "bf16",           # --precision bf16: autocast forward, fp32 master weights (precision.py)
})


def one_process(cfg: RunConfig) -> int:
    return 1


def workers_compute(cfg: RunConfig) -> tuple[int, str]:
    return cfg.workers, f"--workers {cfg.workers}"


def nothing(_: object) -> None:
    return None


def momentum_for(replicas: int, cfg: RunConfig) -> tuple[str, float] | None:
    """The rule of a synchronous strategy whose step averages ``replicas`` batches: momentum
    (``--momentum``, 0.9) at lr = 0.05 x (1 - momentum) x replicas, so the effective step
    lr / (1 - momentum) is single's SGD 0.05 scaled linearly with the global batch (Goyal et
    al. 2017). One replica: None (single's own default, so N = 1 still equals single).

    Why (issue #25): with N workers such a run takes N x fewer steps per epoch. LeNet-5,
    Fashion-MNIST, 4,000 samples, 3 epochs, 4 workers (45 steps of 256): plain SGD 0.05
    reached 0.646-0.733 (seeds 0-2), SGD at 0.2 was worse (0.58 mean over 5 seeds); this
    momentum rule reached 0.750-0.768 (docs/data-parallel.md)."""
    if replicas <= 1:
        return None
    return "momentum", round(RULES.get("sgd").default_lr * (1.0 - cfg.momentum) * replicas, 12)


def workers_momentum(cfg: RunConfig) -> tuple[str, float] | None:
    return momentum_for(cfg.workers, cfg)


def no_refusal(_: RunConfig) -> str:
    return ""


def same_settings(old: RunConfig, new: RunConfig) -> RunConfig:
    return new


@dataclass(frozen=True, kw_only=True)
class Resize:
    """A strategy's elastic resize: a stopped run's folder rewritten so that ``--resume``
    continues it on another number of workers with another per-worker batch (the live
    scheduler's resize; :func:`phalanx.entry.resize.resize_run` calls the three in order).

    ``refusal(cfg)``: why this run cannot be resized ('' when it can), before anything is
    read. ``settings(old, new)``: the new settings, given ``new`` with the workers, the
    batch and the learning rate already changed (:meth:`StrategySpec.resized_lr`), plus
    what else follows the worker count for this strategy (SoftSync's group, a step
    budget); they are then checked as any run's. ``rewrite(job, new)``: rewrite the
    checkpoint and ``config.json`` of the stopped run (``job``: its old settings, data and
    model, ``job.run_dir`` its folder) for the checked ``new``; returns (the step it stopped at,
    the step it resumes at). Nothing is written when any of them refuses (one-line
    :class:`ConfigError`)."""

    rewrite: Callable[[Job, RunConfig], tuple[int, int]]
    settings: Callable[[RunConfig, RunConfig], RunConfig] = same_settings
    refusal: Callable[[RunConfig], str] = no_refusal


@dataclass(frozen=True, kw_only=True)
class StrategySpec:
    """Everything the rest of phalanx knows about one strategy.

    ``run(job, log) -> Outcome`` trains in the driver (starting processes as it needs);
    ``process_main(rank, world, job)`` is one rank of a process group that someone else
    started (``torchrun``); None: the strategy cannot run under torchrun (``local_only``
    says why). ``world_size(cfg)`` is how many processes a run starts. ``check(cfg)``
    refuses settings the strategy cannot honour (one-line :class:`ConfigError`), before any
    data is read. ``check_resume(cfg)`` checks ``--resume``'s checkpoints (None: the
    strategy cannot resume); ``can_restart(cfg)``: a restarted torchrun attempt finds a
    checkpoint in ``--out`` to continue from.
    """

    name: str
    summary: str  # one line: the CLI's help and the docs' table
    # trains in the driver; None: the default, :func:`spawned` (check_job, spawn
    # world_size ranks of process_main, read rank 0's result)
    run: Callable[[Job, EventLog], Outcome] | None = None
    process_main: Callable[[int, int, Job], None] | None = None
    # checks that need the data or the model (a shard smaller than a batch, a model the
    # stages cannot split): in the driver before any rank starts, and on every rank under
    # torchrun, where no driver ran them
    check_job: Callable[[Job], None] = nothing
    preload: tuple[str, ...] = ()  # modules the fork server imports for the ranks
    rank_name: str = "worker"  # how a failed rank is named ("stage 1")
    world_size: Callable[[RunConfig], int] = one_process
    check: Callable[[RunConfig], None] = nothing
    check_resume: Callable[[RunConfig], None] | None = None
    can_restart: Callable[[RunConfig], bool] | None = None
    supports: frozenset[str] = frozenset()
    # settings only this strategy reads: a non-default value with another strategy is refused
    options: tuple[str, ...] = ()
    # the setting that says how many disjoint data shards the workers train on ("" = one
    # stream over the whole training set)
    shards_by: str = ""
    # the ranks that compute (``--slow-workers`` and ``--kill-worker`` name them) and the
    # flags that say how many there are
    compute_ranks: Callable[[RunConfig], tuple[int, str]] = workers_compute
    device: DeviceSupport = field(default_factory=lambda: DeviceSupport(
        cuda=False, nccl=False, reason="it has no CUDA path yet"))
    default_lr: float | None = None  # None: the update rule's default (rules.RULES)
    # (rule, lr) when the user names neither --rule nor --lr (None: sgd at its default):
    # e.g. the synchronous strategies' momentum scaled with the global batch
    # (:func:`momentum_for`); docs/data-parallel.md gives each default and why
    default_rule: Callable[[RunConfig], tuple[str, float] | None] = nothing
    # passes over the data when --epochs is left at 1 and --max-steps at 0: a full-batch
    # method's first pass only evaluates its starting point (None: --epochs as given)
    default_epochs: float | None = None
    fixed_workers: int = 0  # the strategy trains with exactly this many workers (0: any)
    # settings every other strategy reads that this one does not: setting -> why (a
    # non-default value is refused in one line with the reason)
    unused: dict[str, str] = field(default_factory=dict)
    full_batch: bool = False  # a step is a pass over the whole training set (L-BFGS)
    # its checkpoints re-shard on load: ``--resume DIR --workers N`` continues on N workers
    # (phalanx.entry.resume)
    reshards: bool = False
    # the live scheduler's resize of a stopped run (None: its runs keep their size)
    resize: Resize | None = None
    local_only: str = ""  # why it cannot run under torchrun when process_main is None
    # the strategy is a preset of another's settings (a parameter-server consistency model,
    # server rule, ...): name -> value, read by the parameter-server strategy itself
    preset: dict[str, object] = field(default_factory=dict)
    # settings of a small run besides --workers 2 (the conformance suite runs every
    # strategy with them; docs/architecture.md)
    example: dict[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = set(self.supports) - FEATURES
        if unknown:
            raise ValueError(f"strategy {self.name}: unknown features {sorted(unknown)}")
        fields = set(RunConfig.__dataclass_fields__)
        for name in (*self.options, *self.unused,
                     *((self.shards_by,) if self.shards_by else ())):
            if name not in fields:
                raise ValueError(f"strategy {self.name}: {name!r} is not a RunConfig field")

    def run_job(self, job: Job, log: EventLog) -> Outcome:
        """Train: the job's own checks, then the strategy's ``run`` or :func:`spawned`."""
        self.check_job(job)  # fail here, in one line, not in N children
        return self.run(job, log) if self.run is not None else spawned(self, job)

    @property
    def is_parameter_server(self) -> bool:
        """A preset of the parameter server: it has a consistency model (``--consistency``
        and the models' own settings apply)."""
        return "consistency" in self.preset

    @property
    def can_resume(self) -> bool:
        return self.check_resume is not None

    def resized_lr(self, old: RunConfig, workers: int) -> float | None:
        """The learning rate of a run resized to ``workers`` whose rule is this strategy's
        default momentum for its worker count (``momentum_for``, recorded resolved in
        config.json): the one a fresh run with ``workers`` gets, kept as momentum at one
        worker (the same effective step as single's SGD: the rule state is momentum's).
        Anything else (the user's rule or rate, plain SGD of a run started with one
        worker) stays."""
        if old.workers > 1 and self.default_rule(old) == (old.rule, old.lr):
            return round(RULES.get("sgd").default_lr * (1.0 - old.momentum) * workers, 12)
        return old.lr

    def data_shards(self, cfg: RunConfig) -> tuple[int, str]:
        """How many disjoint shards the training set is split into, and the flag."""
        if not self.shards_by:
            return 1, ""
        return int(getattr(cfg, self.shards_by)), self.shards_by

    def refuse(self, flag: str, why: str) -> ConfigError:
        return ConfigError(f"--{flag.replace('_', '-')}: {why} (--strategy {self.name})")


def spawned(s: StrategySpec, job: Job) -> Outcome:
    """The common ``run``: ``--resume``'s checkpoints, then
    ``world_size`` ranks of ``process_main`` forked from the preloaded fork server, and
    rank 0's result. A run stopped by an injected ``--kill-worker`` ends in one line saying
    how to continue it."""
    cfg = job.config
    if cfg.resume and s.check_resume is not None:
        s.check_resume(cfg)
    if s.process_main is None:
        raise ValueError(f"strategy {s.name}: no run and no process_main")
    preload(*s.preload)
    world = s.world_size(cfg)
    spawn_workers(job, s.process_main, world, backend=spawn_backend(cfg, world, s.device),
                  rank_name=s.rank_name)
    return read_result(job)
