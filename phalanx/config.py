"""Typed run configuration: one validated dataclass, built from defaults, a JSON/YAML file
and CLI overrides (in that order)."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from phalanx.errors import ConfigError
from phalanx.limits import check_ranges, short

LINE_SEARCHES = ("backtracking", "none")  # sandblaster L-BFGS
RULES = ("sgd", "momentum", "nesterov", "adagrad", "rmsprop", "adam")
SCHEDULES = ("constant", "step", "cosine")
DEVICES = ("cpu", "cuda")
BACKENDS = ("auto", "nccl", "gloo")  # collectives' backend (phalanx.runtime.placement)
DATA_ON_DEVICE = ("auto", "yes", "no")
ALLREDUCES = ("ring", "native", "main")
PIPELINE_SCHEDULES = ("gpipe", "1f1b")
# learning rate used when --lr is not given: a sensible start for each rule
DEFAULT_LR = {"sgd": 0.05, "momentum": 0.01, "nesterov": 0.01, "adagrad": 0.01,
              "rmsprop": 0.001, "adam": 0.001}


def parse_slow_workers(text: str) -> dict[int, float]:
    """``"0:3.0,2:1.5"`` -> ``{0: 3.0, 2: 1.5}`` (rank -> slowdown factor >= 1)."""
    out: dict[int, float] = {}
    if not text:
        return out
    for item in text.split(","):
        rank_s, sep, factor_s = item.strip().partition(":")
        try:
            rank, factor = int(rank_s), float(factor_s)
        except ValueError:
            raise ConfigError(f"--slow-workers: {item!r} is not RANK:FACTOR (e.g. 0:3.0)") from None
        if not sep or rank < 0 or not math.isfinite(factor) or factor < 1.0:
            raise ConfigError(f"--slow-workers: {item!r} needs a rank >= 0 and a factor >= 1")
        out[rank] = factor
    return out


def parse_device(device: str) -> tuple[str, int | None]:
    """``"cpu"`` -> (cpu, None); ``"cuda"`` -> (cuda, None); ``"cuda:K"`` -> (cuda, K)."""
    kind, sep, index = device.partition(":")
    if kind == "cpu" and not sep:
        return "cpu", None
    if kind == "cuda" and not sep:
        return "cuda", None
    if kind == "cuda" and index.isdigit():
        return "cuda", int(index)
    raise ConfigError(f"--device: {device!r} is not one of cpu, cuda, cuda:K")


@dataclass
class RunConfig:
    """Everything one training run needs. Field names are the CLI flags (``_`` -> ``-``)."""

    # what to train
    model: str = "lenet5"
    data: str = "fashion-mnist"
    data_dir: str | None = None
    train_limit: int = 0  # use only the first N training samples (0 = all)
    test_limit: int = 0
    non_iid: float = 0.0  # 0 = iid shards; 1 = fully label-sorted shards
    augment: str = ""  # comma list: flip,translate,rotate,noise

    # optimisation
    epochs: float = 1.0
    max_steps: int = 0  # stop after this many steps per worker (0 = epochs decide)
    batch_size: int = 64
    lr: float | None = None  # None: the rule's default (DEFAULT_LR)
    rule: str = "sgd"
    momentum: float = 0.9
    weight_decay: float = 0.0
    schedule: str = "constant"
    warmup_steps: int = 0
    step_size: int = 1000  # step decay: multiply lr by gamma every step_size steps
    gamma: float = 0.1
    grad_accum: int = 1

    # strategy
    strategy: str = "single"
    workers: int = 1
    seed: int = 0
    device: str = "cpu"
    threads: int = 0  # intra-op threads in the driver (0 = PyTorch's default); workers use 1
    slow_workers: dict[int, float] = field(default_factory=dict)
    # per-rank placement (phalanx.runtime.placement): collectives' backend, training set on
    # the GPU, intra-op threads of each worker process (0 = max(1, cores // processes))
    backend: str = "auto"
    data_on_device: str = "auto"
    worker_threads: int = 0

    # parameter server family
    servers: int = 1
    staleness: int = 3
    softsync: int = 1
    nfetch: int = 1
    npush: int = 1
    dc_lambda: float = 0.04
    dc_adaptive: bool = False
    dc_momentum: float = 0.95  # moving average of g*g for DC-ASGD-a
    staleness_lr: bool = False  # divide each applied step by its staleness
    ps_timeout: float = 60.0  # seconds a PS server/worker waits for a silent peer
    heartbeat_s: float = 1.0  # seconds between PS worker heartbeats (dead: silent ps_timeout s)
    on_worker_loss: str = "continue"  # PS: drop a dead worker and go on, or stop the run
    # fault injection (phalanx.runtime.faults): RANK@STEP, SHARD@UPDATE, push loss probability
    kill_worker: str = ""
    kill_server: str = ""
    drop_messages: float = 0.0
    # ASP / Downpour: ask for the next weights before this step's compute, so the pull's
    # round trip hides behind it (Downpour's asynchronous fetch; one push more staleness)
    pull_ahead: bool = False
    # the consistency model (phalanx.ps.consistency.MODELS: bsp, asp, ssp, softsync);
    # "" = the one the parameter-server strategy is a preset of
    consistency: str = ""
    # Downpour (Dean et al. 2012, Algorithm 7.1): between fetches a worker applies each of
    # its gradients to its local weights (plain SGD at --lr); off = every step of a fetch
    # period is computed on the fetched (stale) weights
    downpour_local_steps: bool = True

    # synchronous data parallel / averaging
    allreduce: str = "native"
    bucket_mb: float = 25.0
    sfb: bool = False
    period: int = 1
    average_optimizer_state: bool = False
    # --compress none|fp16|bf16|int8|topk:R|randk:R|powersgd:RANK (phalanx.comm.compress)
    compress: str = "none"
    error_feedback: bool = True  # keep what compression dropped and send it later
    outer_rule: str = ""  # DiLoCo outer optimizer for --strategy average: sgd | nesterov
    outer_lr: float = 1.0
    outer_momentum: float = 0.9

    # model / pipeline / hybrid / hogwild
    stages: int = 2
    microbatches: int = 4
    pipeline_schedule: str = "gpipe"
    replicas: int = 1
    split_layer: str = ""
    lock: bool = False

    # sandblaster L-BFGS (a coordinator, shards holding parameters + history, workers)
    portions: int = 0  # portions each batch is cut into (0 = 8 x workers)
    history: int = 10  # L-BFGS history size m (pairs kept on the shards)
    line_search: str = "backtracking"  # backtracking (Armijo) | none (fixed step lr)
    static_portions: bool = False  # one fixed portion per worker, no backup tasks

    # output
    out: str = "runs/latest"
    eval_every: int = 0  # evaluate every N steps (0 = once per epoch)
    checkpoint_every: int = 0
    resume: str = ""  # restart a crashed run from DIR/config.json and DIR's checkpoints
    progress: bool = True
    tensorboard: bool = True
    overwrite: bool = False  # a non-empty --out is refused unless this (clears it) or --resume

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
        need(self.rule in RULES, "rule", f"is not one of {', '.join(RULES)}")
        need(self.schedule in SCHEDULES, "schedule", f"is not one of {', '.join(SCHEDULES)}")
        parse_device(self.device)  # cpu, cuda or cuda:K (the machine is checked at run time)
        need(self.backend in BACKENDS, "backend", f"is not one of {', '.join(BACKENDS)}")
        need(self.data_on_device in DATA_ON_DEVICE, "data_on_device",
             f"is not one of {', '.join(DATA_ON_DEVICE)}")
        need(0 <= self.worker_threads <= 1024, "worker_threads", "must be in 0..1024")
        need(self.allreduce in ALLREDUCES, "allreduce", f"is not one of {', '.join(ALLREDUCES)}")
        need(
            self.pipeline_schedule in PIPELINE_SCHEDULES,
            "pipeline_schedule",
            f"is not one of {', '.join(PIPELINE_SCHEDULES)}",
        )
        need(math.isfinite(self.epochs) and self.epochs > 0, "epochs", "must be > 0")
        need(self.max_steps >= 0, "max_steps", "must be >= 0")
        need(self.batch_size >= 1, "batch_size", "must be >= 1")
        if self.lr is None:  # the rule's start; a strategy's own default replaces it later
            self.lr = DEFAULT_LR[self.rule]
            self.lr_defaulted = True  # not a field: never written, never a flag
        need(math.isfinite(self.lr) and self.lr > 0, "lr", "must be a finite number > 0")
        need(0 <= self.momentum < 1, "momentum", "must be in [0, 1)")
        need(self.weight_decay >= 0, "weight_decay", "must be >= 0")
        need(self.warmup_steps >= 0, "warmup_steps", "must be >= 0")
        need(self.step_size >= 1, "step_size", "must be >= 1")
        need(0 < self.gamma <= 1, "gamma", "must be in (0, 1]")
        need(self.grad_accum >= 1, "grad_accum", "must be >= 1")
        need(1 <= self.workers <= 256, "workers", "must be in 1..256")
        need(0 <= self.threads <= 1024, "threads", "must be in 0..1024")
        need(1 <= self.servers <= 64, "servers", "must be in 1..64")
        need(self.staleness >= 0, "staleness", "must be >= 0")
        need(1 <= self.softsync <= self.workers, "softsync", "must be in 1..--workers")
        need(self.nfetch >= 1, "nfetch", "must be >= 1")
        need(self.npush >= 1, "npush", "must be >= 1")
        need(self.dc_lambda >= 0, "dc_lambda", "must be >= 0")
        need(0 <= self.dc_momentum < 1, "dc_momentum", "must be in [0, 1)")
        need(math.isfinite(self.ps_timeout) and self.ps_timeout > 0, "ps_timeout", "must be > 0")
        need(self.bucket_mb > 0, "bucket_mb", "must be > 0")
        need(self.period >= 1, "period", "must be >= 1")
        need(self.stages >= 1, "stages", "must be >= 1")
        need(self.microbatches >= 1, "microbatches", "must be >= 1")
        need(self.replicas >= 1, "replicas", "must be >= 1")
        need(self.train_limit >= 0, "train_limit", "must be >= 0")
        need(self.test_limit >= 0, "test_limit", "must be >= 0")
        need(0.0 <= self.non_iid <= 1.0, "non_iid", "must be in [0, 1]")
        need(self.eval_every >= 0, "eval_every", "must be >= 0")
        need(self.checkpoint_every >= 0, "checkpoint_every", "must be >= 0")
        need(math.isfinite(self.heartbeat_s) and 0 < self.heartbeat_s <= self.ps_timeout / 2,
             "heartbeat_s", "must be > 0 and at most half of --ps-timeout")
        need(self.on_worker_loss in ("continue", "stop"), "on_worker_loss",
             "is not one of continue, stop")
        need(math.isfinite(self.drop_messages) and 0 <= self.drop_messages < 1,
             "drop_messages", "must be in [0, 1)")
        need(self.history >= 1, "history", "must be >= 1 (L-BFGS keeps at least one pair)")
        need(self.line_search in LINE_SEARCHES, "line_search",
             f"is not one of {', '.join(LINE_SEARCHES)}")
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
