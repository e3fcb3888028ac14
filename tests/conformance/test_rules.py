"""Every update rule through one suite (as optax does for its optimizers), and every rule
that torch.optim also has against torch.optim over 100 steps."""

import math

import pytest
import torch

import phalanx.rules as R
from phalanx.config import RunConfig

# name -> (factory, needs_backup)
RULE_FACTORIES = {
    "sgd": lambda: R.sgd(0.1),
    "sgd_wd": lambda: R.sgd(0.1, weight_decay=0.01),
    "momentum": lambda: R.momentum(0.05, 0.9),
    "nesterov": lambda: R.momentum(0.05, 0.9, nesterov=True),
    "adagrad": lambda: R.adagrad(0.1),
    "rmsprop": lambda: R.rmsprop(0.01),
    "adam": lambda: R.adam(0.05),
    "adam_wd": lambda: R.adam(0.05, weight_decay=0.01),
    "adamw": lambda: R.adamw(0.05, weight_decay=0.1),
    "step_decay": lambda: R.sgd(R.step_decay_schedule(0.1, 10, 0.5)),
    "cosine_warmup": lambda: R.sgd(R.warmup(R.cosine_schedule(0.1, 100), 10)),
    "staleness_scaled_sgd": lambda: R.chain(R.staleness_scaled(), R.sgd(0.1)),
    "dc_asgd_c": lambda: R.chain(R.dc_asgd(0.5), R.sgd(0.1)),
    "dc_asgd_a": lambda: R.chain(R.dc_asgd(0.5, adaptive=True), R.sgd(0.1)),
}
NEEDS_BACKUP = {"dc_asgd_c", "dc_asgd_a"}


def _params(dtype=torch.float64):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(4, 3, generator=g, dtype=dtype), torch.randn(3, generator=g, dtype=dtype)]


def _extras(name, params):
    if name in NEEDS_BACKUP:
        return {"backup": [p.clone() - 0.01 for p in params], "staleness": 2}
    return {"staleness": 2}


@pytest.mark.parametrize("name", sorted(RULE_FACTORIES))
def test_shapes_and_purity(name):
    rule = RULE_FACTORIES[name]()
    params = _params()
    state = rule.init(params)
    grads = [torch.ones_like(p) for p in params]
    snapshot = ([p.clone() for p in params], [g.clone() for g in grads],
                [t.clone() for t in R.state_tensors(state)])
    u1, s1 = rule.update(grads, state, params, **_extras(name, params))
    u2, s2 = rule.update(grads, state, params, **_extras(name, params))
    assert [u.shape for u in u1] == [p.shape for p in params]
    # an update is a pure function of its inputs: the same call twice gives the same result
    for a, b in zip(u1, u2):
        assert torch.equal(a, b)
    for a, b in zip(R.state_tensors(s1), R.state_tensors(s2)):
        assert torch.equal(a, b)
    # ... and mutates none of them
    for before, after in zip(snapshot, (params, grads, R.state_tensors(state))):
        for a, b in zip(before, after):
            assert torch.equal(a, b)


# rules that must have an in-place path (the parameter server's hot path uses it)
IN_PLACE = {"sgd", "sgd_wd", "momentum", "step_decay", "cosine_warmup", "staleness_scaled_sgd",
            "adam", "adam_wd", "adamw"}


@pytest.mark.parametrize("name", sorted(RULE_FACTORIES))
def test_in_place_update_equals_the_functional_one_bit_for_bit(name):
    rule = RULE_FACTORIES[name]()
    assert (rule.update_ is not None) == (name in IN_PLACE)
    params = _params(torch.float32)
    g = torch.Generator().manual_seed(1)
    ref_state, own_state = rule.init(params), rule.init(params)
    for step in range(5):  # several steps: a state updated in place must stay right
        grads = [torch.randn(p.shape, generator=g) for p in params]
        extras = {**_extras(name, params), "staleness": step}
        ref, ref_state = rule.update([t.clone() for t in grads], ref_state, params, **extras)
        mine = [t.clone() for t in grads]
        out, own_state = R.update_owned(rule, mine, own_state, params, **extras)
        for a, b in zip(ref, out):
            assert torch.equal(a, b)
        for a, b in zip(R.state_tensors(ref_state), R.state_tensors(own_state)):
            assert torch.equal(a, b)
        # the update never aliases the state: applying it cannot move the optimizer state
        state_ptrs = {t.data_ptr() for t in R.state_tensors(own_state) if t.dim()}
        assert not state_ptrs & {u.data_ptr() for u in out}
        R.apply_updates(params, ref)


