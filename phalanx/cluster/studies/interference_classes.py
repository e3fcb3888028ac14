"""The job classes of ``phalanx interference profile`` (small CPU jobs, each a real
``phalanx train``) and where a measurement starts them: pinned to a core, or at level
``link`` rank by rank across two test hosts joined by a shaped link."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass

from phalanx.catalog import Catalog
from phalanx.cluster.model.interference import job_class
from phalanx.cluster.studies.interference_jobs import JobStart, RankStart
from phalanx.errors import ConfigError


@dataclass(frozen=True)
class Host:
    """A test host as the profile sees it (the command line made from
    ``phalanx.runtime.hosts.TestHost``): what runs a command inside it, its address, the
    interface that carries its link."""

    prefix: tuple[str, ...]
    addr: str
    iface: str = "eth0"

# a job long enough that it never ends inside a window, with nothing but steps in it: no
# evaluation (at an epoch's end it would be one), a small initial evaluation, no progress
# bar or TensorBoard, one intra-op thread per process
LONG_RUN = ("--epochs", "1000000", "--max-steps", "1000000000", "--eval-every", "1000000000",
            "--test-limit", "200", "--threads", "1", "--no-progress", "--no-tensorboard")
CTR_SMALL = ("--data", "ctr-synthetic", "--ctr-rows", "4096", "--ctr-dim", "8",
             "--train-limit", "20000")


@dataclass(frozen=True, kw_only=True)
class JobClass:
    """A small CPU job: a step well under 100 ms on one core."""

    model: str
    strategy: str
    workers: int
    flags: tuple[str, ...]   # data set and size, beyond model / strategy / workers
    servers: int = 0         # parameter-server shards (processes beside the workers)

    @property
    def name(self) -> str:
        return job_class(self.model, self.strategy, self.workers)

    @property
    def world(self) -> int:
        """Its processes: workers and shards (1: trains in the driver)."""
        return 1 if self.strategy == "single" else self.workers + self.servers

    def train_flags(self) -> tuple[str, ...]:
        # single trains in the driver (--threads); the others in worker processes
        ranks = () if self.strategy == "single" else ("--worker-threads", "1")
        shards = ("--servers", str(self.servers)) if self.servers else ()
        return ("--model", self.model, "--strategy", self.strategy,
                "--workers", str(self.workers), *self.flags, *shards, *LONG_RUN, *ranks)

    def start(self, core: int) -> JobStart:
        return JobStart(name=self.name, core=core, ranks=self.workers,
                        argv=(sys.executable, "-m", "phalanx", "train", *self.train_flags()))

    def start_across(self, hosts: Sequence[Host], cores: Sequence[int],
                     port: int) -> JobStart:
        """Rank i in test host ``hosts[i % n]`` on ``cores[i % n]``, the ranks meeting at
        host 0 (``phalanx.entry.torchrun`` without torchrun's agent, as ``phalanx
        schedule`` starts them); gloo binds the host's ``eth0``, so they talk over the
        shaped link."""
        n = len(hosts)
        ranks = tuple(RankStart(
            prefix=hosts[r % n].prefix, core=cores[r % n],
            env=(("RANK", str(r)), ("WORLD_SIZE", str(self.world)), ("LOCAL_RANK", "0"),
                 ("LOCAL_WORLD_SIZE", "1"), ("GROUP_RANK", str(r)),
                 ("MASTER_ADDR", hosts[0].addr), ("MASTER_PORT", str(port)),
                 ("TORCHELASTIC_USE_AGENT_STORE", "False"),
                 ("GLOO_SOCKET_IFNAME", hosts[r % n].iface)))
            for r in range(self.world))
        return JobStart(name=self.name, core=cores[0], ranks=self.workers, spread=ranks,
                        argv=(sys.executable, "-m", "phalanx.entry.torchrun",
                              *self.train_flags()))


CLASSES: Catalog[JobClass] = Catalog("job class", "--classes")
for _cls, _help in (
        (JobClass(model="mlp", strategy="single", workers=1, flags=("--data", "synthetic")),
         "the MLP on synthetic data (~1 ms a step)"),
        (JobClass(model="lenet5", strategy="single", workers=1,
                  flags=("--data", "fashion-mnist")),
         "LeNet-5 on Fashion-MNIST (~10 ms a step)"),
        (JobClass(model="gpt", strategy="single", workers=1,
                  flags=("--data", "shakespeare", "--gpt-layers", "2", "--gpt-dim", "64",
                         "--gpt-heads", "2", "--context", "32", "--batch-size", "16")),
         "a 2-layer, 64-wide GPT on Tiny Shakespeare (~12 ms a step)"),
        (JobClass(model="ctr", strategy="single", workers=1, flags=CTR_SMALL),
         "the sparse click model, 4096 rows x 8 per field (~2 ms a step)"),
        (JobClass(model="mlp", strategy="sync", workers=2, flags=("--data", "synthetic")),
         "the MLP, 2 workers, synchronous allreduce"),
        (JobClass(model="ctr", strategy="asp", workers=1, flags=CTR_SMALL, servers=1),
         "the click model on a parameter server: 1 worker, 1 shard, ASP"),
        (JobClass(model="gpt", strategy="sync", workers=2,
                  flags=("--data", "shakespeare", "--gpt-layers", "2", "--gpt-dim", "64",
                         "--gpt-heads", "2", "--context", "32", "--batch-size", "16")),
         "the 2-layer GPT, 2 workers, synchronous allreduce (default at level link only)")):
    CLASSES.add(_cls.name, _cls, _help)
# the default classes: at levels core and server the six of the measured profile; at level
# link (alone) the two-process classes that span the hosts and one that cannot use the link
CORE_CLASSES = ("mlp-single-1", "lenet5-single-1", "gpt-single-1", "ctr-single-1",
                "mlp-sync-2", "ctr-ps-1")
LINK_CLASSES = ("mlp-single-1", "mlp-sync-2", "ctr-ps-1", "gpt-sync-2")


def placement(level: str, cores: Sequence[int]) -> tuple[int, int]:
    """The cores of a pair's two jobs at ``level`` (at ``link``: of two single-process
    jobs, one on each host's core)."""
    if level == "core":
        return cores[0], cores[0]
    if len(cores) < 2:
        raise ConfigError(f"--levels {level}: needs 2 cores, this process may use only "
                          f"core {cores[0]}; use --levels core")
    return cores[0], cores[1]


def solo_start(level: str, c: JobClass, cores: Sequence[int],
               hosts: Sequence[Host] | None, port: int) -> JobStart:
    """A job alone: on ``cores[0]``; at ``link`` a class of several ranks across the
    hosts (its solo rate is the shaped link's)."""
    if level == "link" and c.world > 1:
        if not hosts:
            raise ConfigError("--levels link: no test hosts given to the profile")
        return c.start_across(hosts, cores, port)
    return c.start(cores[0])


def pair_starts(level: str, a: JobClass, b: JobClass, cores: Sequence[int],
                hosts: Sequence[Host] | None, port: int) -> list[JobStart]:
    """Both jobs of a pair at ``level`` (see the module doc)."""
    ca, cb = placement(level, cores)
    if level != "link":
        return [a.start(ca), b.start(cb)]
    if a.world == 1 and b.world == 1:       # neither uses the link: one host each
        return [a.start(ca), b.start(cb)]
    return [solo_start(level, a, cores, hosts, port),
            solo_start(level, b, cores, hosts, port + 1)]
