"""Every consistency model in the registry (phalanx.ps.consistency.MODELS) keeps the
contract the shard relies on; a new model is checked by being listed there."""

from __future__ import annotations

import dataclasses
import random

import pytest

from phalanx.config import RunConfig
from phalanx.errors import ConfigError
from phalanx.ps.consistency import MODELS, Consistency, make_consistency, model_class

FIELDS = {f.name for f in dataclasses.fields(RunConfig)}


def build(name: str) -> Consistency:
    return make_consistency(name, RunConfig(workers=4, staleness=2, softsync=2))


@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_model_is_built_from_its_settings(name: str) -> None:
    model = build(name)
    assert isinstance(model, MODELS[name]) and model.name.startswith(name)
    assert set(model.options) <= FIELDS  # the settings it reads are RunConfig fields


@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_slowest_worker_may_always_go_on(name: str) -> None:
    model = build(name)
    for clock in range(6):
        assert model.admits(clock, clock)  # else the slowest worker would deadlock the run


@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_full_buffer_is_applied_and_an_empty_one_is_not(name: str) -> None:
    model = build(name)
    active = [0, 1, 2, 3]
    assert model.ready(active, active)
    assert not model.ready([], active)
    # fewer live workers than a model waits for never stalls it
    assert model.ready([2], [2])


@pytest.mark.parametrize("name", sorted(MODELS))
def test_updates_count_between_one_per_step_and_one_per_push(name: str) -> None:
    model = build(name)
    for workers, pushes in ((1, 1), (4, 10), (3, 7)):
        assert pushes <= model.updates(workers, pushes) <= workers * pushes


@pytest.mark.parametrize("name", sorted(MODELS))
def test_random_arrivals_never_deadlock(name: str) -> None:
    """Workers push in a random order, each admitted only when the model says so; the
    shard applies its buffer when ready. Every worker reaches the last clock."""
    model, rng, workers, last = build(name), random.Random(7), 4, 20
    clocks, buffer = [0] * workers, []
    pending = set(range(workers))  # workers that were admitted and will push
    for _ in range(10_000):
        if min(clocks) == last:
            break
        ready_to_push = [w for w in pending if clocks[w] < last]
        assert ready_to_push, f"{name}: no worker can push at clocks {clocks}"
        w = rng.choice(ready_to_push)
        pending.discard(w)
        buffer.append(w)
        clocks[w] += 1
        active = [v for v in range(workers) if clocks[v] < last] or list(range(workers))
        if model.ready(buffer, active):
            buffer = []
        slowest = min(clocks)
        pending |= {v for v in range(workers)
                    if v not in pending and v not in buffer and clocks[v] < last
                    and model.admits(clocks[v], slowest)}
    assert min(clocks) == last, f"{name}: stalled at clocks {clocks}"


def test_an_unknown_model_is_one_line() -> None:
    with pytest.raises(ConfigError) as e:
        model_class("eventual")
    assert str(e.value) == "--consistency: 'eventual' is not one of bsp, asp, ssp, softsync"


def test_the_smallest_bounds_are_allowed_and_below_them_refused() -> None:
    from phalanx.ps.consistency import SoftSynchronous, StaleSynchronous

    assert StaleSynchronous(0).admits(0, 0) and not StaleSynchronous(0).admits(1, 0)
    assert SoftSynchronous(1).ready([0], [0, 1])
    with pytest.raises(ValueError) as e:
        StaleSynchronous(-1)
    assert str(e.value) == "SSP bound must be >= 0"
    with pytest.raises(ValueError) as e:
        SoftSynchronous(0)
    assert str(e.value) == "SoftSync n must be >= 1"