@pytest.mark.parametrize("name", sorted(RULE_FACTORIES))
def test_descends_a_quadratic(name):
    rule = RULE_FACTORIES[name]()
    params = _params()
    state = rule.init(params)
    loss0 = sum((p * p).sum().item() for p in params) / 2
    for _ in range(60):
        grads = [p.clone() for p in params]  # gradient of ||w||^2 / 2
        extras = _extras(name, params)
        if name in NEEDS_BACKUP:
            extras["backup"] = [p.clone() for p in params]
        updates, state = rule.update(grads, state, params, **extras)
        R.apply_updates(params, updates)
    loss = sum((p * p).sum().item() for p in params) / 2
    assert math.isfinite(loss) and loss < 0.5 * loss0


@pytest.mark.parametrize("name", sorted(NEEDS_BACKUP))
def test_dc_asgd_needs_backup(name):
    rule = RULE_FACTORIES[name]()
    params = _params()
    with pytest.raises(ValueError, match="backup"):
        rule.update([torch.ones_like(p) for p in params], rule.init(params), params)


def test_dc_asgd_formula_and_lambda_zero():
    w, b, g = torch.tensor([1.0, 2.0]), torch.tensor([0.5, 2.5]), torch.tensor([2.0, -1.0])
    rule = R.dc_asgd(0.1)
    (u,), _ = rule.update([g], rule.init([w]), [w], backup=[b])
    assert torch.allclose(u, g + 0.1 * g * g * (w - b))
    zero = R.dc_asgd(0.0)
    (u0,), _ = zero.update([g], zero.init([w]), [w], backup=[b])
    assert torch.equal(u0, g)


def test_dc_asgd_adaptive_formula():
    w, b, g = torch.tensor([1.0]), torch.tensor([0.0]), torch.tensor([3.0])
    rule = R.dc_asgd(0.2, adaptive=True, momentum=0.5, eps=0.0)
    (u,), state = rule.update([g], rule.init([w]), [w], backup=[b])
    ms = 0.5 * 9.0
    ms_hat = ms / (1 - 0.5)  # bias-corrected, as Adam: the first step sees g*g itself
    assert torch.allclose(u, g + (0.2 / ms_hat**0.5) * g * g * (w - b))
    assert torch.allclose(state.mean_sq[0], torch.tensor([ms]))
    g2 = torch.tensor([1.0])
    (u2,), state = rule.update([g2], state, [w], backup=[b])
    ms2 = 0.5 * ms + 0.5 * 1.0
    assert torch.allclose(u2, g2 + (0.2 / (ms2 / (1 - 0.25)) ** 0.5) * g2 * g2 * (w - b))


def test_staleness_scaling():
    rule = R.staleness_scaled()
    (u,), _ = rule.update([torch.tensor([4.0])], rule.init([]), staleness=4)
    assert u.item() == 1.0
    (u,), _ = rule.update([torch.tensor([4.0])], rule.init([]), staleness=0)
    assert u.item() == 4.0


