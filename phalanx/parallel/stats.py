"""Each strategy's run statistics: typed here, turned into a dict only when the summary is
written (``summary.json`` and the ``summary`` event hold these fields after the common
ones; docs/events.md). A misspelt field is an error where it is set, not a silent 0."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Traffic:
    bytes_sent: int = 0  # every process's messages, payload and headers
    bytes_per_sample: float = 0.0

    @staticmethod
    def per_sample(sent: float, samples: int) -> float:
        return sent / samples if samples else 0.0


@dataclass
class SyncStats(Traffic):
    allreduce: str = "native"
    bytes_estimated: int = 0  # the allreduce's own model of its traffic
    buckets: int = 0
    buckets_launched_in_backward: int = 0  # overlapped with backward
    buckets_launched: int = 0
    comm_wait_s: float = 0.0  # time the step waited for the last bucket
    sfb_layers: int = 0  # layers sent as sufficient factors
    compress: str = "none"
    contributions_skipped: int = 0  # --compress: a rank's NaN / inf bucket sent as zeros
    values_clipped: int = 0  # --compress: values beyond the codec's range, clipped


@dataclass
class AveragingStats(Traffic):
    allreduce: str = "native"
    period: int = 1
    average_optimizer_state: bool = False
    averaging_rounds: int = 0
    bytes_estimated: int = 0
    compress: str = "none"
    outer_rule: str = ""
    contributions_skipped: int = 0  # --compress: a rank's NaN / inf delta sent as zeros
    values_clipped: int = 0  # --compress: values beyond the codec's range, clipped


@dataclass
class ZeroStats(Traffic):
    """Sharded data parallel: the stage, its units, and what each rank holds (counted and
    by the formula: phalanx/parallel/zero_memory.py)."""

    allreduce: str = "native"
    bytes_estimated: int = 0
    compress: str = "none"
    zero_stage: int = 0
    units: int = 0
    held_params_bytes: int = 0  # the largest rank's
    held_grads_bytes: int = 0
    held_optimizer_bytes: int = 0
    held_bytes_per_rank: list[int] = field(default_factory=list)
    formula_params_bytes: int = 0
    formula_grads_bytes: int = 0
    formula_optimizer_bytes: int = 0
    formula_bytes: int = 0
    memory_convention: str = ""


@dataclass
class ParameterServerStats(Traffic):
    consistency: str = ""  # the model's name, e.g. ssp(3)
    servers: int = 1
    staleness_mean: float = 0.0  # over applied pushes
    staleness_max: int = 0
    staleness_histogram: list[int] = field(default_factory=list)  # [staleness] -> pushes
    pushes_applied: int = 0
    pushes_rejected: int = 0
    messages_rejected: int = 0
    server_updates: int = 0  # shard 0's
    pushes_lost: int = 0  # gaps in a worker's push sequence (dropped on the way)
    pushes_dropped: int = 0  # dropped by --drop-messages at the workers
    duplicates: int = 0
    workers_lost: list[int] = field(default_factory=list)
    # one entry per lost worker: who saw it (the driver, a server) and what each knows
    # (runtime/exits.py: merge_losses)
    worker_losses: list[dict] = field(default_factory=list)
    pushes_skipped: int = 0  # --compress: NaN / inf gradients not sent (the shards rejected)
    values_clipped: int = 0  # --compress: values beyond the codec's range, clipped
    pull_resyncs: int = 0  # compressed pulls answered in full after a failed checksum


@dataclass
class HogwildStats(Traffic):
    updates: int = 0
    lock: bool = False
    shared_bytes_written: int = 0  # updates x model bytes: what the workers wrote in place
    train_wall_s: float = 0.0  # first worker's start to last worker's end
    train_samples_per_s: float = 0.0
    launch_wall_s: float = 0.0


@dataclass
class StageStats(Traffic):
    """Model parallel by layers and the pipelines: how the model was cut."""

    stages: int = 1
    partition: list[str] = field(default_factory=list)  # each stage's layers
    partition_source: str = ""
    stage_costs: list[float] = field(default_factory=list)


@dataclass
class ModelParallelStats(StageStats):
    stage_compute_s: list[float] = field(default_factory=list)
    stage_wait_s: list[float] = field(default_factory=list)


@dataclass
class PipelineStats(StageStats):
    replicas: int = 1  # hybrid: data-parallel copies of the pipeline
    microbatches: int = 1
    pipeline_schedule: str = "gpipe"
    stage_idle_fraction: list[float] = field(default_factory=list)
    bubble_theory: float = 0.0  # (p - 1) / (m + p - 1)
    stage_peak_live_microbatches: list[int] = field(default_factory=list)
    stage_peak_saved_bytes: list[int] = field(default_factory=list)


@dataclass
class ColumnParallelStats(Traffic):
    split_layer: str = ""
    split_bounds: list[list[int]] = field(default_factory=list)


@dataclass
class TensorParallelStats(Traffic):
    tensor_parallel: int = 0  # ranks each block is split over
    split_blocks: int = 0


@dataclass
class SandblasterStats(Traffic):
    iterations: int = 0
    function_evals: int = 0
    final_loss: float = 0.0
    stop_reason: str = ""  # which test ended L-BFGS (budget, converged, line search, ...)
    line_search: str = ""
    history: int = 0
    portions: int = 0
    servers: int = 1
    portions_per_worker: dict[int, int] = field(default_factory=dict)
    backups_issued: int = 0
    backups_wasted: int = 0
    portions_reissued: int = 0
    workers_lost: list[int] = field(default_factory=list)
    worker_losses: list[dict] = field(default_factory=list)  # as ParameterServerStats'
    coordinator_bytes: int = 0
    coordinator_fetch_bytes: int = 0
    shard_pushes_applied: int = 0
    shard_pushes_wasted: int = 0
    shard_messages_rejected: int = 0
