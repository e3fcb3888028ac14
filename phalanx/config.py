"""Typed run configuration: one validated dataclass, built from defaults, a JSON/YAML file
and CLI overrides (in that order)."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from phalanx.errors import ConfigError
from phalanx.limits import MAX_SEED, check_ranges, short
from phalanx.settings import (  # noqa: F401 - SECTIONS, Range: read through phalanx.config
    SECTIONS,
    Device,
    Range,
    parse_device,
    parse_slow_workers,
    setting,
)

LINE_SEARCHES = ("backtracking", "none")  # sandblaster L-BFGS
BACKENDS = ("auto", "nccl", "gloo")  # collectives' backend (phalanx.runtime.placement)
DATA_ON_DEVICE = ("auto", "yes", "no")
ALLREDUCES = ("ring", "native", "main")
PIPELINE_SCHEDULES = ("gpipe", "1f1b")
PRECISIONS = ("fp32", "bf16")  # phalanx.parallel.precision


WORKER_LOSS = ("continue", "stop")
# parameter-server messages: shared memory when every rank is on one host (auto), gloo
TRANSPORTS = ("auto", "shm", "gloo")
TOKENS = ("char", "byte")  # phalanx.data.text
TEXT_SETS = ("shakespeare", "text")  # the data sets --context and --tokens cut


@dataclass
class RunConfig:
    """Everything one training run needs. Field names are the CLI flags (``_`` -> ``-``)."""

    # what to train
    model: str = setting("lenet5", 'model to train', section="model")
    data: str = setting(
        "fashion-mnist",
        "data set (fashion-mnist needs Debian's dataset-fashion-mnist; idx and cifar10 "
        'need --data-dir)', section="data")
    data_dir: str | None = setting(
        None, 'directory holding IDX (MNIST-format) or CIFAR-10 binary files; --data text: '
        'a UTF-8 file or a folder of .txt files', section="data",
        needs=("--data fashion-mnist, mnist, idx, cifar10, shakespeare or text",
               lambda c: c.data in ("fashion-mnist", "mnist", "idx", "cifar10", "shakespeare",
                                    "text")))
    tokens: str = setting("char", "text: characters (vocabulary from the training text) or bytes",
        choices=TOKENS, section="data", needs=(f"--data {' or '.join(TEXT_SETS)}",
                                               lambda c: c.data in TEXT_SETS))
    context: int = setting(64, 'text / gpt: tokens in a window (the attention span)',
        section="data", rule=Range(1), limit=(1, 2**20),
        needs=(f"--data {' or '.join(TEXT_SETS)}", lambda c: c.data in TEXT_SETS))
    train_limit: int = setting(0, 'train on only the first N training samples (0: all)',
        section="data", rule=Range(0), limit=(0, 2**40))
    test_limit: int = setting(0, 'evaluate on only the first N test samples (0: all)',
        section="data", rule=Range(0), limit=(0, 2**40))
    non_iid: float = setting(
        0.0, "how label-sorted the workers' shards are (0: iid, 1: each worker sees few labels)",
        section="data", rule=Range(0.0, 1.0))
    augment: str = setting(
        "", 'comma list of augmentations applied per batch: flip, translate, rotate, noise',
        section="data")

    gpt_layers: int = setting(4, 'gpt: transformer blocks', section="model",
        rule=Range(1), limit=(1, 1024), needs=("--model gpt", lambda c: c.model == "gpt"))
    gpt_heads: int = setting(4, 'gpt: attention heads per block (divides --gpt-dim)',
        section="model", rule=Range(1), limit=(1, 1024),
        needs=("--model gpt", lambda c: c.model == "gpt"))
    gpt_dim: int = setting(128, 'gpt: embedding width', section="model", rule=Range(1),
        limit=(1, 2**16), needs=("--model gpt", lambda c: c.model == "gpt"))
    dropout: float = setting(0.0, 'gpt: dropout after embeddings, attention and MLP',
        section="model", rule=Range(0.0, 1.0, hi_open=True),
        needs=("--model gpt", lambda c: c.model == "gpt"))
    ctr_rows: int = setting(65536, 'ctr: hashed embedding rows per field (an id goes to row '
        'id mod this)', section="model", rule=Range(1), limit=(1, 2**24),
        needs=("--model ctr", lambda c: c.model == "ctr"))
    ctr_dim: int = setting(16, 'ctr: values per embedding row', section="model",
        rule=Range(1), limit=(1, 4096), needs=("--model ctr", lambda c: c.model == "ctr"))

    # optimisation
    epochs: float = setting(1.0, 'passes over the training set (fractions allowed)',
        section="optim", rule=Range(0, lo_open=True), limit=(0, 1e6))
    max_steps: int = setting(
        0, 'stop after this many optimizer steps per worker (0: --epochs decides)',
        section="optim", rule=Range(0), limit=(0, 10**12))
    batch_size: int = setting(64, 'samples per batch per worker',
        section="optim", rule=Range(1), limit=(1, 2**31 - 1))
    lr: float | None = setting(
        None, "learning rate (default: the rule's own, e.g. sgd 0.05, adam 0.001; L-BFGS 1)",
        section="optim", rule=Range(0, lo_open=True, text="must be a finite number > 0"),
        limit=(0, 1e6))
    rule: str = setting(
        "sgd", 'update rule (optimizer), on the workers or on the parameter server',
        section="optim")  # its names: phalanx.rules.RULES
    momentum: float = setting(0.9, 'momentum of --rule momentum / nesterov',
        section="optim", rule=Range(0.0, 1.0, hi_open=True),
        needs=("--rule momentum or nesterov", lambda c: c.rule in ("momentum", "nesterov")))
    weight_decay: float = setting(
        0.0, 'weight decay: L2 added to every gradient (adamw: decoupled, p -= lr wd p)',
        section="optim", rule=Range(0), limit=(0, 1e6))
    schedule: str = setting("constant", 'learning-rate schedule over the run',
        section="optim")  # its names: phalanx.rules.SCHEDULES
    warmup_steps: int = setting(0, 'linear learning-rate warm-up over this many steps',
        section="optim", rule=Range(0), limit=(0, 10**12))
    step_size: int = setting(
        1000, '--schedule step: multiply the lr by --gamma every this many steps',
        section="optim", rule=Range(1), limit=(1, 10**12),
        needs=("--schedule step", lambda c: c.schedule == "step"))
    gamma: float = setting(0.1, '--schedule step: the factor applied every --step-size steps',
        section="optim", rule=Range(0.0, 1.0, lo_open=True),
        needs=("--schedule step", lambda c: c.schedule == "step"))
    clip_grad_norm: float = setting(
        0.0, "clip the gradient to this global L2 norm before the rule (0: off; where each "
        "strategy clips: docs/workloads.md)", section="optim", rule=Range(0), limit=(0, 1e9))
    grad_accum: int = setting(1, 'micro-batches accumulated per optimizer step',
        section="optim", rule=Range(1), limit=(1, 2**20))

    # strategy
    strategy: str = setting(
        "single", 'how the workers synchronise (docs/architecture.md lists them)',
        section="parallel")
    workers: int = setting(1, 'worker processes that compute (data-parallel ranks, stages, ...)',
        section="parallel", rule=Range(1, 256))
    seed: int = setting(
        0, "seed of the model's initial weights, the data order and every worker's generator",
        section="run", limit=(0, MAX_SEED))
    device: str = setting(
        "cpu", 'cpu, cuda or cuda:K (each rank takes a GPU of its own where it can)',
        section="parallel")
    threads: int = setting(
        0,
        "intra-op threads of the driver process (0: PyTorch's default; workers use "
        '--worker-threads)', section="parallel", rule=Range(0, 1024))
    slow_workers: dict[int, float] = setting(
        factory=dict,
        help="emulate stragglers: RANK:FACTOR pairs, e.g. 0:3.0,2:1.5 (rank 0 three times slower)",
        section="faults")
    # per-rank placement (phalanx.runtime.placement): collectives' backend, training set on
    # the GPU, intra-op threads of each worker process (0 = max(1, cores // processes))
    backend: str = setting(
        "auto",
        "collectives' backend: nccl where every rank owns a GPU, gloo otherwise (auto)",
        choices=BACKENDS, section="parallel")
    data_on_device: str = setting(
        "auto", 'keep the training set on the GPU (auto: when it fits)', choices=DATA_ON_DEVICE,
        section="parallel")
    worker_threads: int = setting(
        0, 'intra-op threads per worker process (0: cores / processes, at least 1)',
        section="parallel", rule=Range(0, 1024))

    memory_limit: int = setting(
        0, "per-rank memory budget in bytes: each rank process may map this much beyond its "
        "start-up (RLIMIT_AS, set before it builds the model; 0: none; docs/memory.md)",
        section="parallel", rule=Range(0), limit=(0, 2**50))

    # parameter server family
    servers: int = setting(1, "parameter-server shards (or Sandblaster's parameter shards)",
        section="ps", rule=Range(1, 64))
    staleness: int = setting(
        3, 'SSP: how many clocks the fastest worker may run ahead of the slowest',
        section="ps", rule=Range(0), limit=(0, 10**9))
    softsync: int = setting(
        1, 'soft-sync: pushes the server gathers before it applies them (1: ASP, N: like sync)',
        section="ps")
    nfetch: int = setting(1, 'Downpour: fetch fresh weights every this many steps',
        section="ps", rule=Range(1), limit=(1, 10**9))
    npush: int = setting(1, 'Downpour: push the summed gradients every this many steps',
        section="ps", rule=Range(1), limit=(1, 10**9))
    dc_lambda: float = setting(0.04, 'DC-ASGD: the delay-compensation strength lambda',
        section="ps", rule=Range(0), limit=(0, 1e6))
    dc_adaptive: bool = setting(False, 'DC-ASGD-a: scale lambda by a moving average of g*g',
        section="ps")
    dc_momentum: float = setting(0.95, "DC-ASGD-a: the moving average's decay",
        section="ps", rule=Range(0.0, 1.0, hi_open=True),
        needs=("--dc-adaptive", lambda c: c.dc_adaptive))
    staleness_lr: bool = setting(
        False, 'divide each applied step by its staleness (staleness-aware async SGD)',
        section="ps")
    ps_timeout: float = setting(
        60.0, 'seconds a server or worker waits for a silent peer before it is lost',
        section="ps", rule=Range(0, lo_open=True), limit=(0.05, 1e6))
    heartbeat_s: float = setting(
        1.0, "seconds between a worker's heartbeats (at most half of --ps-timeout)",
        section="ps", limit=(0.01, 1e6))
    on_worker_loss: str = setting(
        "continue",
        'parameter server: drop a dead worker and go on, or stop the run', choices=WORKER_LOSS,
        section="ps")
    # fault injection (phalanx.runtime.faults): RANK@STEP, SHARD@UPDATE, push loss probability
    kill_worker: str = setting("", 'fault injection: kill worker RANK at STEP (RANK@STEP)',
        section="faults")
    kill_server: str = setting("", 'fault injection: kill shard K after UPDATE updates (K@UPDATE)',
        section="faults")
    drop_messages: float = setting(
        0.0, 'fault injection: probability that a push is lost on the way',
        section="faults", rule=Range(0.0, 1.0, hi_open=True))
    # ASP / Downpour: ask for the next weights before this step's compute, so the pull's
    # round trip hides behind it (Downpour's asynchronous fetch; one push more staleness)
    pull_ahead: bool = setting(
        False,
        "ASP / Downpour: ask for the next weights before this step's compute (hides the "
        'pull; one more push of staleness)', section="ps")
    transport: str = setting(
        "auto", "parameter server: how messages travel (auto: shm when every rank is on "
        "this host, else gloo)", choices=TRANSPORTS, section="ps")
    # the consistency model (phalanx.ps.consistency.MODELS: bsp, asp, ssp, softsync);
    # "" = the one the parameter-server strategy is a preset of
    consistency: str = setting(
        "", "parameter server: the consistency model (default: the strategy's)", section="ps")
    # Downpour (Dean et al. 2012, Algorithm 7.1): between fetches a worker applies each of
    # its gradients to its local weights (plain SGD at --lr); off = every step of a fetch
    # period is computed on the fetched (stale) weights
    downpour_local_steps: bool = setting(
        True,
        'Downpour: between fetches apply each gradient to the local weights (Dean et '
        "al.'s client)", section="ps")

    # synchronous data parallel / averaging
    allreduce: str = setting(
        "native",
        "sync: whose allreduce (native: the backend's; ring: ours; main: through rank 0)",
        choices=ALLREDUCES, section="comm")
    bucket_mb: float = setting(
        25.0, 'sync: gradient bucket size in MB (buckets reduce while backward runs)',
        section="comm", rule=Range(0, lo_open=True), limit=(0, 1e6))
    sparse_allreduce: bool = setting(False, "sync: allreduce only the touched rows of a "
        "sparse embedding table (--model ctr), not the whole table", section="parallel")
    sfb: bool = setting(
        False, "sync / average: send fully connected layers' gradients as sufficient factors",
        section="comm")
    activation_checkpoint: int = setting(
        0, "recompute every K-th block's activations in backward instead of keeping them "
        "(0: off; 1: every block)", section="model", rule=Range(0), limit=(0, 10**6))
    precision: str = setting(
        "fp32", "bf16: autocast forward, fp32 loss, master weights and rule state, gradients "
        "sent in bf16 where the strategy allows (docs/memory.md)", choices=PRECISIONS,
        section="optim")
    zero_stage: int = setting(
        2, 'zero: what is sharded across the workers (1: optimizer state; 2: and gradients; '
        '3: and parameters)', section="parallel", rule=Range(1, 3), limit=(1, 3))
    period: int = setting(1, 'average: local steps between two averagings',
        section="average", rule=Range(1), limit=(1, 10**12))
    average_optimizer_state: bool = setting(
        False, 'average: average the optimizer state too, not only the weights', section="average")
    # --compress none|fp16|bf16|int8|topk:R|randk:R|powersgd:RANK (phalanx.comm.compress)
    compress: str = setting(
        "none",
        'compression of gradients / deltas (powersgd:RANK takes ,start=N and ,warm)',
        section="comm")  # its names: phalanx.comm.compress.CODECS
    error_feedback: bool = setting(
        True, 'keep what compression dropped and add it to the next message',
        section="comm", needs=("--compress", lambda c: c.compress != "none"))
    outer_rule: str = setting(
        "",
        "average: DiLoCo's outer optimizer on the averaged delta: sgd or nesterov (empty: "
        'plain averaging)', section="average")
    outer_lr: float = setting(
        1.0, 'average --outer-rule: the outer learning rate (sgd 1 = plain averaging)',
        section="average", needs=("--outer-rule sgd or nesterov", lambda c: bool(c.outer_rule)))
    outer_momentum: float = setting(0.9, 'average --outer-rule nesterov: the outer momentum',
        section="average", needs=("--outer-rule nesterov", lambda c: c.outer_rule == "nesterov"))

    # model / pipeline / hybrid / hogwild
    stages: int = setting(
        2, 'model-parallel / pipeline / hybrid: pipeline stages (processes per replica)',
        section="stages", rule=Range(1), limit=(1, 256))
    microbatches: int = setting(4, 'pipeline / hybrid: micro-batches per batch',
        section="stages", rule=Range(1), limit=(1, 2**16))
    pipeline_schedule: str = setting(
        "gpipe", 'pipeline / hybrid: the schedule', choices=PIPELINE_SCHEDULES, section="stages")
    replicas: int = setting(1, 'hybrid: data-parallel replicas of the pipeline',
        section="stages", rule=Range(1), limit=(1, 256))
    split_layer: str = setting(
        "", "model-parallel: split one Linear layer's columns over the workers (its name)",
        section="stages")
    split_at: str = setting(
        "", "pipeline / model-parallel / hybrid / zero / fsdp: the model's block list by its "
        "qualified name, e.g. transformer.h (default: its largest list of same-class "
        "modules)", section="stages")
    lock: bool = setting(False, 'hogwild: guard every write with a lock (the locked baseline)',
        section="hogwild")

    # sandblaster L-BFGS (a coordinator, shards holding parameters + history, workers)
    portions: int = setting(0, 'sandblaster: portions each batch is cut into (0: 8 x workers)',
        section="sandblaster", limit=(0, 10**7))
    history: int = setting(10, 'sandblaster: L-BFGS history size m (pairs kept on the shards)',
        section="sandblaster", rule=Range(1, text="must be >= 1 (L-BFGS keeps at least one pair)"),
        limit=(1, 10**4))
    line_search: str = setting(
        "backtracking",
        'sandblaster: backtracking (Armijo) or none (fixed step --lr)', choices=LINE_SEARCHES,
        section="sandblaster")
    static_portions: bool = setting(
        False, 'sandblaster: one fixed portion per worker, no backup tasks', section="sandblaster")

    # output
    out: str = setting(
        "runs/latest",
        'run folder: config.json, events.jsonl, summary.json, checkpoints, tensorboard/',
        section="output")
    eval_every: int = setting(0, "evaluate on the test set every N steps (0: at each epoch's end)",
        section="output", rule=Range(0), limit=(0, 10**12))
    checkpoint_every: int = setting(0, 'write a checkpoint every N steps (0: only at the end)',
        section="output", rule=Range(0), limit=(0, 10**12))
    resume: str = setting(
        "", 'continue the crashed or preempted run in this folder from its checkpoints '
        '(zero: with --workers N, on N workers, its shards re-cut)', section="output")
    progress: bool = setting(
        True, 'show a progress bar (a plain line every few seconds when not on a terminal)',
        section="output")
    tensorboard: bool = setting(True, 'write TensorBoard scalars under OUT/tensorboard',
        section="output")
    overwrite: bool = setting(
        False, 'clear the earlier run in --out first (only files a run writes)', section="output")

    @functools.cached_property
    def target(self) -> Device:
        """``--device``, parsed once (checked by :meth:`validate`)."""
        return parse_device(self.device)

    def validate(self) -> RunConfig:
        """Check every setting on its own (types, ranges, choices) and fill in the learning
        rate the rule starts from. What a setting means for the chosen strategy is checked
        one layer up, by :func:`phalanx.parallel.registry.check_config` (the API, the CLI,
        ``torchrun`` and ``--resume`` all call it)."""

        def need(cond: bool, name: str, what: str) -> None:
            if not cond:
                value = getattr(self, name)
                raise ConfigError(f"--{name.replace('_', '-')}: {short(value)} {what}")

        need(bool(self.strategy), "strategy", "must name a strategy")
        self.__dict__.pop("target", None)  # the device may have been set since
        _ = self.target  # cpu, cuda or cuda:K (the machine is checked at run time)
        for f in dataclasses.fields(self):  # each field's own declaration (setting())
            value, choices, rule = getattr(self, f.name), f.metadata.get("choices"), \
                f.metadata.get("rule")
            if choices:
                need(value in choices, f.name, f"is not one of {', '.join(choices)}")
            if rule is not None and isinstance(value, (int, float)) and \
                    not isinstance(value, bool):
                need(math.isfinite(value) and rule.holds(value), f.name, rule.says())
        # the rules that tie two settings together
        need(1 <= self.softsync <= self.workers, "softsync", "must be in 1..--workers")
        need(math.isfinite(self.heartbeat_s) and 0 < self.heartbeat_s <= self.ps_timeout / 2,
             "heartbeat_s", "must be > 0 and at most half of --ps-timeout")
        need(self.portions == 0 or self.portions >= self.workers, "portions",
             f"must be 0 (8 x workers) or at least --workers ({self.workers})")
        check_ranges(self)  # every number: finite, fits its C type, not absurd
        need(bool(self.out), "out", "must be a directory path")
        return self

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["slow_workers"] = {str(k): v for k, v in self.slow_workers.items()}
        return d

    @classmethod
    def from_mapping(cls, values: dict[str, Any], source: str = "config") -> RunConfig:
        """Build from a dict (a config file or keyword arguments); unknown keys are errors."""
        names = {f.name: f for f in dataclasses.fields(cls)}
        kwargs: dict[str, Any] = {}
        for key, value in values.items():
            if not isinstance(key, str):
                raise ConfigError(f"{source}: setting names must be strings, got {short(key)}")
            name = key.replace("-", "_")
            if name not in names:
                raise ConfigError(f"{source}: unknown setting {short(key)}")
            if name == "slow_workers":
                if isinstance(value, str):
                    value = parse_slow_workers(value)
                elif isinstance(value, dict):
                    try:
                        value = {int(k): float(v) for k, v in value.items()}
                    except (TypeError, ValueError, OverflowError):
                        raise ConfigError(
                            f"{source}: slow_workers must map rank -> factor") from None
                else:
                    raise ConfigError(f"{source}: slow_workers must be 'R:F,...' or a mapping")
            else:
                value = _coerce(names[name], value, source)
            kwargs[name] = value
        return cls(**kwargs)


def _coerce(f: dataclasses.Field, value: Any, source: str) -> Any:
    kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    try:
        if kind == "bool":
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.lower() in ("true", "1", "yes", "false", "0", "no"):
                return value.lower() in ("true", "1", "yes")
            raise ValueError
        if kind == "int":
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            return int(value)
        if kind in ("float", "float | None"):
            if value is None and kind == "float | None":
                return None
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        if kind in ("str", "str | None"):
            if value is None and kind == "str | None":
                return None
            if not isinstance(value, str):
                raise ValueError
            return value
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(f"{source}: {f.name} = {short(value)} is not a valid {kind}") from None
    return value


def load_config_file(path: str) -> dict[str, Any]:
    """Read a JSON or YAML run-configuration file into a dict (validated later)."""
    if not path:
        raise ConfigError("--config: the path is empty (name a JSON or YAML file)")
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"--config: {path}: no such file")
    text = read_config_text(p, "--config")
    try:
        if p.suffix in (".yaml", ".yml"):
            import yaml

            values = yaml.safe_load(text)
        else:
            values = json.loads(text)
    except Exception as e:  # noqa: BLE001 - any parse error becomes one line
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ConfigError(f"--config: {path}: not valid JSON/YAML ({first})") from None
    if not isinstance(values, dict):
        raise ConfigError(f"--config: {path}: must be a mapping of setting -> value")
    return values


MAX_CONFIG_BYTES = 1 << 20  # a run configuration is a few hundred bytes


def read_config_text(p: Path, flag: str) -> str:
    """The text of a small UTF-8 settings file, or one line saying why not."""
    try:
        with p.open("rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as e:
        raise ConfigError(f"{flag}: {p}: cannot read ({e.strerror})") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{flag}: {p}: larger than {MAX_CONFIG_BYTES} bytes "
                          "(not a settings file)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{flag}: {p}: not UTF-8 text (byte {e.start})") from None
    if "\x00" in text:
        raise ConfigError(f"{flag}: {p}: binary file (NUL byte), not JSON/YAML")
    return text
