"""The elastic policies a live schedule runs, built from what a live cluster knows: each
job's entry in the job list (its batch: Pollux's application facts) and the topology's
device types (their declared speeds, in place of Sia's per-type profiles). The policy
objects are the simulator's (``policies/``); only their inputs are the live cluster's."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from phalanx.cluster.core.cadence import Cadence
from phalanx.cluster.core.topology import Topology
from phalanx.cluster.core.view import ElasticPolicy
from phalanx.cluster.live.joblist import LiveJob
from phalanx.cluster.model.learned import AppFacts, JobKnowledge
from phalanx.cluster.policies.catalog import ELASTIC, ElasticInputs
from phalanx.cluster.policies.goodput import GoodputOptions
from phalanx.cluster.policies.goodput_typed import TypedOptions
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


def live_inputs(topology: Topology, elastic: Sequence[LiveJob], cadence: Cadence,
                horizon_s: float,
                slowdown: Callable[[int, int], float] | None = None,
                typed_options: TypedOptions | None = None) -> ElasticInputs:
    """What the catalog's policies are built from on a live cluster: each job is its own
    application (its entry's facts, capped per type by the type's devices). On a cluster
    with device types, a 1-GPU throughput to bootstrap from per type: the type's declared
    ``speed`` divided by its emulated ``slowdown``, the same for every job (Sia profiles
    each job on each type; this prior is coarser, never finer), or the job's own
    ``profile`` where its entry gives one; then only what the job measured on a type.
    Jobs the policy cannot resize run first come, first served beside it; each round the
    policy is told the GPUs per type they hold (the round's ``held``)."""
    servers = topology.servers
    apps = {j.spec.application: job_facts(j, topology.num_devices) for j in elastic}
    typed: dict[str, dict[str, AppFacts]] = {}
    boot = None
    if topology.typed or len(set(topology.server_size)) == 1:
        # per type (one, on a cluster of one type and one server size: what sia needs)
        types = cluster_types([(s.device_type, s.num_devices) for s in servers])
        typed = {t.name: {j.spec.application: job_facts(j, t.gpus) for j in elastic}
                 for t in types}
        speed = {t.name: topology.device_types[t.name].speed
                 / topology.device_types[t.name].slowdown for t in types}
        # a job's own profile where its entry gives one (every type: check_profiles),
        # else the types' declared speeds
        boot = {t: {j.spec.application: j.profile.get(t, speed[t]) for j in elastic}
                for t in typed}
    return ElasticInputs(
        cluster=topology.name, typed_hint="a cluster file that declares device types",
        server_sizes=tuple(s.num_devices for s in servers),
        server_types=tuple(s.device_type for s in servers),
        server_ids=tuple(s.index for s in servers), apps=apps, typed=typed,
        measured=False, bootstrap=boot,
        restart_s=cadence.restart_cost_s,
        restart_by_app=dict.fromkeys(apps, cadence.restart_cost_s),
        goodput=GoodputOptions(horizon_s=horizon_s), slowdown=slowdown,
        typed_options=typed_options or TypedOptions())   # ElasticLiveCluster may pass None


def typed_policy(topology: Topology, elastic: Sequence[LiveJob], cadence: Cadence,
                 horizon_s: float) -> ElasticPolicy:
    """``--policy goodput`` on several device types, as ``phalanx schedule`` builds it
    (:func:`live_inputs`): the heterogeneity-aware policy on Sia's information."""
    return ELASTIC.get("goodput")(live_inputs(topology, elastic, cadence, horizon_s))
