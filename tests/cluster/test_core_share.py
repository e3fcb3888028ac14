"""``core_share``: the slowdown of CPU jobs whose ranks outnumber their machine's cores, and
its use by the goodput policy (fitted on per-core times, predicting with the
slowdown of the set-up asked about)."""

import numpy as np
import pytest

from phalanx.cluster.core.topology import uniform
from phalanx.cluster.core.view import JobView
from phalanx.cluster.model.core_share import CoreShare
from phalanx.cluster.model.learned import AppFacts
from phalanx.cluster.policies.catalog import ELASTIC, ElasticInputs


@pytest.fixture
def three():
    return uniform(1, 1, 3, 2)   # 3 servers of 2 devices


def test_one_machine_pools_every_server(three):
    cs = CoreShare.this_machine(three, cores=2)
    assert cs.demand([(0, 1), (1, 2), (2, 1)]) == [4]
    # 4 ranks on 2 cores: twice as slow, wherever the job's own ranks are
    assert cs.slowdown({0}, [4]) == 2.0
    assert cs.slowdown({0}, [2]) == 1.0 and cs.slowdown({0}, [1]) == 1.0   # never faster
    assert cs.predict(4, {0: 0}, 2) == 2.0
    assert cs.predict(1, {0: 2}, 2) == 1.5      # beside 2 ranks of other jobs
    assert cs.predict(2, {}, 2) == 1.0


def test_per_server_machines_fill_the_least_crowded_first(three):
    cs = CoreShare(host=(0, 1, 2), cores=(2, 2, 1))
    assert cs.demand([(0, 1), (2, 2), (0, 1)]) == [2, 0, 2]
    # the job's most crowded machine sets its pace
    assert cs.slowdown({0, 2}, [2, 0, 2]) == 2.0
    assert cs.slowdown({1}, [2, 0, 2]) == 1.0
    # 2 ranks, 2 per server: the empty 2-core machine takes both
    assert cs.predict(2, {0: 2, 1: 0, 2: 0}, 2) == 1.0
    # 6 ranks: every machine gets 2 (the 1-core one is then 2x crowded)
    assert cs.predict(6, {}, 2) == 2.0


def _policy(slowdown):
    """The goodput policy as the catalog builds it on one 4-slot machine of one type."""
    facts = {"j": AppFacts("j", init_batch=64, max_batch=512, min_local_bsz=32,
                           max_local_bsz=128, epochs=1)}
    pol = ELASTIC.get("goodput")(ElasticInputs(
        cluster="one", server_sizes=(4,), server_types=("cpu",), apps=facts,
        measured=False, restart_s=1.0, slowdown=slowdown))
    # a job seen at 1 and 2 GPUs: compute-bound, cheap sync, so the model scales it well
    for gpus, step, sync in ((1, 0.010, 0.0), (2, 0.011, 0.001)):
        pol.learner_for("cpu").observe(0, "j", gpus, 1, 64, step, sync, (1.0, 1.0))
    return pol


def test_the_policy_sees_what_crowded_cores_cost():
    view = [JobView(0, "j", 0.0, 0, None, 2, 10.0)]
    free = _policy(None).allocate(view, 4, 0.0)[0].gpus
    # 2 cores for 4 slots: 4 ranks run at half speed, so 4 GPUs buy nothing over 2
    crowded = _policy(lambda jid, n: max(1.0, n / 2)).allocate(view, 4, 0.0)[0].gpus
    assert free == 4 and crowded == 2
    one, gpus = np.ones(2), np.array([2.0, 4.0])
    speed = _policy(lambda jid, n: max(1.0, n / 2))._raw(view[0], "cpu", one, gpus)
    unshared = _policy(None)._raw(view[0], "cpu", one, gpus)
    assert speed[0] == pytest.approx(unshared[0])
    assert speed[1] == pytest.approx(unshared[1] / 2)
    assert np.isfinite(speed).all() and unshared[1] > unshared[0] > 0


def test_a_type_of_mixed_server_sizes_is_nodes_of_its_smallest():
    """A live cluster file may mix server sizes within one type: the goodput policy offers
    that type as nodes of its smallest server (no GPU promised that is not there), and
    still allocates (it once refused such a cluster in one line)."""
    from phalanx.cluster.policies.typed_base import cluster_types

    assert [(t.name, t.node_gpus, t.nodes) for t in cluster_types(
        [("cpu", 2), ("cpu", 4), ("cpu", 2), ("none", 0)])] == [("cpu", 2, 4)]
    facts = {"j": AppFacts("j", init_batch=64, max_batch=512, min_local_bsz=32,
                           max_local_bsz=128, epochs=1)}
    pol = ELASTIC.get("goodput")(ElasticInputs(
        cluster="mixed", server_sizes=(2, 4), server_types=("cpu", "cpu"), apps=facts,
        measured=False, restart_s=1.0))
    assert {g for _, _, g in pol.configs} == {1, 2, 4, 6}
    got = pol.allocate([JobView(0, "j", 0.0, 0, None, 0, 0.0)], 6, 0.0)[0]
    assert 1 <= got.gpus <= 2   # nothing fitted: one node's worth at most (start 4 > 2)
