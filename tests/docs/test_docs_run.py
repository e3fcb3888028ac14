"""Docs that run as written (issue 27): every fenced block marked ```` ```sh runnable ````
in README.md and docs/*.md runs in a scratch folder, with the limits of
``PHALANX_LIMITS`` (few steps, a small data subset) put on every run from outside the text.
A block fails when a command errors, prints a traceback, or degrades: a multi-worker
strategy that ran with one worker because the text forgot ``--workers``.

Running every block takes minutes on 2 cores (mostly process start-up), so CI runs a fast
pass: every ``phalanx train`` / ``compare`` / torchrun command of those blocks is parsed by
the real parser and checked as ``phalanx train`` checks it, and for a strategy left with
one worker, in this process. The full run is ``pytest -m slow tests/docs``."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from phalanx.cli import build_parser
from phalanx.entry.flags import config_from_args
from phalanx.entry.torchrun import build_parser as torchrun_parser
from phalanx.errors import PhalanxError
from phalanx.parallel.registry import check_flags_apply, spec

REPO = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"^```sh runnable\n(.*?)^```", re.S | re.M)
LIMITS = "max_steps=3,train_limit=512,test_limit=256,epochs=1"


def runnable_blocks() -> list[tuple[str, str]]:
    found = []
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        text = doc.read_text()
        for m in BLOCK.finditer(text):
            line = text[:m.start()].count("\n") + 1
            found.append((f"{doc.relative_to(REPO)}:{line}", m.group(1)))
    return found


def degraded(folder: Path) -> list[str]:
    """Runs under ``folder`` whose strategy trains with several workers but ran with one."""
    bad = []
    for path in folder.rglob("summary.json"):
        s = json.loads(path.read_text())
        if "strategy" not in s:
            continue  # a scheduler's summary
        if not spec(s["strategy"]).fixed_workers and int(s.get("workers", 1)) < 2:
            bad.append(f"{path.parent.relative_to(folder)}: {s['strategy']} ran with 1 worker")
    return bad


def run_block(text: str, folder: Path) -> subprocess.CompletedProcess:
    """``text`` under bash -e in ``folder``, as from a checkout: ``.venv`` is there."""
    venv = Path(sys.executable).parent.parent
    if not (folder / ".venv").exists():
        (folder / ".venv").symlink_to(venv)
    env = {**os.environ, "PHALANX_LIMITS": LIMITS,
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run(["bash", "-euo", "pipefail", "-c", text], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=600)


BLOCKS = runnable_blocks()


def test_the_docs_mark_their_runnable_blocks():
    where = {w.split(":")[0] for w, _ in BLOCKS}
    assert {"README.md", "docs/compression.md", "docs/data-parallel.md"} <= where, where


def commands(text: str) -> list[list[str]]:
    """The phalanx command lines of a block (continuation lines joined, comments cut), as
    the argument lists after ``phalanx``: ``["train", ...]``, ``["compare", ...]`` or
    ``["torchrun", ...]`` for the flags given to ``-m phalanx.entry.torchrun``."""
    found = []
    for line in text.replace("\\\n", " ").splitlines():
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            continue
        if words[:2] in (["phalanx", "train"], ["phalanx", "compare"]):
            found.append(words[1:])
        elif words[:1] == ["torchrun"] and "phalanx.entry.torchrun" in words:
            found.append(["torchrun", *words[words.index("phalanx.entry.torchrun") + 1:]])
    return found


def check_command(argv: list[str]) -> str | None:
    """What is wrong with one documented command line (None: nothing), without running it."""
    parser = torchrun_parser() if argv[0] == "torchrun" else build_parser()
    try:
        args = parser.parse_args(argv[1:] if argv[0] == "torchrun" else argv)
        cfg = config_from_args(args)
        if argv[0] != "compare" and not cfg.resume:
            check_flags_apply(cfg)
    except (PhalanxError, SystemExit) as e:
        return f"{' '.join(argv)}: {e}"
    s = spec(cfg.strategy)
    ranks = s.compute_ranks(cfg)[0]  # pipeline and hybrid compute on their stages
    if argv[0] != "compare" and not s.fixed_workers and ranks < 2:
        return f"{' '.join(argv)}: --strategy {cfg.strategy} would train with 1 worker"
    return None


def prepare(text: str, folder: Path) -> None:
    """Run a block's own set-up lines (``printf ... > run.yaml``: anything but phalanx,
    torchrun and the venv's activation) in ``folder``, so its commands find their files."""
    setup = [line for line in text.replace("\\\n", " ").splitlines()
             if line.strip() and not line.lstrip().startswith(("phalanx ", "torchrun ", ". ",
                                                               "#"))]
    if setup:
        subprocess.run(["bash", "-euo", "pipefail", "-c", "\n".join(setup)], cwd=folder,
                       check=True, timeout=30)


@pytest.mark.parametrize("where,text", BLOCKS, ids=[w for w, _ in BLOCKS])
def test_documented_commands_parse_and_keep_their_workers(where, text, monkeypatch, tmp_path):
    monkeypatch.setenv("PHALANX_LIMITS", LIMITS)
    prepare(text, tmp_path)
    monkeypatch.chdir(tmp_path)
    lines = commands(text)
    assert lines, f"{where}: no phalanx command found"
    problems = [p for p in map(check_command, lines) if p]
    assert problems == [], where


def test_the_parse_check_catches_the_old_diloco_example():
    old = ("phalanx train --strategy average --period 32 --outer-rule nesterov --outer-lr 0.7 "
           "\\\n    --outer-momentum 0.9 --compress fp16")
    (problem,) = map(check_command, commands(old))
    assert "would train with 1 worker" in problem


@pytest.mark.slow
@pytest.mark.parametrize("where,text", BLOCKS, ids=[w for w, _ in BLOCKS])
def test_documented_commands_run_as_written(tmp_path, where, text):
    r = run_block(text, tmp_path)
    assert r.returncode == 0, f"{where}: exit {r.returncode}\n{r.stderr[-3000:]}"
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    assert degraded(tmp_path) == [], where


@pytest.mark.slow
def test_the_check_catches_a_strategy_left_with_one_worker(tmp_path):
    """The DiLoCo example as docs/compression.md had it (no --workers): it ran, silently,
    as 'average x1'. The check must call that a failure."""
    old = ("phalanx train --strategy average --period 32 --outer-rule nesterov --outer-lr 0.7 "
           "--outer-momentum 0.9 --compress fp16 --model mlp --data synthetic --out runs/d")
    assert run_block(old, tmp_path).returncode == 0  # it "works"...
    assert degraded(tmp_path) == ["runs/d: average ran with 1 worker"]  # ...but degraded
