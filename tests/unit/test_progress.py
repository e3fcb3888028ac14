"""Progress output (issue 27): rate, ETA and the caller's figures on the plain line that
pipes and CI get, and start-up lines while ranks come up."""

from __future__ import annotations

import io
import json
import time

from phalanx.metrics.progress import Progress, StartupLines


def test_plain_line_has_rate_eta_and_figures():
    out = io.StringIO()
    p = Progress(100, "sync", stream=out, every_s=0.0)
    p.update(10, samples=640, epoch=0, loss=1.5)
    time.sleep(0.05)
    p.update(50, samples=3200, epoch=1, loss=0.75)
    last = out.getvalue().splitlines()[-1]
    assert last.startswith("sync 50/100 (50%)") and "ETA 0:0" in last
    assert "samples/s" in last and "epoch 1" in last and "loss 0.75" in last
    rate = float(last.split(" samples/s")[0].rsplit(", ", 1)[1].replace(",", ""))
    assert 2560 / 0.05 * 1.01 > rate > 2560 / 5  # (3200 - 640) samples over >= 0.05 s
    p.update(100, test_acc=0.9)
    assert "ETA" not in out.getvalue().splitlines()[-1]
    assert "test_acc 0.9" in out.getvalue().splitlines()[-1]


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_startup_lines_count_ready_ranks_and_stop_at_the_first_step(tmp_path):
    events, term = tmp_path / "events.jsonl", Terminal()
    events.write_text(json.dumps({"kind": "start"}) + "\n")
    with StartupLines(events, "asp", every_s=0.05, stream=term):
        time.sleep(0.12)
        with events.open("a") as f:
            f.write(json.dumps({"kind": "ready"}) + "\n" + json.dumps({"kind": "ready"}) + "\n")
        time.sleep(0.12)
        with events.open("a") as f:
            f.write(json.dumps({"kind": "train"}) + "\n")
        time.sleep(0.15)
        lines = term.getvalue().splitlines()
    assert lines[0].startswith("asp: starting, 0 rank(s) ready")
    assert lines[-1].startswith("asp: starting, 2 rank(s) ready")
    time.sleep(0.1)
    assert term.getvalue().splitlines() == lines  # silent once training started


def test_phase_lines_are_for_terminals_only(capsys):
    from phalanx.metrics.progress import say

    say("sync: starting 4 workers (processes)...")  # stderr is a pipe here
    assert capsys.readouterr().err == ""
    term = Terminal()
    say("sync: rank 0 (worker) ready", term)
    assert term.getvalue() == "sync: rank 0 (worker) ready\n"
