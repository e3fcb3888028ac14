"""Where each rank computes and what carries its traffic: the one place that decides it.

Every multi-process strategy calls :func:`setup_rank` first thing in its worker process;
nothing else picks a device, a backend or a thread count. The decision itself,
:func:`plan`, is a pure function of the run's flags and of what the machine has (local
rank, ranks on this host, CUDA devices, cores), so it is unit-tested without a GPU.

The rules (README, "GPUs"):

* device: ``--device cpu`` -> CPU. ``--device cuda`` -> computing rank r on this host uses
  ``cuda:(r % device_count)``; ``--device cuda:K`` pins every rank to GPU K. Parameter
  server shards always stay on the CPU (they speak host tensors, as BytePS's servers do).
* backend: NCCL where every computing rank of the host owns a distinct GPU and the
  strategy's traffic is collectives or point-to-point between known peers; gloo otherwise.
  An NCCL group is opened as ``cpu:gloo,cuda:nccl`` so the few host tensors (byte counters)
  still have a carrier. gloo cannot send or receive CUDA tensors (point-to-point on a CUDA
  pointer aborts the process), so under gloo every GPU tensor that crosses a process goes
  through a pinned host buffer (``host_staging``).
* threads: with C cores and P processes on this host, max(1, C // P) intra-op threads per
  process (``--worker-threads`` overrides).
* data on the device: ``--data-on-device auto`` moves the training set to the GPU when it
  takes at most a quarter of that GPU's memory share of this rank.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

import torch

from phalanx.config import BACKENDS, DATA_ON_DEVICE, Device, parse_device
from phalanx.errors import ConfigError
from phalanx.runtime import memlimit

NCCL_WITH_HOST = "cpu:gloo,cuda:nccl"  # device-specific backends of one group


@dataclass(frozen=True)
class DeviceSupport:
    """What a strategy's processes can do on GPUs.

    ``cuda``: its CUDA path exists. ``nccl``: its traffic between GPU ranks is collectives
    or point-to-point between known peers (NCCL can carry it); False where a receive from
    any source is needed (the parameter server) or there is no traffic (Hogwild!).
    ``reason``: why not, when ``cuda`` is False (one line for the user).
    ``gloo_gpu``: why its GPU ranks cannot talk over gloo (ranks sharing a GPU, or
    ``--backend gloo``), where they cannot: empty where its traffic goes through host
    buffers (every strategy's own code does)."""

    cuda: bool = True
    nccl: bool = True
    reason: str = ""
    gloo_gpu: str = ""
    host_servers: bool = False  # the first --servers ranks are CPU parameter-server shards
    one_device: bool = False  # every rank computes on one shared model: all on one GPU


@dataclass(frozen=True)
class Placement:
    """One rank's device, backend and threads (see the module docstring)."""

    device: str  # "cpu" or "cuda:K"
    backend: str  # what init_process_group gets: "gloo" or "cpu:gloo,cuda:nccl"
    shares_gpu: bool  # another computing rank on this host uses the same GPU
    host_staging: bool  # device tensors cross processes through pinned host buffers
    threads: int  # intra-op threads of this process
    data_on_device: bool  # the training set is moved to the device once

    @property
    def is_cuda(self) -> bool:
        return self.device.startswith("cuda")

    @property
    def torch_device(self) -> torch.device:
        return torch.device(self.device)

    @property
    def uses_nccl(self) -> bool:
        return "nccl" in self.backend


CPU = Placement("cpu", "gloo", False, False, 1, False)  # a rank set up by no one (tests)


def check_device(device: str | Device, device_count: int) -> None:
    """``--device`` names a device this machine has (one line otherwise)."""
    kind, index = parse_device(device)
    if kind == "cpu":
        return
    if device_count == 0:
        raise ConfigError(f"--device {device}: no CUDA device is available on this machine")
    if index is not None and index >= device_count:
        raise ConfigError(f"--device {device}: this machine has {device_count} CUDA "
                          f"device(s), cuda:0..cuda:{device_count - 1}")


def plan(device: str | Device, backend: str = "auto", worker_threads: int = 0,
         data_on_device: str = "auto", *, compute_rank: int = 0, compute_ranks: int = 1,
         processes: int = 1, device_count: int = 0, cores: int = 1,
         strategy_support: DeviceSupport = DeviceSupport(), on_cpu: bool = False,
         data_fits: bool = True) -> Placement:
    """The placement of one rank.

    ``compute_rank`` / ``compute_ranks``: this rank's index among the ranks of this host
    that compute (hold a model), and how many there are; ``processes``: every process of
    the run on this host (servers included), for the thread share; ``on_cpu``: this rank
    stays on the CPU whatever ``device`` says (a parameter-server shard); ``data_fits``:
    the training set fits the device (only read when ``data_on_device`` is auto)."""
    if backend not in BACKENDS:
        raise ConfigError(f"--backend: {backend!r} is not one of {', '.join(BACKENDS)}")
    if data_on_device not in DATA_ON_DEVICE:
        raise ConfigError(f"--data-on-device: {data_on_device!r} is not one of "
                          f"{', '.join(DATA_ON_DEVICE)}")
    if worker_threads < 0:
        raise ConfigError(f"--worker-threads: {worker_threads} must be >= 0")
    kind, index = parse_device(device)
    threads = worker_threads or max(1, cores // max(1, processes))
    if kind == "cpu":
        if backend == "nccl":
            raise ConfigError("--backend nccl: needs --device cuda (NCCL carries GPU tensors)")
        if data_on_device == "yes":
            raise ConfigError("--data-on-device yes: needs --device cuda")
        return Placement("cpu", "gloo", False, False, threads, False)
    check_device(device, device_count)
    if index is None and not strategy_support.one_device:
        gpu, shares = compute_rank % device_count, compute_ranks > device_count
    elif index is None:
        gpu, shares = 0, compute_ranks > 1
    else:
        gpu, shares = index, compute_ranks > 1
    if backend == "nccl":
        if not strategy_support.nccl:
            raise ConfigError("--backend nccl: this strategy's traffic needs gloo (receives "
                              "from any source, or host-side servers); use --backend gloo")
        if shares:
            raise ConfigError(f"--backend nccl: {compute_ranks} ranks would share a GPU "
                              "(NCCL needs one GPU per rank); use --backend gloo or fewer "
                              "ranks")
    nccl = backend == "nccl" or (backend == "auto" and strategy_support.nccl and not shares
                                 and compute_ranks > 1)
    if not nccl and compute_ranks > 1 and strategy_support.gloo_gpu:
        why = (f"{compute_ranks} ranks would share a GPU" if shares
               else "--backend gloo was asked for")
        raise ConfigError(f"--device {device}: this strategy's GPU ranks need NCCL, one GPU "
                          f"each, and {why}: {strategy_support.gloo_gpu}")
    if on_cpu:
        # a parameter-server shard: host tensors only, whatever the workers use
        return Placement("cpu", NCCL_WITH_HOST if nccl else "gloo", False, False, threads,
                         False)
    on_device = data_on_device == "yes" or (data_on_device == "auto" and data_fits)
    return Placement(f"cuda:{gpu}", NCCL_WITH_HOST if nccl else "gloo", shares, not nccl,
                     threads, on_device)


def data_fits(data_bytes: int, device_bytes: int, ranks_on_device: int) -> bool:
    """A rank's copy of the training set takes at most a quarter of its share of the GPU
    (each rank sharing a GPU holds its own copy)."""
    return data_bytes * 4 <= device_bytes // max(1, ranks_on_device)


# ---- the machine, read once per process --------------------------------------------------


def cores() -> int:
    """Cores this process may run on (the affinity mask, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def device_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def local_position(rank: int, world: int) -> tuple[int, int]:
    """(local rank, processes on this host). Under torchrun its environment says (the
    entry point's launcher sets LOCAL_RANK / LOCAL_WORLD_SIZE); spawned locally, every
    rank is on this host."""
    if "LOCAL_RANK" in os.environ and "LOCAL_WORLD_SIZE" in os.environ:
        return int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
    return rank, world


def plan_for(cfg, rank: int, world: int, support: DeviceSupport, *,
             compute_rank: int | None = None,
             compute_ranks: int | None = None, on_cpu: bool = False,
             data_bytes: int = 0) -> Placement:
    """:func:`plan` for rank ``rank`` of ``world`` under ``cfg`` on this machine."""
    local_rank, local_world = local_position(rank, world)
    n_gpu = device_count() if cfg.target.kind != "cpu" else 0
    ranks = compute_ranks if compute_ranks is not None else local_world
    compute_rank = compute_rank if compute_rank is not None else local_rank
    fits = True
    if n_gpu and data_bytes and not on_cpu:
        kind, index = cfg.target
        gpu = index if index is not None else compute_rank % n_gpu
        if support.one_device:
            gpu = index or 0
        total = torch.cuda.get_device_properties(gpu).total_memory
        share = ranks if index is not None else -(-ranks // n_gpu)
        fits = data_fits(data_bytes, total, share)
    return plan(cfg.target, cfg.backend, cfg.worker_threads, cfg.data_on_device,
                compute_rank=compute_rank, compute_ranks=ranks, processes=local_world,
                device_count=n_gpu,
                cores=cores(), strategy_support=support, on_cpu=on_cpu,
                data_fits=fits)


def setup_rank(cfg, rank: int, world: int, support: DeviceSupport, **kwargs) -> Placement:
    """Decide this process's placement and apply it: its intra-op threads and its current
    CUDA device. Every strategy's worker calls this before building anything (``support``:
    its strategy's :class:`DeviceSupport`, from its spec)."""
    p = plan_for(cfg, rank, world, support, **kwargs)
    import torch.distributed as dist

    if dist.is_initialized() and "nccl" not in str(dist.get_backend_config()) and p.uses_nccl:
        # the group was opened with gloo by a launcher that did not ask us (torchrun's
        # entry): GPU tensors must then go through host buffers
        p = dataclasses.replace(p, backend="gloo", host_staging=p.is_cuda)
        if p.is_cuda and support.gloo_gpu:
            raise ConfigError(f"--device {cfg.device}: this strategy's GPU ranks need NCCL "
                              f"and the process group was opened with gloo: {support.gloo_gpu}")
    torch.set_num_threads(p.threads)
    if p.is_cuda:
        torch.cuda.set_device(p.torch_device)
    if cfg.memory_limit:  # before the rank builds anything: its budget from here on
        memlimit.apply(cfg.memory_limit)
    return p


def check_run(cfg, world: int, support: DeviceSupport) -> str:
    """In the driver, before any process starts: the flags can be served on this machine
    (one line otherwise). Returns the backend the process group is opened with."""
    kind, _ = cfg.target
    if kind == "cuda" and not support.cuda:
        raise ConfigError(f"--device {cfg.device}: --strategy {cfg.strategy} cannot run on "
                          f"CUDA: {support.reason}")
    # rank 0's plan carries every check (the backend is the same for every rank)
    return plan_for(cfg, 0, world, support,
                    compute_ranks=compute_world(cfg, world, support)).backend


def spawn_backend(cfg, world: int, support: DeviceSupport) -> str:
    """The backend a locally spawned group of ``world`` ranks is opened with."""
    return check_run(cfg, world, support)


def compute_world(cfg, world: int, support: DeviceSupport) -> int:
    """How many ranks hold a model (all but the parameter-server shards)."""
    return world - cfg.servers if support.host_servers else world
