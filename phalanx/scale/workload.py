"""The workload layer: what one training step of a model computes and which bytes it must
exchange, independent of any strategy or network.

A :class:`Workload` is the model's layers in registration order (parameters and the share of
the step's compute each takes), its per-worker batch, the compute time of one step (forward
and backward) on the reference device, and the extras some strategies need (activation bytes
at a stage cut, the CTR table's sparse rows).

Compute comes from one of three sources, and the workload says which (``compute_source``):

* ``profile``: measured here (``phalanx.scale.profile``, ``--profile-here``);
* ``table``: FLOPs per sample / (a device's peak FLOP/s x an efficiency the user sets);
* ``paper``: a published per-device throughput (samples/s), an assumption cited with it.

The catalog's published models have their parameter counts from the torchvision / the
papers' architectures, split per stage; the per-stage compute shares are approximate FLOP
shares (labelled so in ``notes``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import numpy as np

from phalanx.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class Layer:
    name: str
    params: int
    compute_share: float  # fraction of the step's compute in this layer (forward = backward)
    unit: str = ""  # the ZeRO-3 unit phalanx gathers it with ("root": at the step's start;
    #                 "": not known, e.g. a published model's table)


@dataclass(frozen=True, kw_only=True)
class Sparse:
    """An embedding table updated by rows: ``rows`` ids of ``dim`` floats, ids drawn Zipf(s)
    with ``lookups`` per sample (the CTR model's fields).

    With ``vocab`` (one vocabulary size per field, ``--data ctr-synthetic``'s for its seed:
    :func:`phalanx.data.ctr.vocab_sizes`) the table is the CTR model's: field f has
    ``field_rows`` rows of its own, its values are ranked Zipf(s) over ``vocab[f]``, dealt
    to ids by a permutation and hashed to row ``id % field_rows`` (colliding ids share a
    row). Without it, one Zipf(s) over all ``rows``, ``lookups`` draws a sample."""

    rows: int
    dim: int
    zipf_s: float
    lookups: int
    vocab: tuple[int, ...] = ()
    field_rows: int = 0

    def __post_init__(self) -> None:
        if self.vocab and (len(self.vocab) != self.lookups or self.field_rows < 1
                           or self.rows != self.field_rows * len(self.vocab)
                           or min(self.vocab) < 1):
            raise ConfigError(f"sparse table: {len(self.vocab)} vocabularies for "
                              f"{self.lookups} fields of {self.field_rows} rows "
                              f"({self.rows} in all)")

    def unique_rows(self, samples: int) -> float:
        """Expected distinct rows touched by ``samples`` samples: sum_i 1 - (1 - p_i)^draws
        over the rows' probabilities (ids i.i.d. within a field)."""
        if self.vocab:
            return sum(_field_unique_rows(v, self.field_rows, self.zipf_s, samples)
                       for v in self.vocab)
        return _unique_rows(self.rows, self.zipf_s, samples * self.lookups)


def _zipf(n: int, s: float) -> np.ndarray:
    p = 1.0 / np.arange(1, n + 1, dtype=float) ** s
    return p / p.sum()


@functools.lru_cache(maxsize=256)
def _unique_rows(rows: int, s: float, draws: int) -> float:
    return float(np.sum(-np.expm1(draws * np.log1p(-_zipf(rows, s)))))


@functools.lru_cache(maxsize=1024)
def _field_unique_rows(vocab: int, rows: int, s: float, draws: int) -> float:
    """One field: ``vocab`` values ranked Zipf(s), dealt to ids by a permutation, hashed
    to ``id % rows``. A row's probability is the sum over the ranks that land on it; the
    permutation is a fixed draw (the data's own is not reproducible without making the
    log), which moves the count by well under 1% (the hot ranks seldom share a row)."""
    p = _zipf(vocab, s)
    if vocab > rows:
        ids = np.random.default_rng(vocab).permutation(vocab)
        p = np.bincount(ids % rows, weights=p, minlength=rows)
        p = p[p > 0]
    return float(np.sum(-np.expm1(draws * np.log1p(-np.minimum(p, 1 - 1e-16)))))


@dataclass(frozen=True, kw_only=True)
class Workload:
    name: str
    layers: tuple[Layer, ...]
    batch: int                      # samples per worker per step
    step_compute_s: float           # forward + backward of one step on one reference device
    backward_fraction: float = 2 / 3
    element_size: int = 4           # bytes per gradient element (fp32)
    activation_bytes: float = 0.0   # bytes per sample at a pipeline / tensor cut
    tp_layers: int = 0              # layers with Megatron-style tensor-parallel allreduces
    sparse: Sparse | None = None
    compute_source: str = "paper"
    notes: str = ""
    # bytes per sample at each cut of a split into P stages, for P = 2, 3, ... (entry P - 2:
    # P - 1 cuts), where phalanx's own partition of the model was run (profile); else
    # ``activation_bytes`` at every cut
    cut_bytes: tuple[tuple[float, ...], ...] = ()
    # the trainable parameters of each stage of those splits (same entries); else even
    stage_params: tuple[tuple[int, ...], ...] = ()

    def __post_init__(self) -> None:
        if not self.layers:
            raise ConfigError(f"workload {self.name}: no layers")
        if self.batch < 1:
            raise ConfigError(f"--batch: {self.batch} is not >= 1")
        if not self.step_compute_s > 0:
            raise ConfigError(f"workload {self.name}: step compute must be > 0 s")
        if not 0 < self.backward_fraction < 1:
            raise ConfigError(f"workload {self.name}: backward fraction must be in (0, 1)")

    @property
    def params(self) -> int:
        return sum(layer.params for layer in self.layers)

    @property
    def grad_bytes(self) -> int:
        return self.params * self.element_size

    @property
    def dense_params(self) -> int:
        """Parameters outside the sparse table (all of them without one)."""
        if self.sparse is None:
            return self.params
        return self.params - self.sparse.rows * self.sparse.dim

    def without_table(self) -> Workload:
        """The workload whose gradient buckets carry everything but the sparse table (its
        layer: the first whose parameters are the table's rows x dim)."""
        if self.sparse is None:
            return self
        size = self.sparse.rows * self.sparse.dim
        at = next((i for i, layer in enumerate(self.layers) if layer.params == size), None)
        if at is None or len(self.layers) == 1:
            return self
        return replace(self, layers=self.layers[:at] + self.layers[at + 1:], sparse=None)

    def with_batch(self, batch: int) -> Workload:
        """Same model at another per-worker batch: compute scales linearly (the per-sample
        cost of a device already saturated by the reference batch)."""
        return replace(self, batch=batch, step_compute_s=self.step_compute_s * batch / self.batch)

    def cuts(self, stages: int) -> tuple[float, ...]:
        """Bytes per sample crossing each of the ``stages - 1`` cuts, first to last."""
        i = stages - 2
        if 0 <= i < len(self.cut_bytes) and len(self.cut_bytes[i]) == stages - 1:
            return self.cut_bytes[i]
        return (self.activation_bytes,) * max(stages - 1, 0)

    def stage_grad_bytes(self, stages: int) -> tuple[float, ...]:
        """Gradient bytes of each of ``stages`` stages: phalanx's split where known, else
        the parameters evenly."""
        i = stages - 2
        if 0 <= i < len(self.stage_params) and len(self.stage_params[i]) == stages:
            return tuple(float(k * self.element_size) for k in self.stage_params[i])
        return (self.grad_bytes / max(stages, 1),) * max(stages, 1)

    def with_compute(self, step_compute_s: float, source: str) -> Workload:
        return replace(self, step_compute_s=step_compute_s, compute_source=source)

    def units(self) -> list[tuple[str, int, float]]:
        """(unit, gradient bytes, compute share) of each ZeRO-3 unit, "root" first, the
        others in forward order; empty where the layers do not say."""
        if not any(layer.unit for layer in self.layers):
            return []
        out: dict[str, list[float]] = {}
        for layer in self.layers:
            u = out.setdefault(layer.unit or "root", [0.0, 0.0])
            u[0] += layer.params * self.element_size
            u[1] += layer.compute_share
        root = [("root", int(v[0]), v[1]) for k, v in out.items() if k == "root"]
        return root + [(k, int(v[0]), v[1]) for k, v in out.items() if k != "root"]

    def backward_timeline(self) -> list[tuple[int, float]]:
        """(layer index, time since backward began when its gradient is final), in the order
        autograd finishes them: last layer first."""
        bwd = self.step_compute_s * self.backward_fraction
        total = sum(layer.compute_share for layer in self.layers) or 1.0
        t, out = 0.0, []
        for i in reversed(range(len(self.layers))):
            t += bwd * self.layers[i].compute_share / total
            out.append((i, t))
        return out


@dataclass(frozen=True, kw_only=True)
class Device:
    """A device of the per-device table: peak FLOP/s and the fraction of it training reaches
    (an assumption unless calibrated)."""

    name: str
    peak_flops: float
    efficiency: float = 0.4


DEVICES = {
    "p100": Device(name="p100", peak_flops=9.3e12),
    "v100": Device(name="v100", peak_flops=15.7e12),
    "a100": Device(name="a100", peak_flops=19.5e12),
    "h100": Device(name="h100", peak_flops=67e12),
}


def from_flops(workload: Workload, flops_per_sample: float, device: Device) -> Workload:
    """Compute time from the table: 3 x forward FLOPs per sample (forward + backward) x batch
    / (peak x efficiency)."""
    t = 3 * flops_per_sample * workload.batch / (device.peak_flops * device.efficiency)
    return workload.with_compute(t, f"table: {device.name} {device.peak_flops / 1e12:g} "
                                    f"TFLOP/s x {device.efficiency:g}")


def _layers(stages: list[tuple[str, int, float]]) -> tuple[Layer, ...]:
    return tuple(Layer(name=n, params=p, compute_share=c) for n, p, c in stages)


# parameter counts: torchvision's architectures (conv + bn + fc weights), split by stage;
# compute shares: forward GFLOPs per stage, approximate
VGG16 = _layers([("block1", 38_720, 1.94), ("block2", 221_440, 2.77),
                 ("block3", 1_475_328, 4.62), ("block4", 5_899_776, 4.62),
                 ("block5", 7_079_424, 1.39), ("fc6", 102_764_544, 0.103),
                 ("fc7", 16_781_312, 0.017), ("fc8", 4_097_000, 0.004)])
RESNET101 = _layers([("stem", 9_536, 0.118), ("layer1", 215_808, 0.68),
                     ("layer2", 1_219_584, 1.03), ("layer3", 26_090_496, 4.6),
                     ("layer4", 14_964_736, 0.8), ("fc", 2_049_000, 0.002)])
RESNET50 = _layers([("stem", 9_536, 0.118), ("layer1", 215_808, 0.68),
                    ("layer2", 1_219_584, 1.03), ("layer3", 7_098_368, 1.47),
                    ("layer4", 14_964_736, 0.81), ("fc", 2_049_000, 0.002)])
INCEPTION3 = _layers([("stem", 171_872, 1.0), ("mixed5", 820_000, 1.2),
                      ("mixed6", 8_190_000, 2.3), ("mixed7", 12_600_000, 1.2),
                      ("fc", 2_049_000, 0.002)])


def _transformer(name: str, layers: int, d: int, vocab: int, seq: int) -> tuple[Layer, ...]:
    emb = vocab * d + seq * d
    block = 12 * d * d + 13 * d
    out = [("embed", emb, 0.02)]
    out += [(f"block{i}", block, 1.0) for i in range(layers)]
    return _layers(out)


@dataclass(frozen=True)
class CatalogEntry:
    layers: tuple[Layer, ...]
    batch: int
    samples_per_s: float  # one device's training throughput at that batch (the assumption)
    device: str
    source: str
    activation_bytes: float = 0.0
    tp_layers: int = 0
    sparse: Sparse | None = None


# per-device throughputs are assumptions, cited: docs/scale.md lists each
CATALOG: dict[str, CatalogEntry] = {
    "vgg16": CatalogEntry(VGG16, 64, 144.0, "p100", "tf_cnn_benchmarks, P100, batch 64",
                          activation_bytes=25088 * 4),
    "resnet101": CatalogEntry(RESNET101, 64, 126.0, "p100", "tf_cnn_benchmarks, P100, batch 64",
                              activation_bytes=1024 * 14 * 14 * 4),
    "inception3": CatalogEntry(INCEPTION3, 64, 142.0, "p100",
                               "tf_cnn_benchmarks, P100, batch 64",
                               activation_bytes=768 * 17 * 17 * 4),
    "resnet50": CatalogEntry(RESNET50, 32, 360.0, "v100", "fp32 V100, batch 32 (NVIDIA DLE)",
                             activation_bytes=1024 * 14 * 14 * 4),
    "gpt2": CatalogEntry(_transformer("gpt2", 12, 768, 50257, 1024), 8, 24.0, "v100",
                         "GPT-2 small 124M, seq 1024, fp32 V100 (6 x params x tokens "
                         "FLOPs at ~40% of peak)", activation_bytes=1024 * 768 * 4,
                         tp_layers=12),
    "ctr": CatalogEntry(_layers([("embedding", 1_000_000 * 16, 0.05), ("mlp", 400_000, 1.0)]),
                        512, 20_000.0, "v100", "a DLRM-like click model: 1M x 16 table, "
                        "26 fields, Zipf(1.1) ids (assumed)",
                        sparse=Sparse(rows=1_000_000, dim=16, zipf_s=1.1, lookups=26)),
}


def catalog(name: str, batch: int | None = None) -> Workload:
    """A published model with its per-device throughput assumption."""
    try:
        e = CATALOG[name]
    except KeyError:
        raise ConfigError(f"--model: {name!r} is not in the catalog ({', '.join(CATALOG)}); "
                          f"a phalanx model needs --profile-here") from None
    w = Workload(name=name, layers=e.layers, batch=e.batch,
                 step_compute_s=e.batch / e.samples_per_s, activation_bytes=e.activation_bytes,
                 tp_layers=e.tp_layers, sparse=e.sparse, compute_source="paper",
                 notes=f"compute: {e.samples_per_s:g} samples/s on one {e.device} "
                       f"({e.source}); assumption")
    return w.with_batch(batch) if batch else w


def describe(w: Workload) -> str:
    mb = w.grad_bytes / 1e6
    return (f"{w.name}: {w.params:,} parameters ({mb:.1f} MB fp32), batch {w.batch}, "
            f"{w.step_compute_s * 1e3:.1f} ms compute per step ({w.compute_source})")


def staleness_penalty(mean_staleness: float, per_step: float) -> float:
    """Steps-to-target multiplier for asynchronous SGD at a mean staleness: 1 + c * tau
    (a linear model of our staleness studies; ``per_step`` c is its fitted slope)."""
    return 1.0 + per_step * max(mean_staleness, 0.0)


def gns_steps_multiplier(global_batch: float, noise_scale: float) -> float:
    """McCandlish et al.'s steps-to-target: S = S_min (1 + B_noise / B); returns S / S_min."""
    return 1.0 + noise_scale / max(global_batch, 1.0)

