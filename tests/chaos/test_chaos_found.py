"""Bugs the chaos harness found in the live scheduler, each held by a test of its own."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
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


def test_a_start_survives_a_fork_server_killed_while_it_forks(tmp_path: Path) -> None:
    """``kill -9`` of the scheduler's fork server while a rank is being forked: the start
    read an unexpected EOF from the dead server and the scheduler died of the EOFError with
    a traceback (chaos seed 101). The start now goes to a fresh server. Here the server is
    held (SIGSTOP) while the start waits for its reply, then killed."""
    from multiprocessing import forkserver

    from phalanx.cluster.live.engines.local import ForkedRank
    from phalanx.runtime import supervise

    supervise.process_context()
    forkserver.ensure_running()
    server = forkserver._forkserver._forkserver_pid
    os.kill(server, signal.SIGSTOP)
    started: list = []
    t = threading.Thread(target=lambda: started.append(
        ForkedRank(("--strategy", "nope"), {}, tmp_path / "rank.log")))
    t.start()
    time.sleep(0.5)          # the start has sent its request and waits for the reply
    os.kill(server, signal.SIGKILL)
    t.join(timeout=60)
    assert started, "the start did not come back"
    rank = started[0]
    assert rank.pid != server and forkserver._forkserver._forkserver_pid != server
    deadline = time.monotonic() + 60
    while rank.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert rank.poll() is not None    # it ran (and ended: the flags are nonsense)


def test_a_writer_killed_mid_write_leaves_no_temp_file_at_the_next_start(tmp_path: Path
                                                                        ) -> None:
    """A shard killed (SIGKILL) while it wrote its checkpoint left ``.ps_shard0.ckpt.tmpPID``
    in the run folder for good (chaos seed 100); the next start of the job removes a dead
    writer's temp files, never a live one's."""
    from phalanx.cluster.live.launch_plan import sweep_dead_writers

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    run = tmp_path / "jobs" / "s"
    run.mkdir(parents=True)
    (run / f".ps_shard0.ckpt.tmp{dead.pid}").write_bytes(b"half")
    (run / f".checkpoint.pt.tmp{os.getpid()}").write_bytes(b"being written")
    (run / "checkpoint.pt").write_bytes(b"whole")
    jobs = tmp_path / "j.yaml"
    jobs.write_text("jobs: [{name: s, arrival: 0, gpus: 2, config: {model: mlp, data: "
                    "synthetic, strategy: sync}}]\n")
    (job,) = load_job_list(jobs)
    build_gang(job, plan_of(job), uniform(servers=1, devices=2), (0, 1), 1, tmp_path, False)
    assert sorted(p.name for p in run.iterdir()) == [f".checkpoint.pt.tmp{os.getpid()}",
                                                      "checkpoint.pt"]
    assert sweep_dead_writers(run) == []
