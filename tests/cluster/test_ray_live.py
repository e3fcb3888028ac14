"""Live scheduling on a real external Ray cluster, started the way a user starts one
(docs/cluster.md): three test hosts (network namespaces on one bridge,
:class:`phalanx.runtime.hosts.TestNetwork`), ``ray start --head`` in host 0 and ``ray start
--address`` in hosts 1 and 2 as separate processes, each node declaring its device of the
``three-nodes`` topology (``--resources '{"phx_dev_N": 1}' --labels phalanx.server=a|b|c
--num-gpus 0``); ``phalanx schedule --engine ray --ray-address HEAD:PORT`` runs inside host
0, as a user runs it. Ray hands out each node's own address, so a gang spanning hosts forms
its group only if every rank binds where the others connect (issue 33).

* A 2-device sync gang spans hosts 0 and 1 and trains to the parameters of the same job on
  one host; Tiresias with a short quantum preempts and resumes a real sync gang; a node
  cut off by a partition and then one that crashes (one schedule) each lose their job to
  the other nodes and take their device back when they return; a scheduler killed with
  ``kill -9`` is resumed; every rank records where it ran; the ranks listen only on their
  host's own address (Ray's own daemons listen on ``*`` inside their namespace: recorded,
  not asserted). The cluster is started once for the module and torn down on every exit path:
  our Ray processes by their temp folders (never ``ray stop``: it would end every Ray
  process of the machine), then the folders, then the namespaces.
* The SIGINT test lets the CLI build its own (in-process, loopback) cluster, so the
  teardown of that path is checked too.
"""

import contextlib
import csv
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

ray = pytest.importorskip("ray")

from live_procs import (  # noqa: E402
    Reference,
    check_lost_node_run,
    ranks_where_placed,
    resumed,
    rows_of,
    wait_for_checkpoint,
)
from live_procs import pids_with as _pids_with  # noqa: E402

from phalanx.cluster.chaos import raycluster  # noqa: E402
from phalanx.cluster.chaos.raycluster import TOPOLOGY, ray_env  # noqa: E402
from phalanx.cluster.chaos.raycluster import kill_and_wait as _kill_and_wait  # noqa: E402
from phalanx.cluster.live.engines.ray_cluster import HealthCheck, verdict_s  # noqa: E402
from phalanx.runtime import first_failure, rank_record  # noqa: E402
from phalanx.runtime.checkpoint import load_checkpoint  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
# one intra-op thread per rank wherever it runs: a lone rank on a host would otherwise take
# 2, and its matmuls would sum in another order than on one host (5e-5 apart after 60 steps)
SYNC = ("{model: mlp, data: synthetic, epochs: 100, strategy: sync, tensorboard: false, "
        "seed: 3, worker_threads: 1")
# Tiresias, 2 s rounds, queues split at 3, 6, 12, ... 96 GPU-s, first-fit placement (lowest
# free devices). t=0: A (2 GPUs) on nodes a,b; C on c, both started in the same pass, so A's
# attained service is always exactly twice C's; with thresholds that double, A is then a
# queue below C at every round once it has 3 GPU-s, whenever the first round comes (under
# load, starting the Ray actors holds the loop for seconds: with one threshold, at 6 GPU-s,
# A and C passed it before the first round and C, the later job, was preempted). t=1: B
# waits, in queue 0. At the first round A is preempted through its actors (SIGTERM:
# checkpoint, exit 75) and B takes a. A resumes from its checkpoint once two devices are
# free, on a,b or b,c as B or C ends first. (A job resumed on other nodes,
# deterministically: the node-loss test below; a non-preemptible straggler holding b once
# forced it here, and made this the suite's longest test, 220 s at load 8.)
JOBS = f"""jobs:
  - {{name: A, arrival: 0, gpus: 2, config: {SYNC}, max_steps: 900}}}}
  - {{name: C, arrival: 0, gpus: 1, config: {SYNC}, max_steps: 1500}}}}
  - {{name: B, arrival: 1, gpus: 1, config: {SYNC}, max_steps: 1000}}}}
"""
SCHEDULE = ["--policy", "tiresias", "--slot", "2", "--tiresias-thresholds", "3,6,12,24,48,96",
            "--starvation", "0", "--placement", "first-fit", "--grace", "30", "--engine",
            "ray"]


def _env():
    """Every ``ray start`` and the scheduler (:func:`raycluster.ray_env`: Ray's health
    check in seconds, not a minute)."""
    return ray_env(REPO)


