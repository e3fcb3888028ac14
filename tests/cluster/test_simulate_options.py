"""SimulateOptions in sections (issue 48): each policy's or model's options are one frozen
section that checks itself; an unknown key, at the top or inside a section, is a one-line
error naming it; presets and studies merge sections field by field."""

from dataclasses import fields

import pytest

from phalanx.cluster.model.perf import PerfOptions
from phalanx.cluster.policies.goodput import GoodputOptions
from phalanx.cluster.policies.goodput_typed import TypedOptions
from phalanx.cluster.sim.run import (
    PRESETS,
    SECTIONS,
    SimulateOptions,
    apply_preset,
    scaled_interference,
)
from phalanx.errors import ConfigError


def test_no_flat_prefixed_fields_are_left():
    names = [f.name for f in fields(SimulateOptions)]
    assert not [n for n in names if n.startswith(("goodput_", "typed_", "pollux_"))]
    assert set(SECTIONS) <= set(names)
    opts = SimulateOptions()
    for key, cls in SECTIONS.items():
        assert isinstance(getattr(opts, key), cls)


@pytest.mark.parametrize(("given", "named"), [
    ({"goodput_share": True}, "options: unknown key 'goodput_share'"),
    # the learned goodput policy's section was folded into typed (one goodput policy)
    ({"learned": {"share": True}}, "options: unknown key 'learned'"),
    ({"typed": {"shared": True}}, "options.typed: unknown key 'shared'"),
    ({"typed": {"horizon_s": 900.0}}, "options.typed: unknown key 'horizon_s'"),
])
def test_an_unknown_key_is_one_line_naming_it(given, named):
    with pytest.raises(ConfigError, match=named) as e:
        SimulateOptions.from_dict(given)
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match=named):
        SimulateOptions().merged(given)


@pytest.mark.parametrize(("given", "named"), [
    ({"goodput": {"priority": "fair"}}, "--goodput-priority fair: unknown"),
    ({"goodput": {"horizon_s": 0.0}}, "--goodput-horizon must be"),
    ({"pollux": {"search": "random"}}, "--pollux-search random: unknown"),
    ({"typed": {"p": 0.5}}, "p must be < 0"),
    ({"placing": {"threshold": 2.0}}, "--threshold must be in"),
    ({"perf": {"k_switch": float("inf")}}, "interference weights must be finite"),
])
def test_each_section_checks_itself(given, named):
    with pytest.raises(ConfigError, match=named):
        SimulateOptions.from_dict(given)


def test_a_section_must_be_its_class():
    with pytest.raises(ConfigError, match="section goodput must be a GoodputOptions"):
        SimulateOptions(goodput={"priority": "las"})  # type: ignore[arg-type]


def test_presets_and_changes_merge_a_section_field_by_field():
    merged = apply_preset("sia-artifact", {"perf": {"k_switch": 0.6}, "ordering": "goodput"})
    assert merged["perf"] == {"interference": False, "k_switch": 0.6}
    assert PRESETS["sia-artifact"]["perf"] == {"interference": False}   # not mutated
    opts = SimulateOptions.from_dict(merged)
    assert opts.perf == PerfOptions(interference=False, k_switch=0.6)
    changed = opts.merged({"goodput": {"priority": "las"}, "typed": {"p": -0.5}})
    assert changed.goodput == GoodputOptions(priority="las")
    assert changed.typed == TypedOptions(p=-0.5)
    assert changed.perf == opts.perf and opts.goodput == GoodputOptions()


def test_interference_scale_maps_into_the_perf_section():
    assert scaled_interference(1.0) == PerfOptions()
    assert scaled_interference(2.0) == PerfOptions(k_switch=0.6, k_server=0.2)
    with pytest.raises(ConfigError, match="--interference-scale must be a finite number"):
        scaled_interference(-1.0)
