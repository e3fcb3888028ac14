"""The live learner's link level on real shaped links (issue 49, item 1): a Ray cluster of
three test hosts (:mod:`phalanx.cluster.chaos.raycluster`) whose links ``tc`` shapes to
20 Mbit/s, and ``phalanx schedule --ray-address`` (inside host 0) on a job list where two
2-worker sync MLPs (class ``mlp-sync-2``, as the profiler's) cross hosts, share host b's
link for a while and each run alone on their links for a while.

The cluster (``link-nodes``): servers a (1 device), b (2, one per switch), c (1). First-fit:
two 1-device fillers F1 (a) and F2 (b) make J1 cross b and c; once they ended, J2 takes
a's and b's free devices and crosses a and b. J1 and J2 then send over b's link at once.
What the schedule learns (``OUT/interference-learned.json``) is held to the profile's
(``reports/cluster/interference/link/``: ``mlp-sync-2`` beside ``mlp-sync-2`` kept 0.51 at
20 Mbit/s), and each job alone on its link to the same rate (not recorded as slowed).
"""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from live_procs import pids_with, rows_of  # noqa: E402

from phalanx.cluster.chaos import raycluster  # noqa: E402
from phalanx.cluster.core.cluster_file import load_topology  # noqa: E402
from phalanx.cluster.live.colocation import observe  # noqa: E402
from phalanx.cluster.model.interference import load_table  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
RATE_MBIT = 20
SYNC_CLASS, SINGLE_CLASS = "mlp-sync-2", "mlp-single-1"
TOPOLOGY = """name: link-nodes
device_types:
  - {name: v100, speed: 1.0}
zones:
  - name: z
    racks:
      - name: r
        servers:
          - {name: a, device_type: v100, devices: 1, cpu_cores: 2, memory_gib: 8}
          - {name: b, device_type: v100, devices: 2, pcie_switches: [1, 1], cpu_cores: 2,
             memory_gib: 8}
          - {name: c, device_type: v100, devices: 1, cpu_cores: 2, memory_gib: 8}
"""
# nothing but steps: no epoch's end, no evaluation past a small first one, one thread per
# rank (the profiler's LONG_RUN)
QUIET = ("data: synthetic, tensorboard: false, epochs: 1000000, eval_every: 1000000000, "
         "test_limit: 200")
SYNC = f"{{model: mlp, strategy: sync, worker_threads: 1, {QUIET}"
SINGLE = f"{{model: mlp, strategy: single, threads: 1, {QUIET}"
# at 20 Mbit/s a sync step (2 x 64 samples) takes ~0.17 s alone: J1 alone from its start
# to J2's (t=25 s), beside J2 for ~35 s, J2 alone for ~25 s after J1's end
JOBS = f"""jobs:
  - {{name: F1, arrival: 0, gpus: 1, config: {SINGLE}, max_steps: 2000}}}}
  - {{name: F2, arrival: 0, gpus: 1, config: {SINGLE}, max_steps: 2000}}}}
  - {{name: J1, arrival: 0.5, gpus: 2, config: {SYNC}, max_steps: 250}}}}
  - {{name: J2, arrival: 25, gpus: 2, config: {SYNC}, max_steps: 250}}}}
"""
KINDS = {"F1": SINGLE_CLASS, "F2": SINGLE_CLASS, "J1": SYNC_CLASS, "J2": SYNC_CLASS}


