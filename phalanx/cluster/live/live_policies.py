"""The elastic policies a live schedule runs, built from what a live cluster knows: each
job's entry in the job list (its batch: Pollux's application facts) and the topology's
device types (their declared speeds, in place of Sia's per-type profiles). The policy
objects are the simulator's (``policies/``); only their inputs are the live cluster's."""

from __future__ import annotations

from collections.abc import Sequence

from phalanx.cluster.core.cadence import Cadence
from phalanx.cluster.core.topology import Topology
from phalanx.cluster.live.joblist import LiveJob
from phalanx.cluster.model.learned import AppFacts, JobKnowledge
from phalanx.cluster.policies.goodput_typed import TypedGoodputPolicy, TypedOptions
from phalanx.cluster.policies.typed_base import cluster_types
from phalanx.config import RunConfig


def job_facts(job: LiveJob, capacity: int) -> AppFacts:
    b = int(RunConfig.from_mapping(job.config, source=job.spec.name).batch_size)
    return AppFacts(job.spec.name, init_batch=b * job.spec.gpus, max_batch=2 * b * capacity,
                    min_local_bsz=max(1, b // 2), max_local_bsz=2 * b, epochs=1)


def describe(k: JobKnowledge, name: str) -> str:
    p = k.params
    assert p is not None
    terms = " ".join(f"{f}={getattr(p, f):.4g}" for f in p._fields)
    seen = ", ".join(f"{g} GPU x {n} node x batch {b:g}" for n, g, b in sorted(k.profile))
    return f"phalanx: scheduler: {name}: step-time model fitted to [{seen}]: {terms}"


def typed_policy(topology: Topology, elastic: Sequence[LiveJob], cadence: Cadence,
                 horizon_s: float) -> TypedGoodputPolicy:
    """``--policy goodput`` on several device types: the heterogeneity-aware policy on
    Sia's information. Per type, a job's application facts (from its entry, capped by the
    type's devices) and a 1-GPU throughput to bootstrap from: the type's declared
    ``speed`` divided by its emulated ``slowdown``, the same for every job (Sia profiles
    each job on each type; this prior is coarser, never finer). Then only what the job
    measured on a type. Jobs it cannot resize run first come, first served beside it, on
    whatever type they are placed; each round its MILP gives each type's GPUs less those
    they hold (the round's ``held``)."""
    types = cluster_types([(s.device_type, s.num_devices) for s in topology.servers])
    facts = {t.name: {j.spec.application: job_facts(j, t.gpus) for j in elastic}
             for t in types}
    speed = {t.name: topology.device_types[t.name].speed / topology.device_types[t.name].slowdown
             for t in types}
    # a job's own profile where its entry gives one (every type: check_profiles), else
    # the types' declared speeds
    boot = {t: {j.spec.application: j.profile.get(t, speed[t]) for j in elastic}
            for t in facts}
    return TypedGoodputPolicy(facts, types, options=TypedOptions(horizon_s=horizon_s),
                              restart_s=dict.fromkeys(facts[types[0].name],
                                                      cadence.restart_cost_s),
                              bootstrap=boot)
