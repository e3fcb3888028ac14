"""Jobs: what a trace says (``JobSpec``) and what the scheduler sees while it runs
(``JobState``, read by the policies, written only by the event loop)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class JobSpec:
    """One job of a trace.

    ``work`` is in the units the performance model's rate is in: seconds of execution on
    the job's ideal (packed, uncontended, reference-device) placement for Philly and
    synthetic jobs; training steps for Pollux jobs. ``duration`` is the oracle run time on
    that ideal placement (what SJF is allowed to know).
    """

    id: int
    name: str
    submit: float
    gpus: int
    work: float
    duration: float
    model: str
    cpu_per_gpu: int = 4
    vc: str = ""
    batch_size: int = 0
    # live mode: '' = the job may be stopped and resumed; else why not (the round keeps it)
    not_preemptible: str = ""
    # whose facts (batch limits, profiles) an elastic policy reads: '' = the model's (a
    # Pollux application); a live job declares its own in its list entry
    app: str = ""
    # the gang the trace asked for, kept when an elastic engine resets ``gpus`` (a policy
    # that runs jobs at their own size, as Gavel, reads it); 0 = ``gpus``
    requested: int = 0
    # its interference class (model-family-workers, a live job's); '' = its model's Gavel
    # family (model/interference.py)
    kind: str = ""

    @property
    def application(self) -> str:
        return self.app or self.model


@dataclass
class JobState:
    """Live state of a job. Policies read it and never write it."""

    spec: JobSpec
    remaining: float                  # work left
    attained: float = 0.0             # GPU-seconds received so far (LAS / Tiresias)
    executed: float = 0.0             # seconds spent running
    start: float = -1.0               # first start
    end: float = -1.0
    running: bool = False
    waiting_since: float = 0.0        # last time it entered the queue (arrival / preemption)
    last_start: float = -1.0          # last time it was (re)started (round robin)
    preemptions: int = 0
    rate: float = 0.0                 # work units per second at the current placement
    last_update: float = 0.0
    progress_from: float = 0.0        # progress resumes here (after a restore from checkpoint)
    version: int = 0                  # invalidates stale completion events
    placements: list[tuple[float, tuple[int, ...]]] = field(default_factory=list)
    stops: list[float] = field(default_factory=list)  # when each placement ended (stopped)
    failure: str = ""                 # live mode: why the job's process failed ('' = it did not)
    restarts: int = 0                 # live mode: starts again after a failure (--max-job-restarts)
    # interval engine: (boundary time, attained GPU-s) whenever attained grew, so Tiresias
    # can order a queue by when each job entered it (the artifact's demotion order)
    service_marks: list[tuple[float, float]] = field(default_factory=list)

    @property
    def id(self) -> int:
        return self.spec.id

    @property
    def gpus(self) -> int:
        return self.spec.gpus

    @property
    def submit(self) -> float:
        return self.spec.submit