# slow (~110 s: Ray's start-up, a schedule of ~90 s on 20 Mbit/s links). Measured on a
# quiet machine (2026-11-29): each alone 759 / 753 samples/s, beside the other 379 / 383,
# learned link kept 0.505 (95% 0.501-0.508); the profile's 0.51 (0.49-0.55)
@pytest.mark.slow
def test_two_sync_jobs_on_one_shaped_link_are_learned_at_level_link(tmp_path):
    why = raycluster.unavailable()
    if why is not None:
        pytest.skip(why)
    t_test = time.monotonic()
    cluster_file = tmp_path / "link-nodes.yaml"
    cluster_file.write_text(TOPOLOGY)
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(JOBS)
    out = tmp_path / "out"
    with raycluster.ray_test_cluster(REPO, str(cluster_file)) as c:
        c.net.shape(RATE_MBIT)
        names = [h.name for h in c.net.hosts]
        r = c.net.hosts[0].run([sys.executable, "-m", "phalanx.cli", "schedule", "--jobs",
                                str(jobs), "--cluster", str(cluster_file), "--engine", "ray",
                                "--placement", "first-fit", "--ray-address", c.address,
                                "--out", str(out)], env=c.env(), cwd=REPO, timeout=300,
                               check=False)
    schedule_s = time.monotonic() - t_test
    assert r.returncode == 0, r.stdout + r.stderr
    # nothing left: no rank, no Ray process of ours (the cluster's teardown checks its own),
    # no namespace
    assert not pids_with(str(out)), "rank processes left behind"
    assert not set(names) & set(_netns()), _netns()

    rows = rows_of(out)
    assert all(rows[n]["status"] == "finished" for n in KINDS), rows
    # where first-fit put them (one start each): J1 across b, c; J2 across a, b (b's link
    # shared)
    topology = load_topology(cluster_file)
    servers = {n: [{topology.servers[topology.device_server[int(d)]].name
                    for d in p.split("@")[1].split(",")}
                   for p in rows[n]["placements"].split(";")] for n in ("J1", "J2")}
    assert servers == {"J1": [{"b", "c"}], "J2": [{"a", "b"}]}, rows
    seen = observe(out, topology, KINDS, links=True)
    for name in ("J1", "J2"):
        print(name, {k: (round(v.rate), round(v.span, 1)) for k, v in seen[name].items()})
    alone = ((), (), ())
    beside = ((), (SYNC_CLASS,), (SYNC_CLASS,))
    solo = {n: seen[n][alone].rate for n in ("J1", "J2")}
    paired = {n: seen[n][beside].rate for n in ("J1", "J2")}
    # each alone on its link runs at the link's rate, not slowed: the two agree, and each
    # is well above its rate beside the other
    assert 0.7 < solo["J1"] / solo["J2"] < 1.43, solo
    assert all(paired[n] < 0.8 * solo[n] for n in solo), (solo, paired)
    # a job on one server sends over no link: no link context of its own, nor as anyone's
    # link neighbour
    assert all(key[2] == () for n in ("F1", "F2") for key in seen.get(n, {})), seen
    assert all(SINGLE_CLASS not in key[2] for n in seen for key in seen[n]), seen

    table = load_table(out / "interference-learned.json")
    link = {(p.a, p.b): p for p in table.pairs if p.level == "link"}
    assert set(link) == {(SYNC_CLASS, SYNC_CLASS)}, table.pairs
    # J1 and J2 shared server b exactly while they shared its link: the whole load is the
    # link's, not split with a server pair by the fit's penalty (it was: 0.685 and 0.685)
    assert not [q for q in table.pairs if q.level != "link" and q.a == q.b == SYNC_CLASS]
    p = link[(SYNC_CLASS, SYNC_CLASS)]
    print(f"learned link kept {p.kept_a:.3f} (95% {p.kept_a_ci[0]:.3f}-{p.kept_a_ci[1]:.3f}, "
          f"{p.repeats} contexts); solo {solo}, beside {paired}; schedule {schedule_s:.0f} s")
    print(json.dumps([vars(q) for q in table.pairs], default=str))
    # the profile's 0.51 (0.49-0.55) at this rate, within a band for a busy machine
    assert 0.3 < p.kept_a < 0.75, p
    assert p.kept_a_ci[0] <= p.kept_a <= p.kept_a_ci[1], p


def _netns() -> list[str]:
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [ln.split()[0] for ln in listing.splitlines() if ln.split()]
