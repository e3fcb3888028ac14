"""Bugs the chaos harness found in the live scheduler, each held by a test of its own."""

from __future__ import annotations

from pathlib import Path

from phalanx.cluster.core.topology import uniform
from phalanx.cluster.live.joblist import check_settings, load_job_list
from phalanx.cluster.live.launch_plan import build_gang, plan_of


def test_a_pipeline_job_can_be_scheduled(tmp_path: Path) -> None:
    """A pipeline runs one process per stage and refuses ``--workers``: the job list set
    ``workers`` to the gang size (refused: 'does not use it') and a gang of 1 was refused
    too ('computes on 2 devices'), so no pipeline job could run live. Its gang is its
    stages now, and its command carries no ``--workers``."""
    jobs = tmp_path / "j.yaml"
    jobs.write_text("jobs: [{name: p, arrival: 0, gpus: 2, config: {model: mlp, data: "
                    "synthetic, strategy: pipeline, stages: 2, max_steps: 4}}]\n")
    (job,) = load_job_list(jobs)
    check_settings([job], str(jobs))
    plan = plan_of(job)
    gang = build_gang(job, plan, uniform(servers=1, devices=2), (0, 1), 0, tmp_path, False)
    # one rank per stage, each on its device, as torchrun would start them
    assert plan.per_rank and len(gang.ranks) == 2 and "--workers" not in gang.argv
    # a strategy that reads workers still gets the gang size
    jobs.write_text("jobs: [{name: s, arrival: 0, gpus: 2, config: {model: mlp, data: "
                    "synthetic, strategy: asp}}]\n")
    (job,) = load_job_list(jobs)
    gang = build_gang(job, plan_of(job), uniform(servers=1, devices=2), (0, 1), 0, tmp_path,
                      False)
    assert gang.argv[gang.argv.index("--workers") + 1] == "2"
