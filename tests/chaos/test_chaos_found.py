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

ROOT = Path(__file__).resolve().parents[2]


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


class _NodeLostAtExit:
    """An executor (no processes: the loop's logic only) whose job ``J`` runs on servers
    s0 and s1 and ends with a rank killed (-9) at the very poll where s1 is first reported
    lost, as Ray's does: a dead actor's rank counts as ended once its node is down, which
    its poll reads itself. Every later start runs 3 polls and finishes."""

    name = "node-lost-at-exit"

    def __init__(self, lost: str) -> None:
        self.lost_name = lost
        self.failed: dict = {}
        self.left: dict[str, int] = {}
        self.starts: list[int] = []
        self.lost: frozenset[str] = frozenset()

    def start(self, gang) -> None:
        self.starts.append(gang.start)
        self.left[gang.job] = 3

    def poll(self, job: str) -> int | None:
        self.left[job] -= 1
        if self.left[job] > 0:
            return None
        del self.left[job]
        if len(self.starts) == 1:
            self.lost = frozenset({self.lost_name})
            return -9
        return 0

    def stop(self, job: str, grace_s: float) -> None:
        self.left[job] = 1

    def close(self) -> None:
        self.left.clear()

    def down(self) -> frozenset[str]:
        return self.lost

    def stop_leftovers(self, logs, grace_s) -> dict:
        return {}


def test_a_job_ended_by_a_lost_server_is_named(tmp_path: Path, capsys) -> None:
    """A cut-off Ray host (chaos seed 202): S's rank there was gone and its gang's exit was
    read in the same poll that first saw the server lost, before the loop followed the
    loss; the loss's line (``server b lost``) named only the jobs it stopped, and S went
    back to the queue with no line naming it. It is named now, and resumes."""
    from phalanx.cluster.live.config import LiveConfig
    from phalanx.cluster.live.loop import LiveCluster
    from phalanx.cluster.policies import Pack, make_ordering

    jobs = tmp_path / "j.yaml"
    jobs.write_text("jobs: [{name: J, arrival: 0, gpus: 2, config: {model: mlp, data: "
                    "synthetic, strategy: sync}}]\n")
    topo = uniform(servers=3, devices=1, switches=1)
    s1 = topo.servers[1].name
    ex = _NodeLostAtExit(s1)
    res = LiveCluster(topo, load_job_list(jobs), make_ordering("fifo", 0.0, (), 0.0), Pack(),
                      LiveConfig(tmp_path / "out", poll_s=0.005), executor=ex).run()
    out = capsys.readouterr().out
    (st,) = res.jobs
    assert f"phalanx: scheduler: server {s1} lost: its devices are out of service\n" in out
    assert (f"phalanx: scheduler: J stopped: server(s) {s1} lost; it will resume from a "
            "checkpoint") in out, out
    # not a failure: it resumed on what was left and finished, no restart charged
    assert not st.failure and st.restarts == 0 and len(st.placements) == 2, st
    assert 1 not in st.placements[1][1]


def test_a_rank_started_on_a_cut_off_host_fails_in_one_line(tmp_path: Path) -> None:
    """A rank started on a Ray host just as its link went down (chaos seed 202) died of an
    ``OSError: Network is unreachable`` traceback (finding the route to its master). It is
    one ``phalanx: error`` line now, which the scheduler's failure line quotes."""
    import pytest

    from phalanx.runtime import hosts

    why = hosts.unavailable()
    if why is not None:
        pytest.skip(f"no test hosts: {why}")
    code = ("import sys; from phalanx.runtime import netif; from phalanx.errors import "
            "PhalanxError\ntry:\n    netif.choose(sys.argv[1], multi_host=True)\n"
            "except PhalanxError as e:\n    print(e)")
    with hosts.TestNetwork(2) as net:
        net.hosts[1].link_down()
        r = net.hosts[1].run([sys.executable, "-c", code, net.hosts[0].addr], check=False,
                             timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert r.stdout == (f"no route from this host to the master {net.hosts[0].addr} "
                        f"({net.hosts[0].addr}): network is unreachable\n"), r.stdout


def test_a_state_save_cut_by_a_kill_leaves_no_temp_file_after_the_resume(tmp_path: Path
                                                                         ) -> None:
    """``kill -9`` of the scheduler while it saved its state left
    ``.scheduler-state.json.PID.tmp`` in the schedule's folder for good (chaos --engine ray
    seed 204); ``--resume`` removes a dead writer's, never a live one's."""
    from phalanx.cluster.live.state import STATE_FILE, sweep_dead_saves

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / f".{STATE_FILE}.{dead.pid}.tmp").write_text('{"format": "phalanx-sch')
    (tmp_path / f".{STATE_FILE}.{os.getpid()}.tmp").write_text("being written")
    (tmp_path / STATE_FILE).write_text("{}")
    assert sweep_dead_saves(tmp_path) == [f".{STATE_FILE}.{dead.pid}.tmp"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f".{STATE_FILE}.{os.getpid()}.tmp", STATE_FILE]
