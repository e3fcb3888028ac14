import json, sys, time
from phalanx.cluster.sim.run import SimulateOptions, apply_preset, simulate, load_inputs
VARIANTS = {
  "sia": {"ordering": "sia"},
  "gavel": {"ordering": "gavel", "interval_s": 360.0},
  "pollux": {"ordering": "pollux"},
  "goodput": {"ordering": "goodput"},
  # the typed policy's growth cap was 2 (Sia's) before the tune4 runs, 8 since
  "goodput-growth2": {"ordering": "goodput", "typed": {"growth": 2.0}},
  "goodput-restart-sia": {"ordering": "goodput", "typed": {"restart": "sia"}},
  "goodput-batch-target": {"ordering": "goodput", "typed": {"batch": "target"}},
  "goodput-las": {"ordering": "goodput", "typed": {"weight": "las"}},
  "goodput-share": {"ordering": "goodput", "learned": {"share": True}},
  "goodput-p-1": {"ordering": "goodput", "typed": {"p": -1.0}},
  "goodput-gain0": {"ordering": "goodput", "typed": {"min_gain": 0.0}},
  "goodput-growth4": {"ordering": "goodput", "typed": {"growth": 4.0}},
  "goodput-share-growth4": {"ordering": "goodput", "learned": {"share": True}, "typed": {"growth": 4.0}},
  "goodput-p-0.25": {"ordering": "goodput", "typed": {"p": -0.25}},
  "goodput-growth8": {"ordering": "goodput", "typed": {"growth": 8.0}},
  # a job's first size before any fit: 4 since 2026-11-27 (the files before start.jsonl
  # were made at 1: goodput-start1 repeats them)
  "goodput-start1": {"ordering": "goodput", "typed": {"start": 1}},
  "goodput-start4": {"ordering": "goodput", "typed": {"start": 4}},
  "goodput-start8": {"ordering": "goodput", "typed": {"start": 8}},
  # the typed policy's minimum gain: 0.2 since 2026-11-27 (0.1 before; the gain0.2 /
  # gain0.05 runs in start.jsonl were made at start 4 with min gain 0.1 as the default)
  "goodput-gain0.1": {"ordering": "goodput", "typed": {"min_gain": 0.1}},
  "goodput-gain0.2": {"ordering": "goodput", "typed": {"min_gain": 0.2}},
  "goodput-gain0.05": {"ordering": "goodput", "typed": {"min_gain": 0.05}},
  "goodput-lambda1.5": {"ordering": "goodput", "typed": {"lambda_n": 1.5}},
  "goodput-start2": {"ordering": "goodput", "typed": {"start": 2}},
  "goodput-growth16": {"ordering": "goodput", "typed": {"growth": 16.0}},
  "goodput-growth64": {"ordering": "goodput", "typed": {"growth": 64.0}},
  "goodput-h900": {"ordering": "goodput", "goodput": {"horizon_s": 900.0}},
  "goodput-h3600": {"ordering": "goodput", "goodput": {"horizon_s": 3600.0}},
  "goodput-p-1.0": {"ordering": "goodput", "typed": {"p": -1.0}},
  "goodput-p-0.75": {"ordering": "goodput", "typed": {"p": -0.75}},
  "goodput-p-0.1": {"ordering": "goodput", "typed": {"p": -0.1}},
  # the typed policy's p: -0.25 since 2026-11-27 (-0.5 before: the p variants above and
  # the files before p.jsonl were made at -0.5, and goodput-p-0.5 repeats them)
  "goodput-p-0.5": {"ordering": "goodput", "typed": {"p": -0.5}},
  "goodput-attained": {"ordering": "goodput", "typed": {"restart": "attained"}},
  "goodput-p-0.5-attained": {"ordering": "goodput", "typed": {"p": -0.5, "restart": "attained"}},
  "goodput-p-0.5-las": {"ordering": "goodput", "typed": {"p": -0.5, "weight": "las"}},
  "goodput-p-0.25-gain0.1": {"ordering": "goodput", "typed": {"p": -0.25, "min_gain": 0.1}},
  "goodput-p-0.25-gain0.3": {"ordering": "goodput", "typed": {"p": -0.25, "min_gain": 0.3}},
  "goodput-p-0.25-lambda1.2": {"ordering": "goodput", "typed": {"p": -0.25, "lambda_n": 1.2}},
  "goodput-p-0.25-h900": {"ordering": "goodput", "typed": {"p": -0.25}, "goodput": {"horizon_s": 900.0}},
  "goodput-p-0.25-lambda1.05": {"ordering": "goodput", "typed": {"p": -0.25, "lambda_n": 1.05}},
  "goodput-growth4-gain0": {"ordering": "goodput", "typed": {"growth": 4.0, "min_gain": 0.0}},
  # ablations reading every measured profile (more than Sia knows): the model fitted
  # offline to all of them, or the simulator's own throughput table
  "goodput-fit": {"ordering": "goodput", "typed": {"knowledge": "offline-fit"}},
  "goodput-oracle": {"ordering": "goodput", "typed": {"knowledge": "oracle"}},
  "goodput-fit-owncap": {"ordering": "goodput", "typed": {"knowledge": "offline-fit", "known_cap": "own"}},
  "goodput-oracle-owncap": {"ordering": "goodput", "typed": {"knowledge": "oracle", "known_cap": "own"}},
  "goodput-share-growth4-las": {"ordering": "goodput", "learned": {"share": True}, "typed": {"growth": 4.0, "weight": "las"}},
}
out = sys.argv[1]
load = 1.0
for spec in sys.argv[2:]:
    v, trace = spec.split("@")
    load = 1.0
    if "x" in v.split("-")[-1] and v.split("-")[-1].startswith("x"):
        load = float(v.split("-")[-1][1:]); v = "-".join(v.split("-")[:-1])
    kw = dict(VARIANTS[v], trace=trace, progress=False, load_scale=load)
    opts = SimulateOptions.from_dict(apply_preset("sia-artifact", kw))
    t = time.time()
    s, res = simulate(opts)
    jcts = sorted(st.end - st.spec.submit for st in res.jobs if st.end >= 0)
    import numpy as np
    gpu_h = sum(st.attained for st in res.jobs) / 3600
    restarts = np.mean([max(len(st.placements) - 1, 0) for st in res.jobs])
    rec = {"variant": v, "trace": trace, "load": load, "mean_jct_s": s.mean_jct_s, "finished": s.finished,
           "p99_jct_s": float(np.percentile(jcts, 99)), "gpu_h": gpu_h, "restarts_per_job": float(restarts),
           "wall_s": time.time() - t}
    import collections
    by = collections.defaultdict(list); rs = collections.defaultdict(list)
    for st in res.jobs:
        by[st.spec.model].append(st.end - st.spec.submit); rs[st.spec.model].append(max(len(st.placements)-1, 0))
    rec["per_app"] = {a: (len(v), round(sum(v)/len(v)), round(sum(rs[a])/len(rs[a]), 1)) for a, v in by.items()}
    with open(out, "a") as f:
        f.write(json.dumps(rec) + "\n")
    print(rec, flush=True)
