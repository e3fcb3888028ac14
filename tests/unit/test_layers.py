"""The package's layers (docs/architecture.md): no import points up, no module-level import
cycle, and no phalanx import hides inside a function except the few listed below (each
for start-up cost, never to dodge a cycle). Read from the source with ``ast``, so an import
anywhere in a module counts, whether or not it runs."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import phalanx

ROOT = Path(phalanx.__file__).parent

# bottom up; a module may import from its own layer or any layer below it
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("floor", ("phalanx.errors", "phalanx.limits", "phalanx.catalog")),
    ("config", ("phalanx.config", "phalanx.settings")),
    ("metrics", ("phalanx.metrics",)),
    ("data, models, rules", ("phalanx.data", "phalanx.models", "phalanx.rules")),
    # launch, checkpoint files, fault primitives, placement: the ground floor that the
    # communication and parameter-server layers stand on too (a shard's checkpoint file,
    # a worker's message dropper)
    ("runtime", ("phalanx.runtime",)),
    ("comm", ("phalanx.comm",)),
    ("ps", ("phalanx.ps",)),
    ("parallel", ("phalanx.parallel",)),
    ("entry", ("phalanx.entry",)),
    # the dashboard reads the scheduler's topology files; `phalanx schedule --dashboard`
    # serves it: one layer, and it imports nothing of the training side (no torch)
    # scale (the training simulator) stands on the cluster's topology and Pollux's model
    ("experiments, cluster, dashboard, scale", ("phalanx.experiments", "phalanx.cluster",
                                                "phalanx.dashboard", "phalanx.scale")),
    ("command", ("phalanx.cli", "phalanx.__main__", "phalanx")),
]

# (module, imported module): imports inside a function that are there to keep a cheap
# import cheap, not to break a cycle
LAZY = {
    # `import phalanx` (e.g. for the scheduler simulator) must not load torch and every
    # strategy; phalanx.train loads the API on first call
    ("phalanx", "phalanx.entry.api"),
    # Ray's device actors import the engines package (without torch: ~1.5 s per actor);
    # the rank the local engine forks imports torch, and only the scheduler needs it
    ("phalanx.cluster.live.engines.local", "phalanx.entry.forked_rank"),
    # every `phalanx` command builds its parser with `dashboard` in it: the web stack
    # (Starlette, uvicorn: ~0.15 s) is imported only when a dashboard is served
    ("phalanx.dashboard.serve", "phalanx.dashboard.app"),
    # `phalanx --help`, `simulate --help`, `schedule --help`, `dashboard --help` start
    # without torch (issue 48): the command imports a sub-command's module only when it is
    # chosen; these four build their flags from modules that import torch (~2 s)...
    ("phalanx.cli", "phalanx.cli_train"),
    ("phalanx.cli", "phalanx.experiments.cli"),
    ("phalanx.cli", "phalanx.scale.cli"),
    # ...and these three from light ones, still imported only when chosen (numpy, the web
    # page, the interference profile's runner)
    ("phalanx.cli", "phalanx.cluster.cli.simulate"),
    ("phalanx.cli", "phalanx.dashboard.cli"),
    ("phalanx.cli", "phalanx.cluster.cli.interference"),
    ("phalanx.cli", "phalanx.cluster.cli.chaos"),  # the chaos harness (torch: checkpoints)
    # `phalanx schedule`'s flags need no engine; its run imports the live engines, the job
    # list's checks and the training side (torch)
    ("phalanx.cluster.cli.schedule", "phalanx.cluster.cli.schedule_run"),
    # `phalanx scale` is a simulator: torch only to profile a model here (--profile-here,
    # validate's MLP), ~2 s of a `scale --help` otherwise
    ("phalanx.scale.cli", "phalanx.scale.profile"),
    ("phalanx.scale.cli", "phalanx.scale.server_cost"),  # calibrate times a real shard
    ("phalanx.scale.cli", "phalanx.scale.wire_check"),  # bytes runs real ranks on test hosts
    ("phalanx.scale.cli", "phalanx.scale.step_check"),  # steps runs real ranks on test hosts
    ("phalanx.scale.cli", "phalanx.scale.steps_across"),  # steps --across: step_check's
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer_of(module: str) -> int:
    best, best_len = -1, -1
    for i, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best_len:
                best, best_len = i, len(prefix)
    assert best >= 0, f"{module} is in no layer: add it to LAYERS"
    return best


def resolve(source: str, node: ast.ImportFrom | ast.Import, is_package: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.split(".")[0] == "phalanx"]
    if node.level:  # relative: from the package of ``source``
        base = source.split(".") if is_package else source.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    if target.split(".")[0] != "phalanx":
        return []
    # ``from phalanx.parallel import single`` imports the module phalanx.parallel.single
    out = []
    for alias in node.names:
        sub = f"{target}.{alias.name}"
        out.append(sub if _is_module(sub) else target)
    return out


def _is_module(name: str) -> bool:
    rel = Path(*name.split(".")[1:])
    return (ROOT / rel).with_suffix(".py").is_file() or (ROOT / rel / "__init__.py").is_file()


@functools.cache
def imports(typing_too: bool = False) -> tuple[tuple[str, str, int, bool], ...]:
    """(module, imported module, line, inside a function) for every phalanx import; with
    ``typing_too``, those under ``if TYPE_CHECKING:`` as well. Read once per test process
    (eight tests ask; parsing every module each time took 20 s of the suite at load 9)."""
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        source = module_name(path)
        tree = ast.parse(path.read_text(), str(path))
        inner: set[int] = set()
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                inner.update(id(n) for n in ast.walk(fn) if n is not fn)
        typing_only: set[int] = set()
        for node in ast.walk(tree):  # `if TYPE_CHECKING:` blocks import nothing at run time
            if (isinstance(node, ast.If) and isinstance(node.test, ast.Name)
                    and node.test.id == "TYPE_CHECKING"):
                typing_only.update(id(n) for n in ast.walk(node))
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and (
                    typing_too or id(node) not in typing_only):
                for target in resolve(source, node, path.name == "__init__.py"):
                    found.append((source, target, node.lineno, id(node) in inner))
    return tuple(found)


def test_every_module_is_in_a_layer() -> None:
    for path in ROOT.rglob("*.py"):
        layer_of(module_name(path))


def test_no_import_points_up() -> None:
    upward = [f"{src}:{line} imports {dst} ({LAYERS[layer_of(src)][0]} -> "
              f"{LAYERS[layer_of(dst)][0]})"
              for src, dst, line, _ in imports() if layer_of(dst) > layer_of(src)]
    assert not upward, "imports from a lower layer to a higher one:\n" + "\n".join(upward)


def test_no_phalanx_import_hides_in_a_function() -> None:
    hidden = [f"{src}:{line} imports {dst} inside a function"
              for src, dst, line, inside in imports() if inside and (src, dst) not in LAZY]
    assert not hidden, "\n".join(hidden)


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of ``graph``: each of two or more modules is
    a cycle (a package's ``__init__`` re-exporting its own submodules is not one worth
    refusing)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [c for c in cycles if not _package_reexport(c)]


def test_no_module_level_import_cycle() -> None:
    graph: dict[str, set[str]] = {}
    for src, dst, _, inside in imports():
        if not inside and src != dst:
            graph.setdefault(src, set()).add(dst)
    cycles = import_cycles(graph)
    assert not cycles, f"module-level import cycles: {cycles}"


def test_no_import_circle_in_the_cluster() -> None:
    """In ``phalanx.cluster`` no circle at all, not even through an import for type
    checking or one inside a function: a module that needs another's types while that
    one imports it back (``live/restart.py`` and ``live/loop.py`` did) is one concern cut
    in two, and its halves read each other's internals."""
    graph: dict[str, set[str]] = {}
    for src, dst, _, _ in imports(typing_too=True):
        if src != dst and src.startswith("phalanx.cluster.") and dst.startswith(
                "phalanx.cluster."):
            graph.setdefault(src, set()).add(dst)
    cycles = import_cycles(graph)
    assert not cycles, f"import circles in phalanx.cluster: {cycles}"