@pytest.fixture(scope="module")
def cluster():
    why = raycluster.unavailable()
    if why is not None:
        pytest.skip(why)
    with raycluster.ray_test_cluster(REPO, TOPOLOGY) as c:
        yield c


@contextlib.contextmanager
def watching_listeners(net):
    """Samples every listening socket of the hosts while the block runs: yields
    {host: listeners}."""
    seen: dict[int, set] = {i: set() for i in range(len(net.hosts))}
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            for i, host in enumerate(net.hosts):
                seen[i].update(host.listening())
            time.sleep(0.3)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield seen
    finally:
        done.set()
        watcher.join()


def schedule_in_host0(net, address: str, jobs: Path, out: Path, args: list[str]):
    """``phalanx schedule`` inside host 0 against the external cluster, while every
    listening socket of the hosts is sampled: returns (the run, {host: listeners})."""
    with watching_listeners(net) as seen:
        r = net.hosts[0].run([sys.executable, "-m", "phalanx.cli", "schedule", "--jobs",
                              str(jobs), "--cluster", TOPOLOGY, *args, "--ray-address",
                              address, "--out", str(out)], env=_env(), cwd=REPO,
                             timeout=300, check=False)
    return r, seen


def ranks_listen_on_their_host_only(net, seen) -> None:
    """Every listener of a rank (its store, its gloo device) is on its host's own address;
    Ray's own daemons' listeners are printed (theirs: ``*`` inside the namespace)."""
    for i, host in enumerate(net.hosts):
        ranks = {x.addr for x in seen[i] if "phalanx.entry.scheduled" in x.cmdline}
        assert ranks <= {host.addr}, (i, ranks)
    print("ray's own listeners (host, address):",
          sorted({(i, x.addr) for i in seen for x in seen[i]
                  if "phalanx.entry.scheduled" not in x.cmdline}))


def one_host_reference(tmp_path: Path, line: str, name: str) -> dict:
    """The job of ``line``, uninterrupted, on two local slots of this machine: its final
    parameters."""
    jobs = tmp_path / f"ref-{name}.yaml"
    jobs.write_text("jobs:\n" + line + "\n")
    ref = tmp_path / f"ref-{name}"
    subprocess.run([sys.executable, "-m", "phalanx.cli", "schedule", "--jobs", str(jobs),
                    "--cluster", "uniform:1,1,1,2", "--out", str(ref)], check=True,
                   env=_env(), cwd=REPO, capture_output=True, timeout=120)
    return load_checkpoint(ref / "jobs" / name / "checkpoint.pt")["model"]


# slow (~35 s): preemption and resumption are in the suite on the local engine
# (test_live.py) and on Slurm, and Ray's stop-and-restart path in the node-loss (cut off,
# then crashed) and kill -9 tests here; the suite's 8 minutes on 2 cores do not hold every
# engine's copy
@pytest.mark.slow
def test_tiresias_preempts_and_resumes_a_gang(cluster, tmp_path):
    net, address, topology = cluster
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(JOBS)
    out = tmp_path / "out"
    r, seen = schedule_in_host0(net, address, jobs, out, SCHEDULE)
    assert r.returncode == 0, r.stdout + r.stderr
    # every device's actor was up before the clock started: created inside A's start, at
    # load ~4 it held the loop 43 s while A ran, and no round could preempt it (CI failed)
    assert re.search(r"^phalanx: ray: 3 device actors ready in [\d.]+ s$", r.stdout, re.M), \
        r.stdout
    rows = {row["name"]: row for row in csv.DictReader((out / "jobs.csv").open())}
    assert all(rows[n]["status"] == "finished" for n in "ABC"), rows
    assert all(rows[n]["preemptible"] == "yes" for n in "ABC")

    # the scheduler's placements per start, and what each rank recorded: Ray put each rank
    # on the node of the device we gave it, and the rank saw only that device
    names = [s.name for s in topology.servers]
    ranks_where_placed(out, rows, topology, "ABC")
    assert len(names) == 3 and len(set(topology.server_rack)) == 2
    assert int(rows["A"]["preemptions"]) >= 1, "; ".join(
        f"{n}: {r['submit']}-{r['start']}-{r['end']} {r['placements']}" for n, r in rows.items())

    # the preempted sync job ends with the parameters of an uninterrupted run of it (the
    # same torchrun-style ranks, here on local slots of one host)
    got = load_checkpoint(out / "jobs" / "A" / "checkpoint.pt")["model"]
    want = one_host_reference(tmp_path, next(ln for ln in JOBS.splitlines()
                                             if "name: A" in ln), "A")
    assert got.keys() == want.keys()
    for k in got:
        assert torch.equal(got[k], want[k]), k
    assert sum(float(v.float().abs().sum()) for v in got.values()) > 0

    # the ranks listened on their host's own address only; no rank process is left
    ranks_listen_on_their_host_only(net, seen)
    assert not _pids_with(str(out))


