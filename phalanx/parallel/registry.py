"""Every strategy phalanx has, and the checks that read their specs.

The one place a strategy is listed: adding one is its module (ending with a
:class:`~phalanx.parallel.spec.StrategySpec`) plus one line in ``_SPECS`` below.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from phalanx.comm.compress import check_compression
from phalanx.config import RunConfig
from phalanx.data import DATASETS
from phalanx.errors import ConfigError
from phalanx.models import MODELS as MODEL_NAMES
from phalanx.models import RECIPES, Recipe
from phalanx.models.zoo import SPARSE_GRADS
from phalanx.parallel import (
    fsdp,
    hogwild,
    hybrid,
    model_averaging,
    model_parallel,
    pipeline,
    ps,
    sandblaster,
    single,
    sync_dp,
    tensor_parallel,
    zero,
)
from phalanx.parallel.precision import REFUSALS as PRECISION_REFUSALS
from phalanx.parallel.spec import FEATURES, StrategySpec
from phalanx.ps.consistency import MODELS, model_class
from phalanx.rules import RULES, SCHEDULES
from phalanx.runtime.faults import check_fault_flags

_SPECS: tuple[StrategySpec, ...] = (
    single.SPEC,
    sync_dp.SPEC,
    model_averaging.SPEC,
    *ps.SPECS,
    hogwild.SPEC,
    model_parallel.SPEC,
    pipeline.SPEC,
    hybrid.SPEC,
    tensor_parallel.SPEC,
    sandblaster.SPEC,
    zero.SPEC,
    fsdp.SPEC,
)

STRATEGIES: dict[str, StrategySpec] = {s.name: s for s in _SPECS}
assert len(STRATEGIES) == len(_SPECS), "two strategies share a name"
NAMES: tuple[str, ...] = tuple(STRATEGIES)
EPOCHS_DEFAULT = RunConfig.__dataclass_fields__["epochs"].default
RULE_DEFAULT = RunConfig.__dataclass_fields__["rule"].default


def spec(name: str) -> StrategySpec:
    """The spec of strategy ``name`` (one-line error listing the strategies otherwise)."""
    found = STRATEGIES.get(name)
    if found is None:
        raise ConfigError(f"--strategy: {name!r} is not one of {', '.join(NAMES)}")
    return found


def honoured_by() -> dict[str, tuple[str, ...]]:
    """feature -> the strategies whose specs declare it."""
    return {f: tuple(s.name for s in _SPECS if f in s.supports) for f in sorted(FEATURES)}


def option_owners() -> dict[str, tuple[str, ...]]:
    """RunConfig setting -> the strategies that read it (settings every strategy reads
    are not listed)."""
    owners: dict[str, list[str]] = {}
    for s in _SPECS:
        for name in s.options:
            owners.setdefault(name, []).append(s.name)
    return {k: tuple(v) for k, v in owners.items()}


def consistency_options() -> dict[str, tuple[str, ...]]:
    """RunConfig setting -> the consistency models that read it."""
    owners: dict[str, list[str]] = {}
    for name, cls in MODELS.items():
        for option in cls.options:
            owners.setdefault(option, []).append(name)
    return {k: tuple(v) for k, v in owners.items()}


def resolve_rule(cfg: RunConfig, s: StrategySpec) -> None:
    """The update rule and learning rate the run trains with, decided here and only here
    (``lr`` None: the user chose none). The strategy's own default where it has one: with
    ``--rule`` left out too, the synchronous strategies' momentum scaled with the global
    batch; L-BFGS's step 1. Else the rule's own start. A learning rate already set (the
    user's, or this check's on an earlier call) stands."""
    rule = RULES.get(cfg.rule)  # a known rule (one line naming --rule otherwise)
    SCHEDULES.get(cfg.schedule)  # a known schedule (likewise)
    if cfg.lr is not None:
        return
    recipe = RECIPES.get(cfg.model)
    if recipe is not None and cfg.rule == RULE_DEFAULT and s.default_lr is None:
        _apply_recipe(cfg, recipe)  # the model's own (the GPT's AdamW + cosine)
        return
    own = s.default_rule(cfg) if cfg.rule == RULE_DEFAULT else None
    if own is not None:  # the user named neither --rule nor --lr: the strategy's choice
        cfg.rule, cfg.lr = own
    else:
        cfg.lr = s.default_lr if s.default_lr is not None else rule.default_lr


def _apply_recipe(cfg: RunConfig, recipe: Recipe) -> None:
    """A model's recipe: its rule and learning rate, and its schedule and weight decay
    where those are still at their defaults (a user's own value stands)."""
    cfg.rule, cfg.lr = recipe.rule, recipe.lr
    fields = RunConfig.__dataclass_fields__
    for name in ("schedule", "warmup_steps", "weight_decay"):
        if getattr(cfg, name) == fields[name].default:
            setattr(cfg, name, getattr(recipe, name))


def check_config(cfg: RunConfig) -> RunConfig:
    """Every check of a run configuration: each setting on its own
    (:meth:`RunConfig.validate`), then against the strategy's spec — the ranks that
    ``--slow-workers`` / ``--kill-worker`` name, the fault and compression flags it
    honours, the consistency model, and the strategy's own ``check``. Returns ``cfg``."""
    s = spec(cfg.strategy)
    # names are checked before anything starts (a study would print its first run first)
    DATASETS.get(cfg.data)  # one line naming --data and the catalog otherwise
    MODEL_NAMES.get(cfg.model)
    resolve_rule(cfg, s)
    if s.default_epochs is not None and cfg.epochs == EPOCHS_DEFAULT and not cfg.max_steps:
        cfg.epochs = s.default_epochs  # e.g. L-BFGS's passes: one would train nothing
    cfg.validate()
    ranks, flags = s.compute_ranks(cfg)
    for rank in cfg.slow_workers:
        if rank >= ranks:
            raise ConfigError(f"--slow-workers: rank {rank} does not exist with {flags}")
    by_feature = honoured_by()
    check_fault_flags(cfg, by_feature, ranks, flags)
    check_compression(cfg, by_feature)
    if cfg.consistency:
        model_class(cfg.consistency)  # a known model
        if not s.is_parameter_server:
            raise s.refuse("consistency", "only the parameter-server strategies have a "
                           "consistency model")
    check_sparse_grads(cfg, s)
    check_precision(cfg, s)
    s.check(cfg)
    return cfg


# why a strategy without "sparse_grads" refuses a model whose table has sparse gradients
SPARSE_REFUSALS = {
    "hogwild": "its workers add dense updates into one shared-memory copy of every weight",
    "model-parallel": "its stages run the rule on dense gradients and the table is one stage's",
    "pipeline": "its stages run the rule on dense gradients and the table is one stage's",
    "hybrid": "its stage replicas allreduce dense gradients and the table is one stage's",
    "sandblaster": "its coordinator deals every parameter out as dense portions",
}


def check_sparse_grads(cfg: RunConfig, s: StrategySpec) -> None:
    """A model with a sparse-gradient table (--model ctr) only with a strategy that takes
    such gradients (docs/workloads.md, the click-through model)."""
    if cfg.model in SPARSE_GRADS and "sparse_grads" not in s.supports:
        why = SPARSE_REFUSALS.get(s.name, "it handles dense gradients only")
        able = ", ".join(n for n in NAMES if "sparse_grads" in STRATEGIES[n].supports)
        raise ConfigError(f"--model {cfg.model}: --strategy {s.name} cannot take the sparse "
                          f"gradients of its embedding table ({why}); use one of {able}")


def check_precision(cfg: RunConfig, s: StrategySpec) -> None:
    """``--precision bf16`` only with a strategy that declares it (the feature ``bf16``),
    else one line saying why this one cannot (:data:`phalanx.parallel.precision.REFUSALS`)."""
    if cfg.precision == "fp32" or "bf16" in s.supports:
        return
    key = "parameter-server" if s.is_parameter_server else s.name
    why = PRECISION_REFUSALS.get(key, "it is not wired for mixed precision")
    able = ", ".join(n for n in NAMES if "bf16" in STRATEGIES[n].supports)
    raise ConfigError(f"--precision {cfg.precision}: --strategy {s.name} cannot take it "
                      f"({why}); use one of {able}")


def needs() -> tuple[tuple[str, Callable[[RunConfig], bool], str], ...]:
    """(setting, whether it is read, what it needs) for the settings that mean something
    only beside another setting's value (``needs=`` in their declaration)."""
    return tuple((f.name, f.metadata["needs"][1], f.metadata["needs"][0])
                 for f in dataclasses.fields(RunConfig) if f.metadata.get("needs"))


def check_flags_apply(cfg: RunConfig) -> None:
    """Refuse a setting that the chosen strategy would ignore (``phalanx train``): a
    setting some strategies' specs list in ``options``, or one a consistency model reads,
    at a non-default value with a strategy that does not read it; or a setting that is
    read only beside another one's value (its ``needs``) without it."""
    s = spec(cfg.strategy)
    defaults = {f.name: f.default for f in dataclasses.fields(cfg)}
    for name, strategies in option_owners().items():
        if cfg.strategy not in strategies and getattr(cfg, name) != defaults[name]:
            raise ConfigError(f"--{name.replace('_', '-')}: --strategy {cfg.strategy} does not "
                              f"use it (only {', '.join(strategies)}); drop it")
    model = cfg.consistency or s.preset.get("consistency")
    for name, models in consistency_options().items():
        if model not in models and getattr(cfg, name) != defaults[name]:
            used = f"consistency {model}" if model else f"--strategy {cfg.strategy}"
            raise ConfigError(f"--{name.replace('_', '-')}: {used} does not use it (only "
                              f"consistency {', '.join(models)}); drop it")
    for name, is_read, needed in needs():
        if getattr(cfg, name) != defaults[name] and not is_read(cfg):
            raise ConfigError(f"--{name.replace('_', '-')}: only read with {needed}; drop it")
    for name, why in s.unused.items():
        if getattr(cfg, name) != defaults[name]:
            raise ConfigError(f"--{name.replace('_', '-')}: --strategy {cfg.strategy} does not "
                              f"use it ({why}); drop it")
    if cfg.non_iid != defaults["non_iid"] and s.data_shards(cfg)[0] <= 1:
        raise ConfigError(f"--non-iid: --strategy {cfg.strategy} trains on one stream of "
                          "batches (no shards to skew); drop it")
    if s.fixed_workers and cfg.workers != s.fixed_workers:
        raise ConfigError(f"--workers: --strategy {cfg.strategy} trains with "
                          f"{s.fixed_workers} worker(s), got {cfg.workers} (choose a "
                          "parallel strategy, e.g. sync)")
