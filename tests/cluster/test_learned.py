"""Learned throughput (issue 23): the port of the Pollux artifact's ``fit_perf_params`` and
``GoodputFunction.optimize``, and the guard that an elastic policy on learned profiles
reads nothing a Pollux scheduler does not know."""

from dataclasses import replace

import numpy as np
import pytest
import scipy.optimize

from phalanx.cluster.core.view import JobView, UndeclaredRead
from phalanx.cluster.model.learned import (
    AppFacts,
    JobKnowledge,
    Learner,
    fixed_batch_config,
    optimize_batch,
)
from phalanx.cluster.model.perf import PerfModel
from phalanx.cluster.model.perf_fit import (
    PerfParams,
    _objective,
    fit_perf_params,
    predict_step_time,
)
from phalanx.cluster.model.profiles import load_pollux_apps
from phalanx.cluster.policies import make_ordering, make_placement
from phalanx.cluster.sim.interval import IntervalConfig, IntervalSimulator
from phalanx.cluster.sim.run import SimulateOptions, apply_preset, load_inputs, make_elastic

TRUE = PerfParams(0.05, 0.002, 0.3, 0.01, 0.04, 0.002, 2.0)
SETUPS = [(1, 1, 32), (1, 1, 128), (1, 4, 64), (1, 2, 32), (2, 8, 64), (4, 16, 32),
          (3, 12, 128), (2, 4, 128)]


def test_objective_gradient_matches_finite_differences():
    rng = np.random.default_rng(0)
    nodes, reps, atomic = (np.array(c) for c in zip(*SETUPS))
    acc = rng.uniform(0.05, 0.5, len(SETUPS))
    opt = acc + rng.uniform(0.01, 0.3, len(SETUPS))
    for _ in range(4):
        x = np.r_[rng.uniform(0.01, 0.5, 6), rng.uniform(1.0, 3.0)]
        f, g = _objective(x, nodes, reps, atomic.astype(float), acc, opt)
        num = scipy.optimize.approx_fprime(
            x, lambda y: _objective(y, nodes, reps, atomic.astype(float), acc, opt)[0], 1e-7)
        assert np.allclose(g, num, rtol=1e-3, atol=1e-4), (g, num)


# what the artifact's own fit_perf_params (simulator/goodput.py, with autograd) returns
# on the observations below, run once for this test: L-BFGS-B from its start point stops
# at gamma 1.2 (the truth is 2), so its predictions are off by up to 18% in sample
ARTIFACT_FIT = PerfParams(0.049999998448459315, 0.0020000000205034193, 0.037117505494555836,
                          0.027058354750512693, 0.0265922675098304, 1e-08, 1.1969767938530507)


def test_fit_is_the_artifacts():
    """Observations made by a known model: our fit predicts what the artifact's fit
    predicts (to 1e-4) at the observed set-ups and at unseen ones, local minimum included."""
    nodes, reps, atomic = (np.array(c, dtype=float) for c in zip(*SETUPS))
    step = predict_step_time(TRUE, nodes, reps, atomic)
    compute = TRUE.alpha_c + TRUE.beta_c * atomic
    fit = fit_perf_params(nodes, reps, atomic, compute, step)
    for n, r, a in SETUPS + [(1, 3, 96), (5, 20, 64), (8, 32, 32)]:
        want = float(predict_step_time(ARTIFACT_FIT, n, r, a))
        assert float(predict_step_time(fit, n, r, a)) == pytest.approx(want, rel=1e-4)
    assert float(predict_step_time(fit, 2, 8, 64)) != pytest.approx(
        float(predict_step_time(TRUE, 2, 8, 64)), rel=0.1)


def test_fit_pins_what_no_observation_informs():
    """One per-GPU batch: alpha_c is half the compute time; one node only: the inter-node
    terms are at least 1.1x the intra-node ones; nothing above 2 GPUs: no retrogression."""
    fit = fit_perf_params(np.array([1, 1]), np.array([1, 2]), np.array([64.0, 64.0]),
                          np.array([0.2, 0.2]), np.array([0.2, 0.25]))
    assert fit.alpha_c == pytest.approx(0.1)
    assert fit.alpha_n == pytest.approx(1.1 * fit.alpha_r) and fit.alpha_r > 0.01
    assert fit.beta_r == pytest.approx(1e-8) and fit.beta_n == pytest.approx(1.1e-8)


@pytest.fixture(scope="module")
def apps(data_dir):
    return load_pollux_apps(data_dir)


def test_batch_rules_follow_the_artifact(apps):
    """ncf at 32,768 on one GPU accumulates (the artifact's forced step); the optimizer
    never runs one GPU above the initial batch without accumulating."""
    ncf = AppFacts.of(apps["ncf"])
    cfg = fixed_batch_config(ncf, 1, 32768)
    assert cfg.accum >= 1 and cfg.batch >= 32768
    assert cfg == apps["ncf"].batch_config(1, 32768)
    for name in ("cifar10", "bert", "imagenet"):
        f = AppFacts.of(apps[name])
        good, atomic, accum = optimize_batch(TRUE, (1.0, 50.0), f, np.array([1, 1, 2]),
                                             np.array([1, 4, 8]))
        assert good.min() > 0
        b1 = atomic[0] * (accum[0] + 1)
        assert b1 == f.init_batch or accum[0] >= 1
        assert f.min_local_bsz <= atomic.min() and atomic.max() <= f.max_local_bsz