TORCH_EQUIVALENTS = {
    "sgd": (lambda: R.sgd(0.1, 0.01), lambda p: torch.optim.SGD(p, lr=0.1, weight_decay=0.01)),
    "momentum": (lambda: R.momentum(0.1, 0.9), lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)),
    "nesterov": (lambda: R.momentum(0.1, 0.9, nesterov=True),
                 lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True)),
    "adagrad": (lambda: R.adagrad(0.1), lambda p: torch.optim.Adagrad(p, lr=0.1)),
    "rmsprop": (lambda: R.rmsprop(0.01), lambda p: torch.optim.RMSprop(p, lr=0.01)),
    "adam": (lambda: R.adam(0.01, weight_decay=0.001),
             lambda p: torch.optim.Adam(p, lr=0.01, weight_decay=0.001)),
    "step_decay": (lambda: R.sgd(R.step_decay_schedule(0.1, 30, 0.5)), None),
    # defaults left to both sides, weight decay on, and small gradients so eps matters
    "momentum_defaults_wd": (lambda: R.momentum(0.05, weight_decay=0.01),
                             lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9,
                                                       weight_decay=0.01)),
    "adagrad_wd": (lambda: R.adagrad(0.1, weight_decay=0.01),
                   lambda p: torch.optim.Adagrad(p, lr=0.1, weight_decay=0.01)),
    "rmsprop_wd": (lambda: R.rmsprop(0.01, weight_decay=0.01),
                   lambda p: torch.optim.RMSprop(p, lr=0.01, weight_decay=0.01)),
    "adam_defaults": (lambda: R.adam(0.01), lambda p: torch.optim.Adam(p, lr=0.01)),
    "adamw": (lambda: R.adamw(0.01, weight_decay=0.1),
              lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1)),
    "adamw_defaults": (lambda: R.adamw(0.01), lambda p: torch.optim.AdamW(p, lr=0.01)),
    "adagrad_tiny": (lambda: R.adagrad(0.1), lambda p: torch.optim.Adagrad(p, lr=0.1)),
    "rmsprop_tiny": (lambda: R.rmsprop(0.01), lambda p: torch.optim.RMSprop(p, lr=0.01)),
}
# gradients of 1e-9 (and no weight decay to swamp them): eps shows
TINY = {"adam_defaults", "adagrad_tiny", "rmsprop_tiny"}


@pytest.mark.parametrize("name", sorted(n for n, (_, ref) in TORCH_EQUIVALENTS.items() if ref))
def test_matches_torch_optim(name):
    make_ours, make_ref = TORCH_EQUIVALENTS[name]
    ours = _params()  # float64: compare the formulas, not float32 rounding order
    theirs = [p.clone().requires_grad_() for p in ours]
    rule, opt = make_ours(), make_ref(theirs)
    state = rule.init(ours)
    g = torch.Generator().manual_seed(1)
    for _ in range(100):
        grads = [torch.randn(p.shape, generator=g, dtype=p.dtype) for p in ours]
        if name in TINY:
            grads = [1e-9 * x for x in grads]
        updates, state = rule.update(grads, state, ours)
        R.apply_updates(ours, updates)
        for p, gr in zip(theirs, grads):
            p.grad = gr.clone()
        opt.step()
    diff = max((a - b.detach()).abs().max().item() for a, b in zip(ours, theirs))
    assert diff <= 1e-6, f"{name}: max |ours - torch.optim| = {diff}"


def test_step_decay_matches_torch_steplr():
    ours = _params()  # float64: compare the formulas, not float32 rounding order
    theirs = [p.clone().requires_grad_() for p in ours]
    rule = R.sgd(R.step_decay_schedule(0.1, 30, 0.5))
    opt = torch.optim.SGD(theirs, lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, 30, 0.5)
    state = rule.init(ours)
    for _ in range(100):
        grads = [torch.ones_like(p) for p in ours]
        updates, state = rule.update(grads, state, ours)
        R.apply_updates(ours, updates)
        for p, gr in zip(theirs, grads):
            p.grad = gr.clone()
        opt.step()
        sched.step()
    assert max((a - b.detach()).abs().max().item() for a, b in zip(ours, theirs)) <= 1e-6


def test_cosine_and_warmup_schedules():
    cos = R.cosine_schedule(1.0, 100)
    assert cos(0) == 1.0 and abs(cos(50) - 0.5) < 1e-12 and cos(100) == 0.0 and cos(200) == 0.0
    w = R.warmup(R.constant_schedule(1.0), 4)
    assert [w(i) for i in range(5)] == [0.25, 0.5, 0.75, 1.0, 1.0]


@pytest.mark.parametrize("rule", R.RULES.names())
def test_make_rule_builds_every_named_rule(rule):
    cfg = RunConfig(rule=rule, schedule="cosine", warmup_steps=2, weight_decay=1e-4).validate()
    r = R.make_rule(cfg, total_steps=10, prefix=(R.staleness_scaled(),))
    params = _params()
    updates, _ = r.update([torch.ones_like(p) for p in params], r.init(params), params)
    assert all(torch.isfinite(u).all() for u in updates)


