"""Live scheduling (issue 22): the scheduler's own overhead, and the simulator against the
live cluster.

**Overhead** (always): a Tiresias job list of real sync jobs with a short quantum runs on
the local engine, on a local 3-node Ray cluster (2 racks) and on a local 3-node Slurm
cluster (slurmctld + 3 slurmd; not in ``--quick`` unless ``--slurm``: it does not fit the
minute; skipped, with the reason, without root or Slurm). Measured:

* ``decision_ms``: one round of the policy (order every active job, keep those that fit,
  send the stops), median over rounds;
* ``stop_s``: SIGTERM to every rank -> every rank gone (the ranks agree on a step, write the
  checkpoint, exit), median over preemptions;
* ``start_overhead_s``: the engine's own cost of (re)starting a gang: ``executor.start``
  (local: process spawns; Ray: the calls to the devices' actors, and on a device's first
  start its placement group and actor), excluding the ranks' own Python start-up, median
  (and max) over starts;
* ``launch_s``: from the ``executor.start`` call to the last rank's process running (its
  rank record, written before the rank imports torch), median (and max) over starts: what
  the engine takes to put a process on the device, whatever it does synchronously (Slurm's
  ``sbatch`` returns at once; its controller, slurmd and slurmstepd run the job after);
* ``preemption_overhead_s`` = ``stop_s`` + ``start_overhead_s``.

Ratios: Ray over local for the start overhead (what Ray's actors and placement groups cost
over plain processes), Slurm over local for the launch, and each engine's preemption
overhead (``stop_s`` + the start: ``start_overhead_s`` on Ray, ``launch_s`` on Slurm) as a
share of the quantum. Targets: a decision <= 10 ms; on Ray and on Slurm a preemption's
overhead <= 10% of a 60 s quantum (6 s).

**Calibration** (``--calibrate``): each job of the list alone on the local engine gives
its duration on this machine (the simulator's work, "measured by phalanx on this
machine"); the start-up of a resumed job is the simulator's checkpoint cost. The simulator
then runs the list with the same policy, quantum and placement; the list also runs live on
Ray. Per job: simulated JCT / live JCT, its median and spread, with the simulator's
per-device model and with ``PerfOptions.shared_cores`` = this machine's cores (every slot
of a one-machine cluster shares them).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import _common

from phalanx.cluster.core.clusters import resolve_cluster
from phalanx.cluster.core.topology import Topology
from phalanx.cluster.live.config import LiveConfig
from phalanx.cluster.live.engines.local import LocalExecutor
from phalanx.cluster.live.engines.ray import RayExecutor
from phalanx.cluster.live.engines.ray_cluster import ray_cluster
from phalanx.cluster.live.engines.slurm.executor import SlurmExecutor
from phalanx.cluster.live.engines.slurm.local import check_installed, slurm_cluster
from phalanx.cluster.live.joblist import LiveJob, load_job_list
from phalanx.cluster.live.loop import LiveCluster
from phalanx.cluster.model.families import ModelProfile
from phalanx.cluster.model.perf import PerfModel, PerfOptions
from phalanx.cluster.policies import make_ordering, make_placement
from phalanx.cluster.sim.event import SimConfig, Simulator
from phalanx.errors import ConfigError
from phalanx.runtime import rank_record

SYNC = "{model: mlp, data: synthetic, epochs: 100, strategy: sync, tensorboard: false"


def job_list(quick: bool) -> str:
    steps = (2000, 3000, 2000, 300) if quick else (3000, 5000, 4000, 600)
    return (f"jobs:\n"
            f"  - {{name: A, arrival: 0, gpus: 2, config: {SYNC}, max_steps: {steps[0]}}}}}\n"
            f"  - {{name: C, arrival: 0, gpus: 1, config: {SYNC}, max_steps: {steps[1]}}}}}\n"
            f"  - {{name: B, arrival: 1, gpus: 1, config: {SYNC}, max_steps: {steps[2]}}}}}\n"
            f"  - {{name: D, arrival: 9, gpus: 2, config: {SYNC}, max_steps: {steps[3]}}}}}\n")


def run_live(topology: Topology, jobs: list[LiveJob], out: Path, executor, slot: float
             ) -> LiveCluster:
    live = LiveCluster(topology, jobs, make_ordering("tiresias", slot, (slot * 1.5,), 0.0),
                       make_placement("first-fit"), LiveConfig(out, grace_s=30.0),
                       executor=Timed(executor))
    res = live.run()
    bad = [st.spec.name for st in res.jobs if st.failure or st.end < 0]
    if bad:
        sys.exit(f"bench live: jobs {bad} did not finish; see {out}/logs")
    live.result = res
    return live


class Timed:
    """An executor that notes when each start was asked for (unix time, as rank records)."""

    def __init__(self, inner) -> None:  # noqa: ANN001 - any executor
        self.inner, self.name, self.asked = inner, inner.name, {}

    def start(self, gang) -> None:  # noqa: ANN001
        self.asked[(gang.job, gang.start)] = (time.time(), gang.record)
        self.inner.start(gang)

    def poll(self, job: str) -> int | None:
        return self.inner.poll(job)

    def stop(self, job: str, grace_s: float) -> None:
        self.inner.stop(job, grace_s)

    def close(self) -> None:
        self.inner.close()

    def down(self) -> frozenset[str]:
        return self.inner.down()


def launches(timed: Timed) -> list[float]:
    """Per start: asked -> its last rank's process running."""
    out = []
    for (_job, start), (t, record) in timed.asked.items():
        unix = [r.unix for r in rank_record.read(record) if r.start == start]
        if unix:
            out.append(max(unix) - t)
    return out


