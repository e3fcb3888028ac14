"""What a process imports is paid at every start: a Ray device actor is a process of its
own, and every ``phalanx schedule --engine ray`` starts one per device (three per schedule
in the Ray tests; ~1-2 s of CPU each for torch). The actor's module must not import torch:
the ranks it starts import it themselves."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_ray_actors_module_imports_no_torch():
    code = ("import sys, phalanx.cluster.live.engines.ray as m; "
            "assert hasattr(m, 'RankActor'); print(sorted(k for k in sys.modules "
            "if k == 'torch' or k.startswith('torch.')))")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]", r.stdout


def test_import_phalanx_makes_idle_openmp_threads_sleep_unless_the_user_chose():
    """torch's intra-op threads spin while idle by default, which on a machine with more
    runnable threads than cores starves the threads doing the work (bench/threads.py: 12x
    fewer steps/s). ``import phalanx`` sets OMP_WAIT_POLICY=PASSIVE before torch loads, so
    the process and everything it starts inherit it; a value already set is kept."""
    code = ("import os, sys, phalanx; assert 'torch' not in sys.modules; "
            "print(os.environ['OMP_WAIT_POLICY'])")
    env = {k: v for k, v in __import__("os").environ.items() if k != "OMP_WAIT_POLICY"}
    for given, want in ((None, "PASSIVE"), ("ACTIVE", "ACTIVE")):
        r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                           text=True, timeout=60,
                           env={**env, **({"OMP_WAIT_POLICY": given} if given else {})})
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == want