def test_rule_edges() -> None:
    """Empty parameter lists, the scale transform, integer step counters, nested state,
    omitted staleness, one-line misuse messages."""
    params = _params()
    for rule in (R.sgd(0.1), R.adam(0.1), R.momentum(0.1)):
        updates, _ = rule.update([], rule.init([]), [])
        assert updates == []
    (u,), _ = R.scale(-2.0).update([torch.ones(2)], R.scale(-2.0).init(params))
    assert torch.equal(u, torch.full((2,), -2.0))
    for rule in (R.sgd(R.step_decay_schedule(0.1, 2, 0.5)), R.adam(0.1)):
        counts = [t for t in R.state_tensors(rule.init(params)) if t.dim() == 0]
        assert counts and all(t.dtype == torch.int64 for t in counts)
    state = R.momentum(0.1).init(params)
    assert len(R.state_tensors(state)) >= len(params)  # nested: every momentum buffer
    g = [torch.ones_like(p) for p in params]
    rule = R.chain(R.staleness_scaled(), R.sgd(0.1))
    omitted, _ = rule.update(g, rule.init(params), params)
    fresh, _ = rule.update(g, rule.init(params), params, staleness=0)
    assert all(torch.equal(a, b) for a, b in zip(omitted, fresh))
    with pytest.raises(ValueError) as e:
        R.staleness_scaled().update(g, R.staleness_scaled().init(params), staleness=None)
    assert str(e.value) == "staleness_scaled needs staleness="
    with pytest.raises(ValueError) as e:
        R.sgd(0.1, weight_decay=0.1).update(g, R.sgd(0.1, weight_decay=0.1).init(params))
    assert str(e.value) == "add_decayed_weights needs params"


def test_dc_asgd_defaults() -> None:
    """The adaptive variant's defaults: momentum 0.95 of the mean square (bias-corrected),
    eps 1e-7 (gradients of 1e-4: g * g is below eps, so eps shows), over two steps."""
    params = [torch.tensor([1.0, 2.0], dtype=torch.float64)]
    backup = [torch.tensor([0.5, 1.0], dtype=torch.float64)]
    gs = [torch.tensor([1e-4, -2e-4], dtype=torch.float64),
          torch.tensor([3e-4, 1e-4], dtype=torch.float64)]
    rule = R.dc_asgd(0.5, adaptive=True)
    state, ms = rule.init(params), torch.zeros(2, dtype=torch.float64)
    for t, g in enumerate(gs, start=1):
        (u,), state = rule.update([g], state, params, backup=backup)
        ms = 0.95 * ms + 0.05 * g * g
        lam = 0.5 / torch.sqrt(ms / (1 - 0.95**t) + 1e-7)
        assert torch.allclose(u, g + lam * g * g * (params[0] - backup[0]), rtol=1e-12)


MAKE_RULE_REFS = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.1, weight_decay=0.01),
    "momentum": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.5, weight_decay=0.01),
    "nesterov": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.5, weight_decay=0.01,
                                          nesterov=True),
    "adagrad": lambda p: torch.optim.Adagrad(p, lr=0.1, weight_decay=0.01),
    "rmsprop": lambda p: torch.optim.RMSprop(p, lr=0.1, weight_decay=0.01),
    "adam": lambda p: torch.optim.Adam(p, lr=0.1, weight_decay=0.01),
    "adamw": lambda p: torch.optim.AdamW(p, lr=0.1, weight_decay=0.01),
}


@pytest.mark.parametrize("name", sorted(MAKE_RULE_REFS))
def test_make_rule_passes_every_setting(name: str) -> None:
    """--rule with --lr, --momentum and --weight-decay reach the rule: 20 steps against
    torch.optim with the same settings; --schedule cosine reaches it too."""
    cfg = RunConfig(rule=name, lr=0.1, momentum=0.5, weight_decay=0.01)
    ours = _params()
    theirs = [p.clone().requires_grad_() for p in ours]
    rule, opt = R.make_rule(cfg, 20), MAKE_RULE_REFS[name](theirs)
    state = rule.init(ours)
    g = torch.Generator().manual_seed(2)
    for _ in range(20):
        grads = [torch.randn(p.shape, generator=g, dtype=p.dtype) for p in ours]
        updates, state = rule.update(grads, state, ours)
        R.apply_updates(ours, updates)
        for p, gr in zip(theirs, grads):
            p.grad = gr.clone()
        opt.step()
    assert max((a - b.detach()).abs().max().item() for a, b in zip(ours, theirs)) <= 1e-6
    sched = R.make_schedule(RunConfig(lr=0.2, schedule="cosine"), 10)
    assert [sched(s) for s in (0, 5, 10)] == pytest.approx([0.2, 0.1, 0.0])


