"""``phalanx simulate`` as a user runs it: a subprocess, real files, one-line errors (bad
flags in-process)."""

import csv
import json
import math
import re
import subprocess
import sys
from pathlib import Path

from phalanx.cli import main

FIXTURES = Path(__file__).parent / "fixtures"
REPO = Path(__file__).resolve().parents[2]


def phalanx(*args):
    return subprocess.run([sys.executable, "-m", "phalanx.cli", *args], capture_output=True,
                          text=True, cwd=REPO, timeout=120, check=False)


def test_simulate_writes_outputs(tmp_path):
    out = tmp_path / "sim"
    r = phalanx("simulate", "--trace", str(FIXTURES / "philly_small.csv"), "--cluster",
                "uniform:1,1,2,8,2", "--policy", "tiresias", "--placement", "load-adaptive",
                "--slot", "600", "--out", str(out), "--no-progress")
    assert r.returncode == 0, r.stderr
    s = json.loads((out / "summary.json").read_text())
    assert s["jobs"] == s["finished"] == 35 and s["ordering"] == "tiresias"
    assert s["mean_jct_s"] >= s["median_jct_s"] > 0 and 0 < s["utilisation_mean"] <= 1
    lines = (out / "jobs.csv").read_text().splitlines()
    assert lines[0].startswith("id,name,vc,model,gpus,submit,start,end,jct") and len(lines) == 36
    # each (re)start at its time to 0.1 s, as start and end are: the first is the start
    rows = list(csv.DictReader((out / "jobs.csv").open()))
    for row in rows:
        times = [p.split("@")[0] for p in row["placements"].split(";")]
        assert all(re.fullmatch(r"\d+\.\d", t) for t in times), row["placements"]
        assert times[0] == row["start"]
        # each placement's end, in order: within it and the next start; the last the end
        stops = [float(t) for t in row["stops"].split(";")]
        starts = [float(t) for t in times]
        assert len(stops) == len(starts), row
        assert all(a <= b <= c for a, b, c in zip(starts, stops, starts[1:] + [math.inf]))
        assert stops[-1] == float(row["end"]), row
    assert any(int(row["preemptions"]) for row in rows)  # so some bar ended before the end
    for name in ("jct_cdf.png", "utilisation.png", "queue.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_compare_prints_one_table(tmp_path):
    r = phalanx("simulate", "--trace", "pollux:2", "--cluster", "pollux-64", "--compare",
                "fifo,tiresias:pack", "--no-progress", "--out", str(tmp_path / "c"))
    assert r.returncode == 0, r.stderr
    table = [ln for ln in r.stdout.splitlines() if ln.strip().startswith(("fifo", "tiresias"))]
    assert len(table) == 2 and "pack" in table[1] and "topology" in table[0]
    assert len(json.loads((tmp_path / "c" / "compare.json").read_text())) == 2


def test_bad_row_is_one_line_exit_2(tmp_path):
    bad = tmp_path / "bad.csv"
    lines = (FIXTURES / "philly_small.csv").read_text().splitlines()
    lines.insert(3, "2017-10-09 07:01:55,-5,1,66.0,11cb48")
    bad.write_text("\n".join(lines) + "\n")
    r = phalanx("simulate", "--trace", str(bad), "--cluster", "uniform:1,1,2,8",
                "--no-progress")
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0
    assert "line 4: duration must be > 0" in r.stderr and "Traceback" not in r.stderr
    r = phalanx("simulate", "--trace", str(bad), "--cluster", "uniform:1,1,2,8",
                "--skip-bad-rows", "--no-progress")
    assert r.returncode == 0 and "skipped 1 malformed row" in r.stdout


def test_bad_flags_are_one_line(tmp_path, capsys):
    """In-process (each real process paid ~2.5 s of imports; the real-process path of a
    bad input is test_bad_row_is_one_line_exit_2 above)."""
    for args, text in ((("--policy", "lottery"), "unknown ordering"),
                       (("--placement", "random"), "placement 'random'"),
                       (("--cluster", "uniform:1,x"), "--cluster uniform:1,x"),
                       (("--slot", "0", "--policy", "rr"), "--slot must be a finite number > 0")):
        code = main(["simulate", "--trace", str(FIXTURES / "philly_small.csv"), *args,
                     "--no-progress", "--out", str(tmp_path / "o")])
        err = capsys.readouterr().err
        assert code == 2 and text in err, (args, err)
        assert err.strip().count("\n") == 0 and err.startswith("phalanx: error: "), err
        assert not (tmp_path / "o").exists()
