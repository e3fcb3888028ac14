"""The reproduction table (markdown): our sia / gavel / pollux against the Sia artifact's
own simulator run here (reference.jsonl), per workload. python repro_table.py"""

import json
from pathlib import Path

HERE = Path(__file__).parent
ref = {(d["policy"], d["trace"]): d for d in map(json.loads, (HERE / "reference.jsonl").open())}
ours = {}
for f in ("tune2.jsonl", "test.jsonl", "saturn.jsonl", "repro.jsonl"):   # later files win
    for d in map(json.loads, (HERE / f).open()):
        if d.get("load", 1.0) == 1.0 and d["variant"] in ("sia", "gavel", "pollux"):
            ours[(d["variant"], d["trace"])] = d
traces = [f"sia:philly:{i}" for i in range(1, 9)] + [f"sia:saturn:{i}" for i in range(1, 11)]
print("| workload | ref sia | our sia | ratio | restarts/job ref / ours "
      "| ref gavel | our gavel | ratio | restarts/job ref / ours |")
print("|---" * 9 + "|")
for t in traces:
    cells = [t.removeprefix("sia:")]
    for pol in ("sia", "gavel"):
        r, o = ref.get((pol, t)), ours.get((pol, t))
        cells += [f"{r['mean_jct_s']:,.0f}" if r else "n/a",
                  f"{o['mean_jct_s']:,.0f}" if o else "n/a",
                  f"{o['mean_jct_s'] / r['mean_jct_s']:.3f}" if r and o else "n/a",
                  f"{r['restarts_per_job']:.2f} / {o['restarts_per_job']:.2f}" if r and o
                  else "n/a"]
    print("| " + " | ".join(cells) + " |")
