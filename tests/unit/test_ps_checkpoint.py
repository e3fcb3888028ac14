"""Shard checkpoints: a round trip restores the whole shard; `phalanx train --resume DIR`
refuses a missing, corrupt, truncated or foreign checkpoint with one line and exit 2,
before any process starts, and leaves DIR untouched."""

import hashlib
import json
from pathlib import Path

import pytest
import torch

from phalanx.cli import main
from phalanx.comm.wire import Header, Kind
from phalanx.config import RunConfig
from phalanx.entry.api import make_job
from phalanx.parallel.ps import make_shard
from phalanx.ps.checkpoint import read_shard, restore_shard, save_shard, shard_path
from phalanx.runtime.checkpoint import CheckpointError


def run_dir_with_checkpoints(tmp_path: Path, servers=2, rule="adam") -> Path:
    """A run directory as a crashed run leaves it: config.json + one checkpoint per shard
    (taken after a few real pushes)."""
    out = tmp_path / "run"
    cfg = RunConfig.from_mapping({"model": "mlp", "data": "synthetic", "strategy": "asp",
                                  "workers": 2, "servers": servers, "rule": rule,
                                  "checkpoint_every": 2, "out": str(out), "progress": False,
                                  "tensorboard": False}).validate()
    out.mkdir(parents=True)
    (out / "config.json").write_text(json.dumps(cfg.to_json()))
    job = make_job(cfg)
    for k in range(servers):
        s = make_shard(job, k)
        for clock in range(3):
            g = torch.randn(s.dense.numel())
            s.handle(clock % 2, Header(Kind.PUSH, worker=clock % 2, clock=clock // 2,
                                       seq=clock // 2, version=s.version, shard=k), [g])
        save_shard(s, shard_path(out, k), servers=servers, strategy="asp")
    return out


def test_round_trip_restores_parameters_optimizer_state_clocks_and_counters(tmp_path):
    out = run_dir_with_checkpoints(tmp_path)
    job = make_job(RunConfig.from_mapping(json.loads((out / "config.json").read_text())))
    initial = make_shard(job, 1)
    payload = read_shard(shard_path(out, 1), shard=1, servers=2, workers=2, strategy="asp")
    fresh = make_shard(job, 1)
    restore_shard(fresh, payload, shard_path(out, 1))
    assert fresh.version == 3 and fresh.clocks == [2, 1]
    assert fresh.stats.pushes_applied == 3 and fresh.stats.histogram() == [3]
    assert not torch.equal(fresh.dense, initial.dense)  # the pushes moved it
    assert torch.equal(fresh.dense, payload["dense"])
    count = fresh.dense_state  # Adam's step count and moments came back too
    from phalanx.rules import state_tensors

    assert [t.tolist() for t in state_tensors(count)] == [t.tolist() for t in
                                                          payload["dense_state"]]


def resume(out: Path, capsys) -> tuple[int, str]:
    code = main(["train", "--resume", str(out)])
    err = capsys.readouterr().err
    return code, err


def digest(d: Path) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir())}


@pytest.mark.parametrize("damage, message", [
    (lambda p: p.write_bytes(p.read_bytes()[:-100]), "checksum"),  # truncated
    (lambda p: p.write_bytes(p.read_bytes()[:20]), "not a phalanx checkpoint"),
    (lambda p: p.write_bytes(bytearray(b ^ (i == 500) for i, b in enumerate(p.read_bytes()))),
     "checksum"),  # one bit flipped
    (lambda p: p.unlink(), "no such checkpoint"),
    (lambda p: p.write_bytes(p.with_name("ps_shard0.ckpt").read_bytes()), "written by shard 0"),
])
def test_resume_refuses_damaged_checkpoints_in_one_line(tmp_path, capsys, damage, message):
    out = run_dir_with_checkpoints(tmp_path)
    damage(shard_path(out, 1))
    before = digest(out)
    code, err = resume(out, capsys)
    assert code == 2 and err.count("\n") == 1 and err.startswith("phalanx: error: ")
    assert message in err and "ps_shard1.ckpt" in err
    assert digest(out) == before  # nothing written, renamed or deleted


def test_resume_refuses_a_directory_that_is_not_a_run(tmp_path, capsys):
    code, err = resume(tmp_path / "nope", capsys)
    assert code == 2 and "no such directory" in err and err.count("\n") == 1
    (tmp_path / "empty").mkdir()
    code, err = resume(tmp_path / "empty", capsys)
    assert code == 2 and "no config.json" in err
    (tmp_path / "empty" / "config.json").write_text("{not json")
    code, err = resume(tmp_path / "empty", capsys)
    assert code == 2 and "not valid JSON" in err
    (tmp_path / "empty" / "config.json").write_text(json.dumps({"strategy": "single"}))
    code, err = resume(tmp_path / "empty", capsys)
    assert code == 2 and "cannot resume" in err


def test_checkpoint_of_another_rule_is_refused(tmp_path):
    out = run_dir_with_checkpoints(tmp_path, servers=1, rule="sgd")
    cfg = RunConfig.from_mapping({"model": "mlp", "data": "synthetic", "strategy": "asp",
                                  "workers": 2, "servers": 1, "rule": "adam",
                                  "out": str(out)}).validate()
    shard = make_shard(make_job(cfg), 0)
    payload = read_shard(shard_path(out, 0), shard=0, servers=1, workers=2, strategy="asp")
    before = shard.dense.clone()
    with pytest.raises(CheckpointError, match="optimizer state does not match"):
        restore_shard(shard, payload, shard_path(out, 0))
    assert torch.equal(shard.dense, before)


@pytest.mark.parametrize("flags, message", [
    (["--kill-worker", "9@3"], "--kill-worker: worker 9 does not exist"),
    (["--kill-worker", "1-3"], "is not RANK@STEP"),
    (["--kill-server", "0@0"], "update >= 1"),
    (["--drop-messages", "1.5"], "--drop-messages"),
    (["--on-worker-loss", "pray"], "--on-worker-loss"),
    (["--heartbeat-s", "0"], "--heartbeat-s"),
])
def test_malformed_fault_flags_are_one_line_errors(capsys, flags, message):
    code = main(["train", "--strategy", "asp", "--workers", "2", *flags])
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1