def test_sigint_mid_run_leaves_no_process(tmp_path):
    """The CLI builds its own Ray cluster; Ctrl-C (SIGINT to its process group) while jobs
    run stops the ranks, the actors and the cluster, removes Ray's temp folder, exits 130."""
    topo = "three-nodes"
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(JOBS)
    out = tmp_path / "out"
    before = set(Path(p).name for p in Path("/tmp").glob("phalanx-ray-*"))
    # its own process group, so that the SIGINT reaches what a terminal's Ctrl-C reaches:
    # the command and the Ray processes it started
    p = subprocess.Popen([sys.executable, "-m", "phalanx.cli", "schedule", "--jobs",
                          str(jobs), "--cluster", str(topo), *SCHEDULE, "--out", str(out)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
                         start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and len(rank_record.read(out / "ranks" / "A.jsonl")) < 2:
            time.sleep(0.2)
        assert len(rank_record.read(out / "ranks" / "A.jsonl")) == 2, "no rank started"
        ours = [p for p in Path("/tmp").glob("phalanx-ray-*") if p.name not in before]
        assert ours and _pids_with(str(out))
        os.killpg(p.pid, signal.SIGINT)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130, err
    time.sleep(2)   # what Ray's last processes might do on their way out
    assert not _pids_with(str(out)), "rank processes left behind"
    for folder in ours:
        assert not _pids_with(str(folder)), "Ray processes left behind"
        assert not folder.exists(), "Ray's temp folder left behind"


# S of the node-loss and kill -9 tests (one reference run serves both): 480 steps, so that
# each start still trains for a few seconds after the test saw it resume
S_LINE = (f"  - {{name: S, arrival: 0, gpus: 2, config: {SYNC}, max_steps: 480, "
          "checkpoint_every: 30}}")


def _resumes(out: Path, name: str) -> int:
    """How many ``resume`` events job ``name``'s run has logged so far (a line being
    written may be cut short: counted by its text)."""
    try:
        return (out / "jobs" / name / "events.jsonl").read_text().count('"kind": "resume"')
    except OSError:
        return 0


def test_a_cut_off_node_and_a_crashed_one_lose_their_job_to_the_others_and_come_back(
        cluster, tmp_path):
    """Both ways a node is lost, in one schedule (one scheduler, one S, one G: a test each
    started all three again). S (2 devices, first-fit: nodes a and b) checkpoints every 30
    steps; G (3 devices: every node) can run only once every node is back.

    * A network partition: host b's link goes down while S runs on a, b (``ip link set eth0
      down`` in b: its processes run on, nobody hears them). The GCS calls b dead within
      ``verdict_s()``; S's rank on b has already killed itself (its actor's lease on b's
      life ran out: ``ray_fence``), before S resumes from its checkpoint on a, c; no rank
      waits out gloo's 120 s. When the link is back, Ray's processes on b leave (the GCS
      called the node dead).
    * A crash: ``ray start`` makes b a node again once S's second start (a, c) is under
      way; once both its ranks have resumed, every process of host c is killed. The
      scheduler marks c's device lost and S resumes from its checkpoint on a, b; then c
      comes back and G runs on a, b, c.

    Both finish; S ends with the parameters of an uninterrupted run, bit for bit, and its
    run folder has nothing written after S finished; nothing is left behind. It is also the
    test of a gang spanning hosts: each of S's starts forms its group across two hosts
    (0 and 1, then 0 and 2, then 0 and 1: every rank in its own network namespace, as the
    rank itself read it) and the ranks listen on their host's own address only."""
    t_test = time.monotonic()
    c, net = cluster, cluster.net
    host_b = net.hosts[1]
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(f"jobs:\n{S_LINE}\n  - {{name: G, arrival: 0, gpus: 3, config: {SYNC}, "
                    "max_steps: 10}}\n")
    ref = Reference(tmp_path, S_LINE, "S", _env())
    out = tmp_path / "out"
    p = net.hosts[0].popen([sys.executable, "-m", "phalanx.cli", "schedule", "--jobs",
                            str(jobs), "--cluster", TOPOLOGY, "--engine", "ray",
                            "--placement", "first-fit", "--ray-address", c.address, "--out",
                            str(out)], env=_env(), cwd=REPO, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    said: list[tuple[float, str]] = []   # (when, line) of the scheduler's output
    reader = threading.Thread(target=lambda: said.extend(
        (time.monotonic(), ln) for ln in p.stdout), daemon=True)
    reader.start()
    cut = b_back = False
    crashed: list[float] = []   # when c was crashed (Unix time)
    c_back = False

    def restore() -> None:   # on the way out, whatever happened: b and c nodes again
        if cut and not b_back:
            host_b.link_up()
            _kill_and_wait(c.node_temp[1])
            c.start_node(1)
        if crashed and not c_back:
            c.start_node(2)

    def crash_c_once_s_resumed_on_it() -> None:
        # S's second start (a, c) may begin while the test still waits on b: watched here.
        # Crashed as soon as both its ranks resumed (then ~450 steps from its end)
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline and p.poll() is None and not (
                _resumes(out, "S") >= 2 and {x.node for x in rank_record.read(
                    out / "ranks" / "S.jsonl") if x.start == 1} == {"a", "c"}):
            time.sleep(0.02)
        if p.poll() is None and _resumes(out, "S") >= 2:
            crashed.append(time.time())
            c.crash_node(2)

    crasher = threading.Thread(target=crash_c_once_s_resumed_on_it, daemon=True)
    with contextlib.ExitStack() as stack:
        seen = stack.enter_context(watching_listeners(net))
        stack.callback(restore)
        stack.callback(lambda: crasher.join(timeout=160) if crasher.is_alive() else None)
        stack.callback(lambda: p.kill() if p.poll() is None else None)
        wait_for_checkpoint(out, "S", p)
        cut_off = next(x for x in rank_record.read(out / "ranks" / "S.jsonl")
                       if x.start == 0 and x.node == "b")
        zombie = cut_off.pid
        b_temp = Path(c.node_temp[1])   # b's Ray logs (its actor's stderr among them)
        crasher.start()
        t_cut, cut_unix = time.monotonic(), time.time()
        host_b.link_down()
        cut = True
        zombie_gone = None
        # the link stays down until the scheduler calls b lost (S then resumes on a, c
        # while b's node leaves)
        deadline = t_cut + 60
        while time.monotonic() < deadline and p.poll() is None and not any(
                "server b lost" in ln for _, ln in said):
            if zombie_gone is None and zombie not in host_b.pids():
                zombie_gone = time.monotonic() - t_cut
            time.sleep(0.05)
        if zombie_gone is None and zombie not in host_b.pids():
            zombie_gone = time.monotonic() - t_cut
        left_on_b = [x for x in host_b.processes() if str(out) in x]
        host_b.link_up()
        t_up = time.monotonic()
        # the GCS called b dead: its raylet leaves once it hears so, its workers with it;
        # Ray's log monitor stays (as after any raylet's death): ours to end
        raylet_gone = _raylet_gone(host_b, 60)
        raylet_s = time.monotonic() - t_up
        still_on_b = host_b.processes()
        _kill_and_wait(c.node_temp[1])
        # b starts again once S's second start (a, c) is under way, as in a test of one
        # loss (else b was back in time to take S again); it joins while c crashes, and
        # S's third start is on a, b
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and p.poll() is None and not any(
                x.start == 1 for x in rank_record.read(out / "ranks" / "S.jsonl")):
            time.sleep(0.1)
        c.start_node(1)
        b_back = True
        crasher.join(timeout=150)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and p.poll() is None and not any(
                x.start == 2 for x in rank_record.read(out / "ranks" / "S.jsonl")):
            time.sleep(0.1)
        c.start_node(2)
        c_back = True
        p.wait(timeout=240)
        reader.join(timeout=10)
    stdout = "".join(ln for _, ln in said)
    assert p.returncode == 0, stdout
    assert crashed, "S's second start never resumed on a, c: nothing crashed"
    check_lost_node_run(out, stdout, starts=("0,1", "0,2", "0,1"), lost="bc")
    ref.assert_same_parameters(out)   # bit for bit
    recs = rank_record.read(out / "ranks" / "S.jsonl")
    ns = {h.netns(): i for i, h in enumerate(net.hosts)}
    assert sorted((x.start, x.rank, ns.get(x.netns)) for x in recs) == [
        (0, 0, 0), (0, 1, 1), (1, 0, 0), (1, 1, 2), (2, 0, 0), (2, 1, 1)]
    ranks_listen_on_their_host_only(net, seen)

    check = HealthCheck.from_env(_env())
    lost_s = next(t for t, ln in said if "server b lost" in ln) - t_cut
    start1 = min(x.unix for x in recs if x.start == 1)
    resumed_after_crash = min(x.unix for x in recs if x.start == 2) - crashed[0]
    figures = (f"b called lost {lost_s:.1f} s after the cut (verdict_s {verdict_s(_env()):g} "
               f"s); its rank killed itself after {zombie_gone:.1f} s (lease "
               f"{check.fence_s():g} s); S resumed {start1 - cut_unix:.1f} s after the cut; "
               f"Ray's processes on b gone {raylet_s:.1f} s after the link came back; S "
               f"resumed {resumed_after_crash:.1f} s after c crashed; load "
               f"{os.getloadavg()[0]:.1f}")
    print(figures)
    # detected within the cluster's own health-check time, and not before it could be
    assert check.silent_s()[0] - 0.5 <= lost_s <= verdict_s(_env()) + 2, figures
    # the cut-off rank fenced itself before S started elsewhere, and nothing of S ran on b
    # when the link came back
    assert zombie_gone is not None and zombie_gone <= check.fence_s() + 2, figures
    assert start1 > cut_unix + zombie_gone, figures
    # (Ray may write a worker's stderr to two files: the line once, in either or both)
    fenced = {ln for f in b_temp.glob("session_*/logs/worker-*.err")
              for ln in f.read_text(errors="replace").splitlines() if "(fenced)" in ln}
    assert [ln.startswith("phalanx: ray: no word from the cluster for ") and
            ln.endswith(f"rank pid {zombie} killed (fenced)") for ln in fenced] == [True], fenced
    assert left_on_b == [], left_on_b
    assert raylet_gone, "Ray's processes on b still ran 60 s after the link came back"
    assert all("ray/_private/log_monitor.py" in x for x in still_on_b), still_on_b
    # no rank waited out gloo's timeout, on either side of the cut
    log = (out / "logs" / "S.log").read_text()
    assert "Timed out" not in log and start1 - cut_unix < 30, figures
    # nothing in S's run folder was written after S finished (the zombie's error line and
    # memory event were, before the fence)
    events = [json.loads(ln) for ln in (out / "jobs" / "S" / "events.jsonl").open()]
    assert events[-1]["kind"] == "summary", events[-3:]
    # the cut-off rank claimed no failure (fenced: killed from outside, it cannot). Its
    # peer on a may have: on a loaded machine (6.6) rank 0 saw its peer gone and exited 2
    # before the scheduler's verdict stopped it ("0 2"), a claim the engine weighs as a
    # consequence (S still resumed on a and c, asserted above)
    claim = first_failure.read(out / "ranks" / "S.0.failed")
    assert claim is None or claim[0] != cut_off.rank, claim
    assert not _pids_with(str(out)), "rank processes left behind"
    print(f"test {time.monotonic() - t_test:.1f} s")


def _raylet_gone(host, timeout_s: float) -> bool:
    """Whether the raylet of ``host`` and its workers (``ray::...``) end by themselves
    within ``timeout_s``."""
    def ray_node() -> list[str]:
        return [x for x in host.processes()
                if x.split(" ")[0].endswith("/raylet") or x.startswith("ray::")]

    deadline = time.monotonic() + timeout_s
    while ray_node() and time.monotonic() < deadline:
        time.sleep(0.1)
    return not ray_node()


def test_kill_9_of_the_scheduler_then_resume_on_ray(cluster, tmp_path):
    """``phalanx schedule`` (in host 0) is killed by SIGKILL while S (nodes a, b) runs; its
    actors die with it (Ray ends a dead driver's actors) and S's ranks with them.
    ``--resume OUT`` runs S from its checkpoint to the parameters of an uninterrupted run,
    and nothing is left behind (that a finished job is not run again: test_live_restart)."""
    t_test = time.monotonic()
    c = cluster
    host0 = c.net.hosts[0]
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(f"jobs:\n{S_LINE}\n")
    ref = Reference(tmp_path, S_LINE, "S", _env())
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "phalanx.cli", "schedule", "--jobs", str(jobs), "--cluster",
            TOPOLOGY, "--engine", "ray", "--placement", "first-fit", "--ray-address",
            c.address]
    err = (tmp_path / "err").open("w")
    p = host0.popen([*argv, "--out", str(out)], env=_env(), cwd=REPO,
                    stdout=subprocess.DEVNULL, stderr=err)
    try:
        wait_for_checkpoint(out, "S", p)
        p.kill()   # SIGKILL: ip netns exec became the scheduler itself
        p.wait(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
        err.close()
    state = json.loads((out / "scheduler-state.json").read_text())
    assert state["jobs"]["S"]["status"] == "running", state["jobs"]
    t0 = time.monotonic()
    r = host0.run([*argv, "--resume", str(out)], env=_env(), cwd=REPO, timeout=240,
                  check=False)
    resumed_s = time.monotonic() - t0
    assert r.returncode == 0, r.stdout + r.stderr
    rows = rows_of(out)
    assert rows["S"]["status"] == "finished", rows
    assert [x.split("@")[1] for x in rows["S"]["placements"].split(";")] == ["0,1", "0,1"]
    assert [r for r, _ in resumed(out, "S")] == [0, 1]
    ref.assert_same_parameters(out)
    assert not _pids_with(str(out)), "rank processes left behind"
    print(f"resumed schedule {resumed_s:.1f} s; test {time.monotonic() - t_test:.1f} s")


# slow (78 s of a fresh clone's 627 s suite, 2026-11-29): the same two policies schedule
# real jobs on the local engine in every run (test_live_types: sia's move across types;
# test_live_elastic: pollux's resize), and the Ray engine's own paths (placement on the
# devices' nodes, preemption, resume, node loss) are this module's other tests
@pytest.mark.slow
def test_sia_and_pollux_schedule_real_jobs_on_ray(cluster, tmp_path):
    """The catalog's sia and pollux on the module's Ray cluster (no cluster of their own;
    its nodes declare no device type, so sia sees one type here: its moves across types
    are tests/cluster/test_live_types.py's, on the local engine): under ``--policy sia``
    two jobs get their GPUs from its MILP, run on the nodes of the devices it gave and
    finish; under ``--policy pollux`` a job is resized once its model was fitted to what it
    measured."""
    c = cluster
    sync = "model: mlp, data: synthetic, strategy: sync, tensorboard: false, worker_threads: 1"
    jobs = tmp_path / "sia.yaml"
    jobs.write_text("jobs:\n"
                    f"  - {{name: A, arrival: 0, gpus: 1, config: {{{sync}, epochs: 30, "
                    "checkpoint_every: 100}}\n"
                    f"  - {{name: B, arrival: 0.5, gpus: 1, config: {{{sync}, epochs: 20, "
                    "checkpoint_every: 100}}\n")
    out = tmp_path / "sia"
    r = c.net.hosts[0].run([sys.executable, "-m", "phalanx.cli", "schedule", "--jobs",
                            str(jobs), "--cluster", TOPOLOGY, "--engine", "ray", "--policy",
                            "sia", "--interval", "1", "--restart-cost", "1", "--ray-address",
                            c.address, "--out", str(out)], env=_env(), cwd=REPO, timeout=300,
                           check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "engine ray (sia," in r.stdout, r.stdout
    rows = rows_of(out)
    assert [rows[n]["status"] for n in "AB"] == ["finished", "finished"], rows
    ranks_where_placed(out, rows, c.topology, "AB")

    jobs = tmp_path / "pollux.yaml"
    jobs.write_text(f"jobs:\n  - {{name: e, arrival: 0, gpus: 1, config: {{{sync}, "
                    "epochs: 160}}\n")
    out = tmp_path / "pollux"
    r = c.net.hosts[0].run([sys.executable, "-m", "phalanx.cli", "schedule", "--jobs",
                            str(jobs), "--cluster", TOPOLOGY, "--engine", "ray", "--policy",
                            "pollux", "--interval", "1.5", "--restart-cost", "1",
                            "--ray-address", c.address, "--out", str(out)], env=_env(),
                           cwd=REPO, timeout=300, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    assert rows_of(out)["e"]["status"] == "finished"
    lines = (out / "logs" / "e.log").read_text().splitlines()
    fitted = [i for i, ln in enumerate(lines) if "step-time model fitted to" in ln]
    resized = [i for i, ln in enumerate(lines) if re.search(r"resized \d+ -> \d+ workers", ln)]
    assert fitted and any(i > fitted[0] for i in resized), lines
    assert not _pids_with(str(tmp_path)), "rank processes left behind"
