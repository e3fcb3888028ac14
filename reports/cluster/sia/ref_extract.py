"""One line per run of the Sia artifact's own simulator (siasosp23/artifacts,
sia-simulator/, run in a scratch venv with run_experiment.sh's flags, one workload at a
time): python ref_extract.py OUT_DIR > reference.jsonl, where OUT_DIR holds each run's
``--output`` log as POLICY-FAMILY-N.log (its last line: every job's final state). Mean
JCT over the jobs that completed, per application (jobs, mean JCT, restarts per job), and
GPU-hours from the per-round placements (each round's interval)."""

import collections
import json
import sys
from pathlib import Path

INTERVAL = {"gavel": 360, "sia": 60, "pollux": 60}

for log in sorted(Path(sys.argv[1]).glob("*-*-*.log")):
    policy, family, n = log.stem.split("-")
    gpu_s, last = 0.0, None
    with log.open() as f:
        for line in f:
            last = json.loads(line)
            gpu_s += INTERVAL[policy] * sum(sum(j["placement"] or []) for j in last[
                "submitted_jobs"] if j["completion_time"] is None)
    jobs = [j for j in last["submitted_jobs"] if j["completion_time"] is not None]
    by, rs = collections.defaultdict(list), collections.defaultdict(list)
    for j in jobs:
        app = j["name"].rsplit("-", 1)[0]
        by[app].append(j["completion_time"] - j["submission_time"])
        rs[app].append(j["num_restarts"] or 0)
    jct = [x for v in by.values() for x in v]
    print(json.dumps({"policy": policy, "trace": f"sia:{family}:{n}",
                      "mean_jct_s": sum(jct) / len(jct), "finished": len(jct),
                      "jobs": len(last["submitted_jobs"]), "gpu_h": gpu_s / 3600,
                      "restarts_per_job": sum(sum(v) for v in rs.values()) / len(jct),
                      "per_app": {a: [len(v), round(sum(v) / len(v)),
                                      round(sum(rs[a]) / len(rs[a]), 1)]
                                  for a, v in sorted(by.items())}}))
