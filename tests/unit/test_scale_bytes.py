"""``phalanx scale bytes`` (phalanx/scale/wire_check.py) without test hosts: every case's
flags are ones ``phalanx train`` accepts, the steady state's bytes are the difference of
two runs' counters, the prediction of a hand-computed case, and bad input in one line.
(The measurement itself, on test hosts: tests/multinode/test_bytes_on_hosts.py, slow.)"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from cli_run import run_main

from phalanx.entry.flags import _Parser, add_run_config_flags, config_from_args
from phalanx.errors import ConfigError
from phalanx.scale import wire_check as wc
from phalanx.scale.profile import profile_model


@pytest.mark.parametrize("model", list(wc.MODELS))
@pytest.mark.parametrize("n", [2, 3, 4])
def test_every_case_is_a_run_phalanx_accepts(tmp_path, model, n):
    labels = []
    for c in wc.cases(n, model):
        parser = _Parser(prog="t")
        add_run_config_flags(parser)
        cfg = config_from_args(parser.parse_args(wc._flags(c, model, 4, tmp_path / "o", 0)))
        assert cfg.max_steps == 4 and cfg.eval_every == 40
        assert cfg.batch_size == wc.BATCHES.get(model, wc.BATCH)
        assert len(c.workers) == n and max(c.workers) < c.world
        if c.setting["strategy"] in ("bsp", "asp", "ssp"):
            assert c.world == n + 2 and cfg.servers == 2 and min(c.workers) == 2
        labels.append(c.label)
    assert len(set(labels)) == len(labels)
    assert ("tensor" in labels) == (model == "gpt" and n != 3)  # 4 heads over 3 ranks: no
    assert ("hybrid 2 stages" in labels) == (n == 4 and model != "ctr")
    if model == "ctr":
        assert cfg.ctr_rows == 32768 == wc.OPTIONS["ctr"]["rows"]


def _netstats(d: Path, tx: list[int]) -> None:
    d.mkdir(parents=True)
    for r, b in enumerate(tx):
        (d / f"netstats-rank{r}.json").write_text(json.dumps({"tx_bytes": b, "rx_bytes": 0}))


def test_no_more_stages_than_the_model_has_layers():
    """phalanx refuses a pipeline of more stages than layers (the MLP has 6: flatten, fc1,
    relu1, fc2, relu2, fc3; the GPT 7): at N = 8 neither is a case (a run at N = 8 had
    stopped the whole group with '--stages: 8 stages but the model has only 6 layers')."""
    labels = {n: {c.label for c in wc.cases(n, "mlp")} for n in (6, 7, 8)}
    assert {"pipeline M=4", "model-parallel"} <= labels[6]
    assert not {"pipeline M=4", "model-parallel"} & (labels[7] | labels[8])
    assert "model-parallel" in {c.label for c in wc.cases(7, "gpt")}
    assert "model-parallel" not in {c.label for c in wc.cases(8, "gpt")}
    assert "hybrid 2 stages" in labels[8] and "sync ring" in labels[8]


def test_retransmitted_segments_are_taken_off_a_host_s_bytes(tmp_path):
    """TCP's retransmissions are the network's, not the protocol's: each a full frame (a
    1,500-byte MTU's segment and its 14 bytes of Ethernet header) off the tx count; a
    counters file that is not one is one line."""
    tmp_path.joinpath("netstats-rank0.json").write_text(json.dumps(
        {"tx_bytes": 1_000_000, "rx_bytes": 0, "retrans_segs": 10, "mtu": 1500}))
    tmp_path.joinpath("netstats-rank1.json").write_text(json.dumps(
        {"tx_bytes": 500_000, "rx_bytes": 0}))  # an older run's: nothing to take off
    assert wc._tx(tmp_path, 2) == [1_000_000 - 10 * 1514, 500_000]
    tmp_path.joinpath("netstats-rank1.json").write_text("[1]")
    with pytest.raises(ConfigError, match="netstats-rank1.json: not a run's network "):
        wc._tx(tmp_path, 2)


def test_the_steady_state_is_the_difference_of_the_two_runs(tmp_path):
    # start-up (1,000,000 B) and the last evaluation (5,000 B) in both; 8 more steps of
    # 400,000 B (rank 0) and 300,000 B (rank 1) in the long run
    _netstats(tmp_path / "a", [1_005_000 + 4 * 400_000, 1_005_000 + 4 * 300_000])
    _netstats(tmp_path / "b", [1_005_000 + 12 * 400_000, 1_005_000 + 12 * 300_000])
    a, b = wc._tx(tmp_path / "a", 2), wc._tx(tmp_path / "b", 2)
    assert [(y - x) / 8 for x, y in zip(a, b)] == [400_000, 300_000]


def test_predictions_by_hand():
    """The MLP on 1x16x16 (99,978 parameters, 399,912 B): a ring worker at N=2 sends X, at
    N=4 1.5X; zero-3 1.5 x sync's; a 2-stage pipeline's busiest stage sends the batch's
    activations once (256 floats a sample, the widest Linear's input), a middle stage of
    three twice; every byte times the wire's framing, every message its own."""
    w = profile_model("mlp", wc.BATCH, repeats=1, input_shape=wc.INPUT["mlp"])
    x = 99_978 * 4
    assert w.grad_bytes == x

    def at(label: str, n: int) -> float:
        c = next(c for c in wc.cases(n, "mlp") if c.label == label)
        payload, messages = wc.payload_and_messages(c, n, w)
        assert wc.predict_point("mlp", c, n, w) == pytest.approx(
            payload * wc.WIRE + messages * wc.FRAMING)
        return payload

    def sent(label: str, n: int) -> float:
        c = next(c for c in wc.cases(n, "mlp") if c.label == label)
        return wc.payload_and_messages(c, n, w)[1]

    assert at("sync ring", 2) == pytest.approx(x)
    assert at("sync ring", 4) == pytest.approx(1.5 * x)
    assert at("zero-3", 2) == pytest.approx(1.5 * x)
    assert at("average k=8", 2) == pytest.approx(x / 8)
    assert at("asp", 3) == pytest.approx(x)  # its push; the pull comes in
    act = 256 * 4 * wc.BATCH
    assert at("pipeline M=4", 2) == pytest.approx(act)
    # messages a step (one bucket): a ring's 2(N - 1) steps; top-k's all-gather N - 1;
    # averaging's ring every 8th step; a PS worker's push to each of 2 shards (the pulls
    # answer them); a pipeline's busiest stage, one a micro-batch per run of sends
    assert [sent("sync ring", n) for n in (2, 3, 4)] == [2, 4, 6]
    assert [sent("sync top-k 1%", n) for n in (2, 3, 4)] == [1, 2, 3]
    assert sent("average k=8", 2) == pytest.approx(2 / 8)
    assert sent("asp", 3) == sent("bsp", 2) == 2
    assert sent("pipeline M=4", 2) == 4 and sent("model-parallel", 2) == 1
    assert sent("sync main", 3) == 2  # rank 0's answers to the other two
    # ZeRO goes unit by unit (the MLP's fc1, fc2, fc3): stage 1 a reduce-scatter and an
    # all-gather each, stage 3 two gathers and a reduce-scatter, each N - 1 ring steps
    assert [sent("zero-1", n) for n in (2, 4)] == [6, 18]
    assert [sent("zero-3", n) for n in (2, 4)] == [9, 27]
    assert gloo_framing() == wc.FRAMING
    # three stages: the cut a run made (its summary's partition; phalanx's partition by
    # measured time cuts the MLP either way): after fc1 (256 floats a sample) and fc2 (128)
    # the middle stage sends 1.5 x act; after flatten and fc1 (256 each), 2 x act; in 8
    # messages (4 micro-batches forward, 4 back)
    c3 = next(c for c in wc.cases(3, "mlp") if c.label == "pipeline M=4")
    for stages, share in (([["flatten", "fc1"], ["relu1", "fc2"], ["relu2", "fc3"]], 1.5),
                          ([["flatten"], ["fc1"], ["relu1", "fc2", "relu2", "fc3"]], 2.0)):
        cut = wc.with_cuts(w, "mlp", stages)
        assert wc.payload_and_messages(c3, 3, cut) == pytest.approx((share * act, 8))


def gloo_framing() -> int:
    """A message and its answer on gloo's TCP pairs: the sender's NOTIFY_SEND_READY and
    SEND_UNBOUND_BUFFER ops, the receiver's NOTIFY_RECV_READY, each a 6 x 8-byte preamble
    in a segment of its own under 14 + 20 + 20 + 12 bytes of headers."""
    preamble, headers = 6 * 8, 14 + 20 + 20 + 12
    return 3 * (preamble + headers)


def test_hybrid_allreduces_the_busiest_stage_s_gradient():
    """The MLP in two stages as phalanx cuts it (flatten, fc1, relu1 | fc2, relu2, fc3):
    the first holds fc1's 256 x 256 + 256 = 65,792 parameters, the second 34,186; hybrid
    over 2 replicas allreduces each stage's gradient among its replicas (at N = 2 a ring
    of two sends all of it), so its busiest worker sends the first stage's 263,168 bytes
    plus its activations, not half the model's (199,956)."""
    w = profile_model("mlp", wc.BATCH, repeats=1, input_shape=wc.INPUT["mlp"])
    cut = wc.with_cuts(w, "mlp", [["flatten", "fc1", "relu1"], ["fc2", "relu2", "fc3"]])
    assert cut.stage_grad_bytes(2) == (65_792 * 4, 34_186 * 4)
    c = next(c for c in wc.cases(4, "mlp") if c.label == "hybrid 2 stages")
    act = 256 * 4 * wc.BATCH
    assert wc.payload_and_messages(c, 4, cut)[0] == pytest.approx(65_792 * 4 + act)


def test_a_run_s_partition_is_read_from_its_summary(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps(
        {"partition": ["flatten,fc1", "relu1,fc2", "relu2,fc3"]}))
    assert wc.partition_of(tmp_path) == [["flatten", "fc1"], ["relu1", "fc2"],
                                         ["relu2", "fc3"]]
    (tmp_path / "summary.json").write_text(json.dumps({"strategy": "sync"}))
    assert wc.partition_of(tmp_path) is None


def test_ctr_predictions_by_hand():
    """The CTR model (26 fields x 32,768 rows of 16, a 30,063-parameter rest) at batch
    256, seed 0's vocabularies: R distinct rows a batch (the Sparse model). A PS worker
    sends its dense gradient, its rows' ids and values, and the next batch's ids; sync
    --sparse-allreduce all-gathers its rows (ids + values) beside the dense ring; plain
    sync sends the whole densified table."""
    w = profile_model("ctr", 256, repeats=1, input_shape=None, options=wc.OPTIONS["ctr"],
                      data_seed=0)
    rows = w.sparse.unique_rows(256)
    assert 2500 < rows < 2600 and w.dense_params == 30_063
    dense, table = 30_063 * 4, 26 * 32_768 * 16 * 4

    def at(label: str, n: int) -> float:
        c = next(c for c in wc.cases(n, "ctr") if c.label == label)
        return wc.payload_and_messages(c, n, w)[0]

    assert at("asp", 2) == pytest.approx(dense + rows * (16 * 4 + 8 + 8))
    assert at("sync sparse", 2) == pytest.approx(dense + rows * (16 * 4 + 8))
    assert at("sync sparse", 4) == pytest.approx(1.5 * dense + 3 * rows * (16 * 4 + 8))
    assert at("sync ring", 2) == pytest.approx(dense + table)


def test_points_take_the_busiest_worker_host_not_a_shard():
    c = next(c for c in wc.cases(2, "mlp") if c.label == "asp")
    w = profile_model("mlp", wc.BATCH, repeats=1, input_shape=wc.INPUT["mlp"])
    found = {("mlp", "asp", 2): [900_000.0, 900_000.0, 402_000.0, 401_000.0]}
    (p,) = wc.points(found, (4, 12))
    assert p.measured == 402_000.0 and c.workers == (2, 3)
    # each point says how it was made: the commit, the flags every run had, the steps
    assert p.steps == (4, 12) and p.commit and p.commit != ""
    assert p.flags[:2] == ("--model", "mlp") and "--strategy" in p.flags
    assert p.flags[p.flags.index("--strategy") + 1] == "asp"
    assert p.predicted == pytest.approx(wc.predict_point("mlp", c, 2, w))
    assert "median |error|" in wc.table([p])
    assert "retransmissions left on" not in wc.table([p])  # a run that did not count them
    # the busiest worker (rank 2) sent 2,000 bytes a step again: taken off its count, and
    # the table's last line says what the point would be with them left on
    again = replace(p, resent=(0.0, 0.0, 2_000.0, 0.0))
    worst = abs(p.predicted / 404_000.0 - 1)
    assert wc.table([again]).splitlines()[-1] == (
        f"With TCP's retransmissions left on the count: 1 points, median {worst:.1%}, "
        f"worst {worst:.1%}; {int(worst <= 0.02)} within 2%.")
    assert "| 2.0 |" in wc.table([again])


@pytest.mark.parametrize("args, text", [
    (("--steps", "5"), "--steps: '5' is not two step counts SHORT,LONG"),
    (("--steps", "9,3"), "--steps: 9,3: the short run must be shorter"),
    (("--steps", "3,9"), "--steps: 3,9: the difference must be a multiple of 8"),
    (("--models", "lenet5"), "--models: 'lenet5' is not one of mlp, gpt, ctr"),
    (("--sizes", "1"), "--sizes: 1 is not in 2..8"),
    (("--sizes", "2,x"), "--sizes: '2,x' is not a comma-separated list of integers"),
])
def test_bad_input_is_one_line(capsys, tmp_path, args, text):
    rc, (_, err) = run_main(capsys, "scale", "bytes", *args, "--out", str(tmp_path / "o"))
    assert rc == 2 and text in err and err.count("\n") == 1, err
    assert not (tmp_path / "o").exists()


def test_reuse_predicts_an_earlier_run_again_with_its_cut(tmp_path, capsys):
    """``--reuse BYTES_JSON``: the same measurements, each point with the cut its runs made
    (from the run folders beside an older bytes.json); a file that is not one: one line."""
    rows = [{"model": "mlp", "label": "model-parallel", "n": 3, "measured": 0.0,
             "predicted": 0.0, "per_host": [49_900.0, 49_800.0, 1_400.0], "steps": [4, 12]}]
    src = tmp_path / "old" / "bytes.json"
    (src.parent / "runs" / "mlp-n3-model-parallel-12").mkdir(parents=True)
    (src.parent / "runs" / "mlp-n3-model-parallel-12" / "summary.json").write_text(
        json.dumps({"partition": ["flatten,fc1", "relu1,fc2", "relu2,fc3"]}))
    src.write_text(json.dumps(rows))
    found, parts, steps, _ = wc.load(src)
    assert steps == (4, 12) and found[("mlp", "model-parallel", 3)][0] == 49_900.0
    assert parts[("mlp", "model-parallel", 3)] == [["flatten", "fc1"], ["relu1", "fc2"],
                                                   ["relu2", "fc3"]]
    out = wc.run(tmp_path / "new", ["mlp"], [3], reuse=str(src))
    again = json.loads((out.parent / "bytes.json").read_text())[0]
    # the middle stage sends 256 + 128 floats a sample, batch 32, times the wire's framing,
    # in two messages (forward, back)
    assert again["predicted"] == pytest.approx((1024 + 512) * wc.BATCH * wc.WIRE
                                               + 2 * wc.FRAMING)
    assert again["partition"] == [["flatten", "fc1"], ["relu1", "fc2"], ["relu2", "fc3"]]
    (tmp_path / "bad.json").write_text("[{}]")
    code, said = run_main(capsys, "scale", "bytes", "--reuse", str(tmp_path / "bad.json"),
                          "--out", str(tmp_path / "x"))
    err = said.err.strip()
    assert code != 0 and len(err.splitlines()) == 1 and "not a bytes.json" in err