def overhead(live: LiveCluster) -> dict:
    stops = [s.exited - s.asked for s in live.stops]
    starts = [t for _, t in live.start_s]
    launch = launches(live.executor) if isinstance(live.executor, Timed) else []

    def med(xs: list[float]) -> float | None:
        return round(statistics.median(xs), 4) if xs else None

    return {"launch_s": med(launch), "launch_s_max": round(max(launch, default=0.0), 4),
            "decision_ms": med([1e3 * t for t in live.round_times]),
            "decision_ms_max": round(1e3 * max(live.round_times, default=0.0), 3),
            "rounds": len(live.round_times), "preemptions": len(stops),
            "stop_s": med(stops), "start_overhead_s": med(starts),
            # the first start on a device creates its Ray actor: the worst start
            "start_overhead_s_max": round(max(starts, default=0.0), 4), "starts": len(starts)}


def first_steps_after(out: Path, name: str) -> float:
    """A job's start-up: from its rank 0's process start (its rank record) to its first
    logged steps (the first ``train`` event, at step 10)."""
    rec = next(r for r in rank_record.read(out / "ranks" / f"{name}.jsonl") if r.rank == 0)
    for line in (out / "jobs" / name / "events.jsonl").read_text().splitlines():
        e = json.loads(line)
        if e.get("kind") == "train" and e.get("rank") == 0:
            return e["unix"] - rec.unix
    raise RuntimeError(f"{name}: no train event")


def simulate(topology: Topology, jobs: list[LiveJob], alone: dict[str, float],
             restart_s: float, slot: float, shared_cores: int = 0) -> dict[str, float]:
    specs = [j.spec.__class__(**{**j.spec.__dict__, "work": alone[j.spec.name],
                                 "duration": alone[j.spec.name], "cpu_per_gpu": 1})
             for j in jobs]
    # one machine's slots: no measured spread penalty or interference to model
    perf = PerfModel({"mlp": ModelProfile("mlp", 0.0, 0.0, (), 0.0, "measured here")},
                     options=PerfOptions(interference=False, cpu=False,
                                         shared_cores=shared_cores))
    sim = Simulator(topology, specs, make_ordering("tiresias", slot, (slot * 1.5,), 0.0),
                    make_placement("first-fit"), perf,
                    config=SimConfig(checkpoint_cost_s=restart_s))
    res = sim.run()
    return {st.spec.name: st.end - st.spec.submit for st in res.jobs}