def test_an_unknown_rule_is_one_line() -> None:
    with pytest.raises(Exception) as e:
        R.make_rule(RunConfig(rule="lion", lr=0.1))
    assert str(e.value) == ("--rule: 'lion' is not one of sgd, momentum, nesterov, adagrad, "
                            "rmsprop, adam, adamw")


def test_schedule_and_dc_asgd_edges() -> None:
    cos = R.cosine_schedule(0.2, 1)
    assert (cos(0), cos(1)) == (0.2, 0.0)
    assert R.cosine_schedule(0.2, 0)(0) == 0.2
    floor = R.cosine_schedule(0.3, 10, final=0.1)
    assert [floor(s) for s in (0, 5, 10)] == pytest.approx([0.3, 0.2, 0.1])
    one = R.warmup(R.constant_schedule(0.5), 1)
    assert one(0) == 0.5 and R.warmup(R.constant_schedule(0.5), 2)(0) == 0.25
    params = _params()
    g = [torch.ones_like(p) for p in params]
    (u,), _ = R.sgd(0.1).update(g[:1], R.sgd(0.1).init(params[:1]))  # no params needed
    assert torch.equal(u, -0.1 * g[0])
    backup = [p - 1 for p in params]
    rule = R.dc_asgd(1.0)
    out, state = rule.update(g, rule.init(params), params, backup=backup)
    assert all(torch.equal(o, x + x * x * 1.0) for o, x in zip(out, g))  # w - b = 1
    assert state.count.dtype == torch.int64 and int(state.count) == 1
    zero = R.dc_asgd(0.0)
    _, state = zero.update(g, zero.init(params), params, backup=backup)
    assert int(state.count) == 0  # lam = 0: plain ASGD, nothing tracked
    with pytest.raises(ValueError) as e:
        rule.update(g, rule.init(params), params)
    assert str(e.value) == "dc_asgd needs params= and backup= (the worker's pulled weights)"


def test_adamw_decay_is_decoupled_not_l2():
    """AdamW's decay is not Adam's: with a zero gradient Adam's L2 term is normalised away
    by its own second moment (a step of ~lr), AdamW's shrinks p by exactly lr * wd * p."""
    p = [torch.tensor([2.0], dtype=torch.float64)]
    (u,), _ = R.adamw(0.1, weight_decay=0.5).update([torch.zeros(1, dtype=torch.float64)],
                                                     R.adamw(0.1, 0.5).init(p), p)
    assert u.item() == pytest.approx(-0.1 * 0.5 * 2.0, abs=1e-12)
    (u,), _ = R.adam(0.1, weight_decay=0.5).update([torch.zeros(1, dtype=torch.float64)],
                                                   R.adam(0.1, 0.5).init(p), p)
    assert u.item() == pytest.approx(-0.1, rel=1e-6)


@pytest.mark.parametrize("max_norm", [0.5, 3.0, 1e3])
def test_clip_by_global_norm_matches_torch(max_norm):
    """--clip-grad-norm: the global norm over every tensor, torch's formula, first in the
    chain (make_rule); a gradient inside the ball passes unchanged."""
    g = torch.Generator().manual_seed(5)
    grads = [torch.randn(3, 4, generator=g, dtype=torch.float64),
             torch.randn(7, generator=g, dtype=torch.float64)]
    theirs = [x.clone().requires_grad_() for x in grads]
    for t, x in zip(theirs, grads):
        t.grad = x.clone()
    torch.nn.utils.clip_grad_norm_(theirs, max_norm)
    rule = R.clip_by_global_norm(max_norm)
    ours, _ = rule.update(grads, rule.init(grads))
    for a, b in zip(ours, theirs):
        assert torch.allclose(a, b.grad, rtol=1e-12, atol=1e-15)
    total = torch.linalg.vector_norm(torch.cat([x.reshape(-1) for x in ours])).item()
    assert total <= max_norm * (1 + 1e-9)
    cfg = RunConfig(rule="sgd", lr=1.0, clip_grad_norm=max_norm)
    params = [torch.zeros_like(x) for x in grads]
    rule = R.make_rule(cfg)
    updates, _ = rule.update(grads, rule.init(params), params)
    for u, t in zip(updates, theirs):
        assert torch.allclose(u, -t.grad, rtol=1e-12, atol=1e-15)
