"""Page load of ``phalanx dashboard`` in headless Chromium: 1,000 runs and a 10,000-job
schedule (issue 50: each view drawn <= 1 s after navigation starts).

    python bench/dashboard.py            # 7 loads of each view
    python bench/dashboard.py --quick    # 3 loads of each view (under a minute)

The folder is written in the documented formats (docs/events.md, docs/cluster.md), seeded:
1,000 run folders (config.json, events.jsonl with 50 train and 5 eval events, summary.json;
every tenth without a summary, as a stopped run) and a ``--compare`` folder of two
10,000-job schedules on a 512-GPU cluster (jobs-fifo-topology.csv, jobs-las-topology.csv;
a third of the jobs preempted up to 3 times). A load is timed from navigation start to the
page's ``data-ready``, set once the view is built and painted (a timeout queued from the
next animation frame): ``performance.now()`` then. The
first load of each view is reported apart (the server reads the files then; later loads
read only what changed). Needs Debian's chromium + chromium-driver and selenium.
Ratios are 1000 ms / the median load: >= 1 meets the target."""

from __future__ import annotations

import argparse
import csv
import http.client
import json
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import ROOT, emit, median

from phalanx.dashboard.headless import browser, console_errors, missing, wait_ready

TARGET_MS = 1000.0


def write_runs(root: Path, n: int, rng: random.Random) -> None:
    strategies = ["single", "sync", "asp", "ssp", "average", "dc-asgd"]
    for i in range(n):
        d = root / "runs" / f"run-{i:04d}"
        d.mkdir(parents=True)
        strategy = strategies[i % len(strategies)]
        cfg = {"strategy": strategy, "model": "mlp", "data": "synthetic", "workers": 4}
        (d / "config.json").write_text(json.dumps(cfg))
        t0, loss, lines = 1.8e9 + i, 2.3, []
        lines.append({"kind": "start", "rank": -1, "role": "driver", "t": 0.0, "unix": t0,
                      **cfg, "parameters": 99978})
        for k in range(1, 51):
            loss *= 0.97 + 0.02 * rng.random()
            lines.append({"kind": "train", "rank": 0, "role": "worker", "t": k * 0.1,
                          "unix": t0 + k * 0.1, "step": 10 * k, "epoch": k // 10,
                          "loss": loss, "accuracy": 1 - loss / 3, "samples": 640 * k,
                          "wall_s": k * 0.1})
            if k % 10 == 0:
                lines.append({"kind": "eval", "rank": 0, "role": "worker", "t": k * 0.1,
                              "unix": t0 + k * 0.1, "step": 10 * k, "epoch": k // 10,
                              "samples": 2560 * k, "test_loss": loss * 1.05,
                              "test_accuracy": 1 - loss / 3, "wall_s": k * 0.1})
        (d / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))
        if i % 10:
            summary = {**cfg, "test_accuracy": 1 - loss / 3, "test_loss": loss * 1.05,
                       "train_samples": 128000, "steps": 500, "wall_s": 5.2,
                       "samples_per_s": 25000 + 1000 * rng.random(), "startup_s": 1.5,
                       "bytes_per_sample": 4000.0, "staleness_mean": rng.random() * 3}
            (d / "summary.json").write_text(json.dumps(summary))
        else:
            (d / "checkpoint.pt").write_bytes(b"")


def write_schedule(folder: Path, jobs: int, policy: str, rng: random.Random) -> None:
    """One ``jobs-<policy>-topology.csv`` row per job (report.write_jobs_csv's columns)."""
    gpus_total, rows = 512, []
    for j in range(jobs):
        submit = j * 6.0 + rng.random() * 6
        gpus = rng.choice([1, 1, 1, 2, 4, 8, 16])
        start = submit + rng.expovariate(1 / (600 if policy == "fifo" else 300))
        run = rng.expovariate(1 / 3600)
        places, t = [], start
        for _ in range(rng.choice([1, 1, 2, 3, 4])):
            first = rng.randrange(0, gpus_total - gpus)
            places.append(f"{t:.1f}@" + ",".join(str(first + k) for k in range(gpus)))
            t += run / 2 + rng.random() * 600
        end = t + run / 2
        rows.append([j, f"job-{j}", "vc1", "resnet", gpus, f"{submit:.1f}", f"{start:.1f}",
                     f"{end:.1f}", f"{end - submit:.1f}", f"{end - submit - run:.1f}",
                     f"{run:.1f}", len(places) - 1, "finished", ";".join(places), "yes"])
    with (folder / f"jobs-{policy}-topology.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "name", "vc", "model", "gpus", "submit", "start", "end", "jct",
                    "queue_delay", "executed", "preemptions", "status", "placements",
                    "preemptible"])
        w.writerows(rows)


def api_ms(url: str, path: str) -> float:
    host, port = url.split("//")[1].rstrip("/").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    t = time.perf_counter()
    conn.request("GET", path)
    r = conn.getresponse()
    r.read()
    assert r.status == 200, (path, r.status)
    return (time.perf_counter() - t) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="3 loads of each view")
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--jobs", type=int, default=10000)
    args = ap.parse_args()
    if missing():
        sys.exit(f"bench/dashboard.py: {missing()}")
    repeats = 3 if args.quick else 7
    rng = random.Random(0)
    with tempfile.TemporaryDirectory(prefix="phalanx-bench-dash-") as tmp:
        root = Path(tmp)
        t = time.perf_counter()
        write_runs(root, args.runs, rng)
        sched = root / "sched"
        sched.mkdir()
        (sched / "compare.json").write_text(json.dumps([
            {"ordering": p, "placement": "topology", "cluster": "uniform-1x4x16x8",
             "jobs": args.jobs} for p in ("fifo", "las")]))
        for p in ("fifo", "las"):
            write_schedule(sched, args.jobs, p, rng)
        write_s = time.perf_counter() - t
        server = subprocess.Popen([sys.executable, "-m", "phalanx.dashboard", str(root),
                                   "--port", "0"], stdout=subprocess.PIPE, text=True,
                                  cwd=ROOT)
        try:
            url = re.search(r"http://\S+/", server.stdout.readline()).group(0)
            cold_index = api_ms(url, "/api/index")
            warm_index = median([api_ms(url, "/api/index") for _ in range(repeats)])
            views = {"runs_1000": "runs", "schedule_10000": "schedule=sched%23fifo-topology",
                     "jct_2x10000": "jct=sched%23fifo-topology|sched%23las-topology"}
            loads: dict[str, list[float]] = {k: [] for k in views}
            with browser() as driver:
                for _ in range(repeats + 1):
                    for name, frag in views.items():
                        driver.get(url + "#" + frag)
                        driver.refresh()
                        loads[name].append(wait_ready(driver, timeout=60))
                errors = console_errors(driver)
        finally:
            server.terminate()
            server.wait(10)
    results: dict = {"runs": args.runs, "jobs": args.jobs, "repeats": repeats,
                     "write_folder_s": round(write_s, 2),
                     "api_index_cold_ms": round(cold_index, 1),
                     "api_index_warm_ms": round(warm_index, 1), "console_errors": errors}
    ratios, targets = {}, {}
    for name, ms in loads.items():
        results[f"{name}_first_ms"] = round(ms[0], 1)
        results[f"{name}_ms"] = round(median(ms[1:]), 1)
        results[f"{name}_ms_runs"] = [round(x, 1) for x in ms[1:]]
        ratios[f"{name}_load"] = round(TARGET_MS / median(ms[1:]), 2)
        targets[f"{name}_load"] = 1.0
    emit("dashboard", results, ratios, targets)


if __name__ == "__main__":
    main()