def run_slurm(topology: Topology, jobs: list[LiveJob], out: Path, slot: float) -> dict:
    """The overhead on a local Slurm cluster (its start-up and teardown timed beside)."""
    try:
        check_installed(local=True)
    except ConfigError as e:
        return {"skipped": str(e)}
    t = time.perf_counter()
    with slurm_cluster(topology) as target:
        up = time.perf_counter() - t
        live = run_live(topology, jobs, out, SlurmExecutor(topology, target, sys.executable),
                        slot)
        t = time.perf_counter()
    return {**overhead(live), "cluster_up_s": round(up, 2),
            "cluster_down_s": round(time.perf_counter() - t, 2)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--calibrate", action="store_true",
                    help="also run each job alone and the simulator (several minutes)")
    ap.add_argument("--slot", type=float, default=5.0)
    ap.add_argument("--slurm", action="store_true",
                    help="with --quick, also the Slurm engine (always without --quick: the "
                         "three engines take ~110 s on 2 loaded cores, over --quick's minute)")
    a = ap.parse_args()
    results: dict = {"load_1min_before": round(os.getloadavg()[0], 2)}
    with tempfile.TemporaryDirectory() as tmp:
        tmp_p = Path(tmp)
        topology = resolve_cluster("three-nodes", _common.ROOT)   # a | b, c in 2 racks
        (tmp_p / "jobs.yaml").write_text(job_list(a.quick))
        jobs = load_job_list(tmp_p / "jobs.yaml")
        local = run_live(topology, jobs, tmp_p / "local", LocalExecutor(), a.slot)
        results["local"] = overhead(local)
        print("local", results["local"], flush=True)
        with ray_cluster(topology) as address:
            ray_live = run_live(topology, jobs, tmp_p / "ray",
                                RayExecutor(topology, address, sys.executable), a.slot)
        results["ray"] = overhead(ray_live)
        print("ray", results["ray"], flush=True)
        results["slurm"] = run_slurm(topology, jobs, tmp_p / "slurm", a.slot) if (
            a.slurm or not a.quick) else {"skipped": "--quick without --slurm"}
        print("slurm", results["slurm"], flush=True)
        if a.calibrate:
            alone, startup = {}, []
            for j in jobs:
                solo = j.__class__(j.spec.__class__(**{**j.spec.__dict__, "submit": 0.0}),
                                   j.config)
                one = run_live(topology, [solo], tmp_p / f"alone-{j.spec.name}",
                               LocalExecutor(), 1e6)
                st = one.result.jobs[0]
                alone[j.spec.name] = st.end - st.start
                startup.append(first_steps_after(tmp_p / f"alone-{j.spec.name}", j.spec.name))
            # what a resume costs live: the stop, the engine's start, the ranks' start-up
            restart = (results["ray"]["stop_s"] or 0.0) + results["ray"]["start_overhead_s"] \
                + statistics.median(startup)
            live_jct = {st.spec.name: st.end - st.spec.submit for st in ray_live.result.jobs}
            results["calibration"] = {
                "restart_cost_s": round(restart, 2),
                "alone_s": {k: round(v, 2) for k, v in alone.items()},
                "live_jct_s": {k: round(v, 2) for k, v in live_jct.items()}}
            # the simulator's per-device model, then with this machine's cores shared by
            # every slot (the test cluster's devices are slots of one machine)
            for label, cores in (("per_device", 0), ("shared_cores", os.cpu_count() or 1)):
                sim = simulate(topology, jobs, alone, restart, a.slot, cores)
                ratio = {n: round(sim[n] / live_jct[n], 3) for n in sim}
                results["calibration"][label] = {
                    "cores": cores, "sim_jct_s": {k: round(v, 2) for k, v in sim.items()},
                    "sim_over_live": ratio, "median": round(statistics.median(ratio.values()), 3),
                    "min": min(ratio.values()), "max": max(ratio.values())}
            print("calibration", results["calibration"], flush=True)
    results["load_1min_after"] = round(os.getloadavg()[0], 2)
    r, lo, sl = results["ray"], results["local"], results["slurm"]
    ratios = {
        "ray_over_local_start_overhead": round(r["start_overhead_s"] / lo["start_overhead_s"],
                                               1),
        # targets as ours/reference >= 1: the budget over what was measured
        "decision_budget_10ms_over_ray_decision": round(10.0 / max(r["decision_ms"], 1e-6), 1),
        "quantum_share_budget_over_ray_preemption": round(
            0.1 * 60.0 / max((r["stop_s"] or 0) + r["start_overhead_s"], 1e-6), 2)}
    targets = {"decision_budget_10ms_over_ray_decision": 1.0,
               "quantum_share_budget_over_ray_preemption": 1.0}
    if "skipped" not in sl:
        ratios.update({
            "slurm_over_local_launch": round(sl["launch_s"] / lo["launch_s"], 1),
            "decision_budget_10ms_over_slurm_decision": round(
                10.0 / max(sl["decision_ms"], 1e-6), 1),
            "quantum_share_budget_over_slurm_preemption": round(
                0.1 * 60.0 / max((sl["stop_s"] or 0) + sl["launch_s"], 1e-6), 2)})
        targets.update({"decision_budget_10ms_over_slurm_decision": 1.0,
                        "quantum_share_budget_over_slurm_preemption": 1.0})
    _common.emit("live", results, ratios, targets)


if __name__ == "__main__":
    main()
