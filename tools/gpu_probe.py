"""Checks of the machine and the inputs for tools/gpu_check.sh (docs/gpu.md).

    python3 tools/gpu_probe.py env FILE [--dry]     # torch, CUDA, NCCL, cores -> FILE (JSON)
    python3 tools/gpu_probe.py data DIR             # the data folder gpu_prepare.sh fills
    python3 tools/gpu_probe.py help-lists FILE ARG...  # FILE --help runs and lists each --flag

Each prints what it found and exits 0, or 1 with the problem in one line: ``env`` when CUDA
or NCCL is missing (not with ``--dry``: a CPU machine checks the commands only), ``data``
when the Fashion-MNIST files are missing (the text file is optional: without it the GPT
runs are skipped), ``help-lists`` when the file is missing, its ``--help`` fails or a flag
is not in it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

IDX_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
             "t10k-labels-idx1-ubyte")
TEXT_FILE = "text/tinyshakespeare.txt"
PREPARE = "run `bash tools/gpu_prepare.sh` in the checkout that has the data (docs/gpu.md)"


def nvidia_smi() -> str:
    """One line per GPU (name, driver, memory), or why there is none."""
    if shutil.which("nvidia-smi") is None:
        return "nvidia-smi: not found"
    r = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                        "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
    return (r.stdout if r.returncode == 0 else r.stderr).strip() or f"rc {r.returncode}"


def environment() -> dict:
    import torch
    import torch.distributed as dist

    from phalanx.data import DATASETS
    from phalanx.models import MODELS
    from phalanx.parallel.registry import NAMES
    from phalanx.runtime.placement import cores

    cuda = torch.cuda.is_available()
    env = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda_build": torch.version.cuda,  # None: a CPU-only build of PyTorch
        "cuda_available": cuda,
        "devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        if cuda else [],
        "nccl_available": dist.is_available() and dist.is_nccl_available(),
        "nccl_version": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None,
        "cores": cores(),
        "cpu_count": os.cpu_count(),
        "nvidia_smi": nvidia_smi(),
        "pytest": _has("pytest"),
        # whether `phalanx scale steps` / `bytes` could run here (network namespaces, tc):
        # None, or why not (docs/scale.md; the scale check on the GPU needs them)
        "test_hosts_unavailable": _test_hosts(),
        "strategies": list(NAMES),
        "models": list(MODELS),
        "datasets": list(DATASETS),
    }
    if cuda:
        p = torch.cuda.get_device_properties(0)
        env["device0"] = {"capability": f"{p.major}.{p.minor}",
                          "memory_gib": round(p.total_memory / 2**30, 1),
                          "multiprocessors": p.multi_processor_count}
    return env


def _test_hosts() -> str | None:
    from phalanx.runtime.hosts import unavailable

    try:
        return unavailable()
    except OSError as e:  # no ip at all, a /proc we may not read
        return f"{type(e).__name__}: {e}"


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def cmd_env(args: argparse.Namespace) -> int:
    env = environment()
    Path(args.file).parent.mkdir(parents=True, exist_ok=True)
    Path(args.file).write_text(json.dumps(env, indent=1) + "\n")
    print(json.dumps(env, indent=1))
    missing = [what for what, ok in (("CUDA", env["cuda_available"]),
                                     ("NCCL", env["nccl_available"])) if not ok]
    if missing and not args.dry:
        print(f"env: {' and '.join(missing)} not available to torch {env['torch']} here")
        return 1
    return 0


def data_problems(root: Path) -> tuple[list[str], list[str]]:
    """(problems, notes) of the data folder ``root``."""
    if not root.is_dir():
        return [f"{root}: no such folder; {PREPARE}"], []
    problems, notes = [], []
    fm = root / "fashion-mnist"
    for stem in IDX_FILES:
        found = [p for p in (fm / f"{stem}.gz", fm / stem) if p.is_file()]
        if not found:
            problems.append(f"{fm / stem}.gz: no such file; {PREPARE}")
        else:
            notes.append(f"{found[0]}: {found[0].stat().st_size} bytes")
    text = root / TEXT_FILE
    notes.append(f"{text}: {text.stat().st_size} bytes" if text.is_file() else
                 f"{text}: no such file (the GPT runs read the package's own copy or skip)")
    return problems, notes


def cmd_data(args: argparse.Namespace) -> int:
    problems, notes = data_problems(Path(args.dir))
    for line in notes + problems:
        print(line)
    if problems:
        print(f"data: {problems[0]}" + (f" (and {len(problems) - 1} more)"
                                         if len(problems) > 1 else ""))
        return 1
    return 0


def cmd_help_lists(args: argparse.Namespace) -> int:
    """The benchmark's own parser is asked: ``--help`` runs (its imports work) and names
    every flag the check passes it."""
    if not Path(args.file).is_file():
        print(f"help-lists: {args.file}: no such file")
        return 1
    r = subprocess.run([sys.executable, args.file, "--help"], capture_output=True, text=True,
                       timeout=120)
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["(no output)"])[-1]
        print(f"help-lists: {args.file} --help: exit {r.returncode}: {last}")
        return 1
    flags = [a.split("=")[0] for a in args.args if a.startswith("--")]
    absent = [f for f in flags if not re.search(rf"(?<![\w-]){re.escape(f)}(?![\w-])",
                                                r.stdout)]
    if absent:
        print(f"help-lists: {args.file} --help does not list {', '.join(absent)}")
        return 1
    print(f"{args.file} --help lists {', '.join(flags) or 'no flags (none passed)'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("env")
    p.add_argument("file")
    p.add_argument("--dry", action="store_true", help="no CUDA is not a failure")
    p.set_defaults(func=cmd_env)
    p = sub.add_parser("data")
    p.add_argument("dir")
    p.set_defaults(func=cmd_data)
    p = sub.add_parser("help-lists")
    p.add_argument("file")
    p.add_argument("args", nargs=argparse.REMAINDER)
    p.set_defaults(func=cmd_help_lists)
    args = ap.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
