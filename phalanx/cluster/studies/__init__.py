"""The studies behind ``reports/cluster/`` (``phalanx simulate --study NAME --out DIR``):
each is one module and one line in ``STUDIES``; an entry runs the study from the base
options into the folder.

    phalanx simulate --study pollux --out reports/cluster
    phalanx simulate --study pollux-ablation --out reports/cluster
    phalanx simulate --study load --out reports/cluster
    phalanx simulate --study sia --out reports/cluster
    phalanx simulate --study interference --out reports/cluster
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from phalanx.catalog import Catalog
from phalanx.cluster.sim.run import SimulateOptions
from phalanx.cluster.studies.interference_sim import interference_study
from phalanx.cluster.studies.load import load_study
from phalanx.cluster.studies.pollux import pollux_studies
from phalanx.cluster.studies.pollux_ablation import ablation_study
from phalanx.cluster.studies.sia import sia_study

Study = Callable[[SimulateOptions, Path], object]
STUDIES: Catalog[Study] = Catalog("study", "--study")
STUDIES.add("pollux", pollux_studies, "mean JCT table on the 8 Pollux workloads (artifact, "
            "our pollux, goodput)")
STUDIES.add("pollux-ablation", ablation_study, "the learned policies' ablations")
STUDIES.add("load", load_study, "pack/spread/load-adaptive at three Philly load levels")
STUDIES.add("sia", sia_study, "Sia's workloads on its 3-type cluster: reference sia / pollux "
            "/ gavel and our goodput (equal information)")
STUDIES.add("interference", interference_study, "interference-aware placement against pack "
            "and spread, priced by Gavel's pairs (Sia's Philly 1-4, Philly with Gavel's jobs)")


def run_study(name: str, base: SimulateOptions, out: Path) -> None:
    study = STUDIES.get(name)
    out.mkdir(parents=True, exist_ok=True)
    study(base, out)
    print(f"wrote {out}/")
