"""Admission policies: does a submitted job enter the queue at all?"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from phalanx.cluster.core.allocator import ClusterState
from phalanx.cluster.core.jobs import JobSpec
from phalanx.errors import ConfigError


@dataclass(frozen=True)
class AdmissionDecision:
    """Whether a job is admitted, and why not."""

    accept: bool
    reason: str = ""


class AdmissionPolicy(Protocol):
    """Decides on arrival whether a job may join the queue."""

    name: str

    def admit(self, job: JobSpec, cluster: ClusterState,
              outstanding: Mapping[str, int]) -> AdmissionDecision: ...


@dataclass(frozen=True)
class AcceptAll:
    """Admits every job (the default)."""

    name: str = "accept-all"

    def admit(self, job: JobSpec, cluster: ClusterState,
              outstanding: Mapping[str, int]) -> AdmissionDecision:
        return AdmissionDecision(True)


@dataclass(frozen=True)
class VirtualClusterQuota:
    """Each virtual cluster (Philly's ``cluster`` column) may have at most ``quota[vc]``
    GPUs queued or running; a job over its VC's quota is rejected at submission."""

    quota: Mapping[str, int] = field(default_factory=dict)
    default: int = 0            # quota of a VC not listed; 0 = unlimited
    name: str = "vc-quota"

    def __post_init__(self) -> None:
        bad = [vc for vc, q in self.quota.items() if not isinstance(q, int) or q < 1]
        if bad or self.default < 0:
            raise ConfigError(f"vc quota: quotas must be positive integers (bad: {bad})")

    def admit(self, job: JobSpec, cluster: ClusterState,
              outstanding: Mapping[str, int]) -> AdmissionDecision:
        q = self.quota.get(job.vc, self.default)
        if q and outstanding.get(job.vc, 0) + job.gpus > q:
            return AdmissionDecision(False, f"virtual cluster {job.vc!r} over quota {q}")
        return AdmissionDecision(True)


def parse_quota(text: str) -> VirtualClusterQuota:
    """``vc1=64,vc2=128,*=32`` (``*`` = every other VC)."""
    quota: dict[str, int] = {}
    default = 0
    for part in filter(None, text.split(",")):
        vc, sep, n = part.partition("=")
        try:
            v = int(n)
        except ValueError:
            v = 0
        if not sep or v < 1:
            raise ConfigError(f"--quota {text}: expected VC=GPUS pairs with positive "
                              f"integers, got {part!r}")
        if vc == "*":
            default = v
        else:
            quota[vc] = v
    return VirtualClusterQuota(quota, default)
