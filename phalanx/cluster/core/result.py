"""What a run of the scheduler returns, simulated or live: every job's state, the rejected
ones, and the series of busy GPUs, queue length and fragmentation at each change."""

from __future__ import annotations

from dataclasses import dataclass, field

from phalanx.cluster.core.jobs import JobSpec, JobState


@dataclass
class SimResult:
    """What a run returns, simulated or live: every admitted job's state, the rejected ones
    with their reason, and the series (busy GPUs, queue, fragmentation) at each change."""

    jobs: list[JobState]
    rejected: list[tuple[JobSpec, str]]
    times: list[float] = field(default_factory=list)      # series: at each change
    busy: list[int] = field(default_factory=list)
    queue: list[int] = field(default_factory=list)
    frag: list[float] = field(default_factory=list)
    events: int = 0
    wall_s: float = 0.0
    fragmentation_blocked: int = 0
    capacity: int = 0
    oversize: int = 0       # rejected because the gang can never fit this cluster