def test_the_cycle_finder_sees_a_circle_through_a_type_import() -> None:
    """The finder is not blind: the circle restart -> loop (for types only) -> restart is
    found, a chain is not, and the walker reads ``if TYPE_CHECKING:`` imports when asked."""
    a, b, c = "phalanx.cluster.live.a", "phalanx.cluster.live.b", "phalanx.cluster.live.c"
    assert import_cycles({a: {b}, b: {c}, c: {a}}) == [sorted([a, b, c])]
    assert import_cycles({a: {b}, b: {c}}) == []
    typed = [(s, d) for s, d, _, _ in imports(typing_too=True)]
    plain = [(s, d) for s, d, _, _ in imports()]
    assert len(typed) > len(plain)   # the package has typing-only imports, now counted


def _package_reexport(component: list[str]) -> bool:
    packages = [m for m in component if (ROOT / Path(*m.split(".")[1:]) / "__init__.py").is_file()]
    return len(packages) == 1 and all(m.startswith(packages[0] + ".") or m == packages[0]
                                      for m in component)


# the scheduler's house (docs/architecture.md): its packages bottom up; a package may import
# its own or a lower one. ``sim`` and ``live`` share a floor and never import each other.
CLUSTER = [("core",), ("model",), ("policies",), ("sim", "live"), ("studies", "chaos"),
           ("cli",)]
