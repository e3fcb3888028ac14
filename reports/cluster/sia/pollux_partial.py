"""The artifact's Pollux on a workload it has not finished: at each simulated time its
run printed (``t T completed N Average JCT: M``, one line per 60 s round, from the run's
stdout), the jobs finished by then and their mean JCT, beside ours at the same time.
python pollux_partial.py OURS.json ARTIFACT.txt, where OURS.json is
{"jobs": [[name, submit, end], ...]} from our run."""

import json
import re
import sys

jobs = json.load(open(sys.argv[1]))["jobs"]
ref = [(int(m[1]), int(m[2]), float(m[3])) for m in
       (re.match(r"t (\d+) completed (\d+) Average JCT: ([\d.]+)", ln)
        for ln in open(sys.argv[2])) if m]
print("| simulated time (s) | artifact: finished | its mean JCT | ours: finished "
      "| our mean JCT | ratio |")
print("|---" * 6 + "|")
step = max(1, len(ref) // 10)
for t, n, mean in ref[step::step] + ref[-1:]:
    done = [e - s for _, s, e in jobs if 0 <= e <= t]
    ours = sum(done) / len(done) if done else 0.0
    print(f"| {t:,} | {n} | {mean:,.0f} | {len(done)} | {ours:,.0f} | "
          f"{ours / mean:.3f} |" if mean else f"| {t:,} | {n} | - | {len(done)} | - | - |")
