"""What an elastic policy sees of a job (``JobView``) and what it answers (``Choice``),
filled the same way by every engine (:func:`job_view`): the simulated and the live cluster
give a policy the same facts. Policies read views and never write them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from phalanx.cluster.core.jobs import JobState
from phalanx.cluster.core.topology import Topology

if TYPE_CHECKING:
    from phalanx.cluster.model.learned import Learner
    from phalanx.cluster.model.profiles import BatchConfig


class UndeclaredRead(RuntimeError):
    """A policy read what it declared it does not use (a job's remaining work)."""


@dataclass(frozen=True)
class JobView:
    """What the elastic policy sees of one active job. ``remaining`` (progress still to
    make, from the epochs the user declared) is there only for a policy that declares it
    uses it (``uses_remaining``); reading it otherwise raises ``UndeclaredRead``."""

    id: int
    app: str
    submit: float
    epoch: int
    remaining_work: float | None   # None: not given to this policy
    gpus: int                 # GPUs held now (0: waiting)
    attained: float           # GPU-seconds so far
    batch: int = 0            # the job's own total batch (used with ``fixed_batch``)
    placement: tuple[tuple[int, int], ...] = ()   # (server, GPUs) held now, server order
    restarts: int = 0         # allocations after its first
    # the most GPUs the engine can give the job now (0: no limit beyond the cluster); the
    # round clips a choice to it (a parameter-server driver starts its workers on one node)
    limit: int = 0
    device_type: str = ""     # the GPU type it holds now ('' when it holds none)
    restarting: bool = False  # its checkpoint-restore is still under way (Sia keeps it)
    requested: int = 0        # the GPUs its trace asked for (a rigid policy runs it so)

    @property
    def remaining(self) -> float:
        if self.remaining_work is None:
            raise UndeclaredRead(f"job {self.id}: remaining work read by a policy that "
                                 f"does not declare it (uses_remaining=False)")
        return self.remaining_work


@dataclass(frozen=True)
class Choice:
    """An elastic policy's answer for one job: its GPUs, the batch it trains at (None: the
    job picks), and optionally the exact servers."""

    gpus: int
    config: BatchConfig | None     # None when gpus == 0 or when the job picks its batch
    servers: tuple[tuple[int, int], ...] = ()   # (server, GPUs): exact placement, if set
    # the GPU type to run on ('' = any): a job runs on one type at a time; a change of
    # type is a move (a restart), even at the same count
    device_type: str = ""


class ElasticPolicy(Protocol):
    """What a round asks of an elastic policy, and every input it gets: the views, the GPUs
    it may give (``capacity``; per type, less what jobs outside it ``held``), the clock;
    what its jobs measure goes to the model :meth:`learner_for` names. ``uses_remaining``:
    it is given jobs' remaining work (from their declared epochs). ``adapts_batch``: each
    job picks its own batch (through that model) when the choice has none."""

    name: str
    uses_remaining: bool
    adapts_batch: bool

    def allocate(self, jobs: Sequence[JobView], capacity: int, now: float, *,
                 held: Mapping[str, int] | None = None) -> dict[int, Choice]:
        """Each job's allocation. ``held``: GPUs per device type that jobs outside the
        policy hold (a live cluster's jobs it cannot resize; already out of
        ``capacity``): a policy that gives GPUs per type gives those to nobody."""

    def learner_for(self, device_type: str) -> Learner | None:
        """The model a job running on ``device_type`` reports its steps to and picks its
        batch from ('': before it runs on a type, or where types do not matter); None:
        the policy learns nothing there (it reads measured profiles, or learns per type
        only)."""

    def finished(self, jid: int) -> None:
        """Job ``jid`` left for good: forget what the policy keeps of it."""


def job_view(st: JobState, topology: Topology, policy: ElasticPolicy, *, held: bool,
             epoch: int, remaining: float | None, limit: int = 0,
             restarting: bool = False) -> JobView:
    """The view of ``st`` that every engine gives ``policy``: ``held``, whether it holds
    its last placement now (a job being stopped holds nothing it can keep); ``remaining``
    work (None: the engine does not know it) is passed on only to a policy that declares
    it uses it."""
    placement: tuple[tuple[int, int], ...] = ()
    gpus = 0
    dtype = ""
    if held:
        per_server: dict[int, int] = {}
        devices = st.placements[-1][1]
        for d in devices:
            s = topology.device_server[d]
            per_server[s] = per_server.get(s, 0) + 1
        placement, gpus = tuple(sorted(per_server.items())), len(devices)
        dtype = topology.servers[placement[0][0]].device_type if placement else ""
    return JobView(st.spec.id, st.spec.application, st.spec.submit, epoch,
                   remaining if policy.uses_remaining else None, gpus, st.attained,
                   st.spec.batch_size, placement, max(len(st.placements) - 1, 0), limit,
                   dtype, restarting and held, st.spec.requested or st.spec.gpus)
