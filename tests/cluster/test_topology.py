"""Configuration sets: YAML validation with precise errors, generators, the Alibaba
importer on the real inventory."""

import pytest
import yaml

from phalanx.cluster.core.cluster_file import load_topology, save_topology, topology_from_mapping
from phalanx.cluster.core.clusters import import_alibaba, philly_2048, pollux_64, resolve_cluster
from phalanx.cluster.core.topology import uniform
from phalanx.errors import ConfigError, DataError

GOOD = {
    "name": "demo",
    "device_types": [{"name": "v100", "speed": 1.0}, {"name": "k80", "speed": 0.3}],
    "zones": [{"name": "ib0", "racks": [
        {"name": "r", "repeat": 2, "servers": [
            {"name": "s", "repeat": 3, "device_type": "v100", "devices": 8,
             "pcie_switches": [4, 4], "cpu_cores": 32}]}]},
        {"name": "ib1", "racks": [{"name": "old", "servers": [
            {"name": "k", "device_type": "k80", "devices": 4, "cpu_cores": 16}]}]}],
}


def test_yaml_builds_dense_ids():
    t = topology_from_mapping(GOOD)
    assert (len(t.zones), len(t.racks), len(t.servers), t.num_devices) == (2, 3, 7, 52)
    assert t.num_switches == 6 * 2 + 1
    assert t.device_server[:9] == [0] * 8 + [1]
    assert t.device_switch[:9] == [0] * 4 + [1] * 4 + [2]
    assert t.rack_zone == [0, 0, 1] and t.server_rack[-1] == 2
    assert t.zone_size == [48, 4] and t.servers[-1].device_type == "k80"


def test_yaml_roundtrip(tmp_path):
    t = topology_from_mapping(GOOD)
    save_topology(t, tmp_path / "c.yaml")
    t2 = load_topology(tmp_path / "c.yaml")
    assert t2.device_switch == t.device_switch and t2.rack_zone == t.rack_zone
    assert [s.name for s in t2.servers] == [s.name for s in t.servers]


@pytest.mark.parametrize("edit, message", [
    (lambda d: d["zones"][0]["racks"][0]["servers"][0].update(devices=6),
     r"zones\[0\].racks\[0\].servers\[0\].pcie_switches: \[4, 4\] holds 8 devices "
     r"but devices is 6"),
    (lambda d: d["zones"][0]["racks"][0]["servers"][0].update(device_type="h100"),
     r"device_type: 'h100' is not one of"),
    (lambda d: d["zones"][0]["racks"][0]["servers"][0].update(cpu_cores=-1),
     r"cpu_cores: must be a finite number > 0"),
    (lambda d: d["zones"][0]["racks"][0]["servers"][0].update(gpus=3), r"unknown key\(s\) gpus"),
    (lambda d: d["zones"][1].update(racks=[]), r"zones\[1\].racks: expected a non-empty list"),
    (lambda d: d["zones"][0]["racks"][0]["servers"][0].update(devices="eight"),
     r"devices: expected int"),
    (lambda d: d["zones"][1].update(name="ib0"), r"duplicate name 'ib0'"),
    # an emulated type's slowdown: finite, at least 1 (a type cannot be emulated faster)
    (lambda d: d["device_types"][1].update(slowdown=0.5),
     r"c.yaml: device_types\[1\].slowdown: must be a finite number in 1..1000, got 0.5"),
    (lambda d: d["device_types"][1].update(slowdown=float("inf")), r"slowdown: must be"),
    (lambda d: d["device_types"][1].update(slowdown=float("nan")), r"slowdown: must be"),
    (lambda d: d["device_types"][1].update(slowdown="x"), r"slowdown: expected float"),
])
def test_yaml_errors_name_the_entry(edit, message):
    d = yaml.safe_load(yaml.safe_dump(GOOD))
    edit(d)
    with pytest.raises(ConfigError, match=message):
        topology_from_mapping(d, source="c.yaml")


def test_slowdown_roundtrips_and_a_gang_runs_on_one_type(tmp_path):
    d = yaml.safe_load(yaml.safe_dump(GOOD))
    d["device_types"][1]["slowdown"] = 3
    t = topology_from_mapping(d)
    assert t.device_types["k80"].slowdown == 3.0 and t.device_types["v100"].slowdown == 1.0
    save_topology(t, tmp_path / "c.yaml")
    assert load_topology(tmp_path / "c.yaml").device_types["k80"].slowdown == 3.0
    assert t.typed and t.gang_type([0, 1]) == "v100" and t.gang_type([51]) == "k80"
    with pytest.raises(ConfigError, match="a gang across device types k80, v100 is refused"):
        t.gang_type([0, 51])


def test_bad_yaml_file(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("zones: [\n")
    with pytest.raises(ConfigError, match="invalid YAML at line"):
        load_topology(p)
    with pytest.raises(ConfigError, match="cannot read"):
        load_topology(tmp_path / "missing.yaml")


def test_generators():
    t = philly_2048()
    assert t.num_devices == 2048 and len(t.zones) == 2 and len(t.servers) == 256
    assert pollux_64().num_devices == 64 and len(pollux_64().servers) == 16
    assert resolve_cluster("uniform:1,2,3,4,2", None).num_switches == 12
    with pytest.raises(ConfigError, match="do not split evenly"):
        uniform(devices=6, switches=4)
    with pytest.raises(ConfigError, match="not a known cluster"):
        resolve_cluster("nope", None)


def test_alibaba_inventory(data_dir):
    t = import_alibaba(data_dir / "alibaba-openb" / "openb_node_list_gpu_node.csv")
    assert len(t.servers) == 1213 and t.num_devices == 6212
    assert sorted(t.device_types) == ["A10", "G2", "G3", "P100", "T4", "V100M16", "V100M32"]
    # one zone per GPU model, so a zone never mixes device types
    for z in t.zones:
        types = {t.servers[s].device_type for r in z.racks for s in t.racks[r].servers}
        assert types == {z.name}


def test_alibaba_bad_row(tmp_path):
    p = tmp_path / "nodes.csv"
    p.write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,2,P100\nn1,x,1,2,T4\n")
    with pytest.raises(DataError, match="line 3"):
        import_alibaba(p)
