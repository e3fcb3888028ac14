"""Scratch: the steps check for ZeRO-3 only (MLP, GPT), held out from the unit timeline."""
import sys
from pathlib import Path
sys.path.insert(0, ".")
from phalanx.scale import step_check as sc, wire_check as wc
orig = wc.cases
wc.cases = lambda n, model: [c for c in orig(n, model) if c.label == "zero-3"]
print(sc.run(Path(sys.argv[1]), ["mlp", "gpt"], [2, 3], [100.0, 20.0],
             "reports/experiments/scale/calibration-gloo.json", steps=12, fit_repeats=3,
             run_s=2.0))