def test_knowledge_grows_by_twice_what_was_run(apps):
    k = JobKnowledge(AppFacts.of(apps["cifar10"]))
    assert k.growth_cap() == 1 and k.params is None
    with pytest.raises(ValueError, match="no observation"):
        k.predict(1, 1, 64)
    assert k.observe(1, 1, 128, 0.1, 0.001) and not k.observe(1, 1, 128, 0.2, 0.001)
    assert k.profile[(1, 1, 128.0)] == (0.1, 0.001)          # the first measure stays
    k.observe(4, 1, 128, 0.12, 0.02)
    assert k.growth_cap() == 8 and k.fits == 2
    with pytest.raises(ValueError, match="sync_time"):
        k.observe(8, 2, 128, 0.1, 0.2)


# ------------------------------------------------------------------ the information guard

FACT_FIELDS = {"name", "init_batch", "max_batch", "min_local_bsz", "max_local_bsz", "epochs"}


class Trap:
    """An application that gives the declared facts and raises on anything else (the
    measured step times, the gradient statistics, the work)."""

    def __init__(self, app):
        self._app = app

    def __getattr__(self, name):
        if name in FACT_FIELDS:
            return getattr(self._app, name)
        raise AssertionError(f"policy read {name} of the true profile")


class WatchedLearner(Learner):
    """Records every observation, to check each was a set-up the job ran."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.seen = []

    def observe(self, jid, app, gpus, nodes, batch, step_time, sync_time, grad):
        self.seen.append((jid, gpus, nodes))
        super().observe(jid, app, gpus, nodes, batch, step_time, sync_time, grad)


@pytest.fixture(scope="module")
def short_inputs(data_dir):
    # 12 jobs (cifar10, ncf, imagenet: the models of the first 24): 24 took 56 s of the
    # suite at load 9
    opts = SimulateOptions.from_dict(apply_preset("pollux-artifact", {
        "trace": "pollux:2", "limit": 12, "data_dir": data_dir, "ordering": "goodput"}))
    return opts, load_inputs(opts)


def _run_guarded(opts, inputs):
    trapped = PerfModel(inputs.perf.profiles,
                        {k: Trap(v) for k, v in inputs.perf.pollux.items()})
    pol = make_elastic(opts, replace(inputs, perf=trapped))
    # goodput: one learner per GPU type (one type here); pollux: one learner
    owner, key = (pol.tl.by_type, "v100") if hasattr(pol, "tl") else (vars(pol), "learner")
    old = owner[key]
    pol.learner = owner[key] = WatchedLearner(dict(old.facts), old.share, old.growth,
                                              old.gammas)
    sim = IntervalSimulator(inputs.topology, inputs.trace.jobs, make_ordering("fifo"),
                            make_placement("pack"), inputs.perf,
                            config=IntervalConfig(check_invariants=True), elastic=pol)
    return pol, sim.run()


@pytest.mark.parametrize("policy, priority", [("goodput", "none"), ("goodput", "las"),
                                              ("pollux", "none")])
def test_learned_policies_read_only_what_pollux_knows(short_inputs, policy, priority):
    """The policy gets trapped applications (facts only), no remaining work, and
    observations only of set-ups its jobs ran; every job finishes, each first ran on one
    node (goodput: up to ``typed.start`` GPUs, nothing known yet; pollux: one GPU) and
    ncf never on more than one."""
    opts, inputs = short_inputs
    opts = opts.merged({"ordering": policy, "goodput": {"priority": priority},
                        "pollux": {"generations": 3}})
    pol, res = _run_guarded(opts, inputs)
    assert not pol.uses_remaining
    assert len(res.jobs) == 12 and all(j.end > j.submit for j in res.jobs)
    ran = {(j.spec.id, len(d)) for j in res.jobs for _, d in j.placements}
    assert pol.learner.seen and {(jid, g) for jid, g, _ in pol.learner.seen} <= ran
    first = {len(j.placements[0][1]) for j in res.jobs}
    assert first <= ({1, 2, 4} if policy == "goodput" else {1})
    assert policy == "pollux" or first - {1}       # the start prior is used
    for j in res.jobs:
        if j.spec.model == "ncf":
            assert all(len(d) == 1 for _, d in j.placements)


def test_the_guard_catches_a_leak(short_inputs):
    """A policy that reads remaining work under ``none`` fails; so does reading a true
    step time through the trapped application."""
    opts, inputs = short_inputs
    view = JobView(0, "bert", 0.0, 0, None, 0, 0.0)
    with pytest.raises(UndeclaredRead, match="does not declare it"):
        _ = view.remaining
    with pytest.raises(AssertionError, match="read throughput"):
        Trap(inputs.perf.pollux["bert"]).throughput((1,), 12)

    class Leaky(type(make_elastic(opts, inputs))):
        def allocate(self, jobs, capacity, now, **kw):
            sum(j.remaining for j in jobs)
            return super().allocate(jobs, capacity, now, **kw)

    pol = make_elastic(opts, inputs)
    pol.__class__ = Leaky
    sim = IntervalSimulator(inputs.topology, inputs.trace.jobs, make_ordering("fifo"),
                            make_placement("pack"), inputs.perf, elastic=pol)
    with pytest.raises(UndeclaredRead):
        sim.run()