# the training side: only ``phalanx.cluster.live`` (and the CLI above it) may import it, and
# ``chaos``, which stands on live and reads the checkpoints its runs leave
TRAINING = ("torch", "phalanx.data", "phalanx.models", "phalanx.rules", "phalanx.runtime",
            "phalanx.comm", "phalanx.ps", "phalanx.parallel", "phalanx.entry")


def cluster_package(module: str) -> str:
    parts = module.split(".")
    assert parts[:2] == ["phalanx", "cluster"] and len(parts) > 2, module
    return parts[2]


def cluster_floor(module: str) -> int:
    pkg = cluster_package(module)
    for i, names in enumerate(CLUSTER):
        if pkg in names:
            return i
    raise AssertionError(f"{module} is in no package of the scheduler: add it to CLUSTER")


def _every_import() -> list[tuple[str, str, int]]:
    """Like ``imports()``, plus third-party top-level imports (for torch)."""
    found = [(src, dst, line) for src, dst, line, _ in imports()]
    for path in sorted((ROOT / "cluster").rglob("*.py")):
        source = module_name(path)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found += [(source, a.name, node.lineno) for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found.append((source, node.module, node.lineno))
    return found


def test_cluster_packages_point_one_way() -> None:
    bad = []
    for src, dst, line, _ in imports():
        if not (src.startswith("phalanx.cluster.") and dst.startswith("phalanx.cluster.")):
            continue
        a, b = cluster_package(src), cluster_package(dst)
        if cluster_floor(dst) > cluster_floor(src) or {a, b} == {"sim", "live"}:
            bad.append(f"{src}:{line} imports {dst}")
    assert not bad, "the scheduler's packages import up or across:\n" + "\n".join(bad)


def test_only_live_touches_the_training_side() -> None:
    bad = [f"{src}:{line} imports {dst}" for src, dst, line in _every_import()
           if src.startswith("phalanx.cluster")
           and cluster_package(src + ".x") not in ("live", "cli", "chaos")
           and any(dst == t or dst.startswith(t + ".") for t in TRAINING)]
    assert not bad, "only phalanx.cluster.live imports training code:\n" + "\n".join(bad)


def test_the_cluster_checker_sees_a_crossing() -> None:
    assert cluster_floor("phalanx.cluster.sim.run") == cluster_floor("phalanx.cluster.live.loop")
    assert cluster_floor("phalanx.cluster.core.jobs") < cluster_floor("phalanx.cluster.policies")
    assert cluster_floor("phalanx.cluster.studies.load") > cluster_floor("phalanx.cluster.sim.run")


def test_the_checker_sees_an_upward_import(tmp_path: Path) -> None:
    """The walker is not blind: the layer map ranks a known upward edge as one."""
    assert layer_of("phalanx.config") < layer_of("phalanx.runtime.faults")
    assert layer_of("phalanx.runtime.checkpoint") < layer_of("phalanx.ps.checkpoint")
    assert layer_of("phalanx.parallel.registry") < layer_of("phalanx.entry.api")
    tree = ast.parse("from phalanx.parallel import single\nimport phalanx.cli\n")
    found = [t for n in tree.body for t in resolve("phalanx.config", n, False)]
    assert found == ["phalanx.parallel.single", "phalanx.cli"]
    assert all(layer_of(t) > layer_of("phalanx.config") for t in found)
