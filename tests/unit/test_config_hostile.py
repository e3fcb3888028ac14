"""Hostile configuration files and values: one ConfigError line each, quickly, never a
traceback or a message as large as the input (issue 18, cause 7 and 9)."""

import time

import pytest

from phalanx.config import RunConfig, load_config_file
from phalanx.errors import ConfigError


def laughs(levels: int = 9) -> str:
    """A YAML 'billion laughs' under a known key: 9**9 strings once expanded."""
    items = ['&a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    names = "abcdefghijklmnop"
    for i in range(1, levels):
        items.append(f"&{names[i]} [" + ",".join([f"*{names[i - 1]}"] * 9) + "]")
    return "model: [" + ", ".join(items) + "]\n"


def load(tmp_path, name: str, content: bytes | str) -> RunConfig:
    p = tmp_path / name
    p.write_bytes(content if isinstance(content, bytes) else content.encode())
    return RunConfig.from_mapping(load_config_file(str(p)), source=f"--config {p}").validate()


@pytest.mark.parametrize("name,content,match", [
    ("bin.yaml", b"\xff\xfe\x00\x01binary", "not UTF-8"),
    ("latin.json", b'{"model": "caf\xe9"}', "not UTF-8"),
    ("nul.json", b'{"model": "mlp"}\x00', "binary file"),
    ("keys.yaml", "1: 2\n", "setting names must be strings"),
    ("null.yaml", "null: 1\n", "setting names must be strings"),
    ("seed.yaml", "seed: 99999999999999999999\n", "--seed"),
    ("negseed.json", '{"seed": -1}', "--seed"),
    ("epochs.json", '{"epochs": 1e308}', "--epochs"),
    ("inf.yaml", "bucket_mb: .inf\n", "--bucket-mb"),
    ("intinf.yaml", "batch_size: .inf\n", "batch_size"),
    ("slow.yaml", "workers: 2\nslow_workers: {0: -5}\n", "--slow-workers"),
    ("slowinf.yaml", "workers: 2\nslow_workers: {0: .inf}\n", "--slow-workers"),
    ("big.json", "{" + '"model": "mlp",' * 100_000 + '"data": "synthetic"}', "larger than"),
])
def test_bad_config_file_is_one_line(tmp_path, name, content, match):
    with pytest.raises(ConfigError, match=match) as e:
        load(tmp_path, name, content)
    assert "\n" not in str(e.value) and len(str(e.value)) < 400


def test_yaml_bomb_under_a_known_key_is_refused_fast_and_small(tmp_path):
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match="model") as e:
        load(tmp_path, "bomb.yaml", laughs())
    assert time.perf_counter() - t0 < 5
    assert len(str(e.value)) < 400


@pytest.mark.parametrize("field,value", [
    ("seed", 2**64), ("epochs", float("inf")), ("bucket_mb", float("inf")),
    ("lr", 1e300), ("ps_timeout", float("nan")), ("stages", 10**9), ("microbatches", 2**40),
])
def test_absurd_values_are_refused_like_nan(field, value):
    with pytest.raises(ConfigError, match="--" + field.replace("_", "-")):
        RunConfig(**{field: value}).validate()
