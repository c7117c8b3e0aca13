"""The packages' module graph has no cycle, and its layers import downwards only:

    workloads, conf  ->  harness (the core)  ->  launchers  ->  hydra_plugins, entry points

The graph is read from the source with `ast`, not by importing: every `import` and
`from ... import` counts, also those inside functions and under `TYPE_CHECKING` (a lazy import
still makes the modules depend on each other; it only hides the cycle until that function
runs), relative imports resolved, `from package import module` an edge to the module
(`import_edges` says when a package's __init__ counts).

The entry points (`ENTRY_POINTS`) are the commands that start the launchers: they live in
`harness/` beside the command they run, and may import `launchers/`; no module of the core or
of the launchers may import them back.

Inside harness/ the same holds between its own layers (`HARNESS_LAYERS`), one per package:
config -> system -> cli -> profiles -> costs -> measure -> runtime -> distributions ->
records -> worker -> predict -> analysis, sweeps, commands -> the entry points. Prediction,
though above the worker, imports neither it nor a module that trains (`TRAINING_MODULES`, a
model's trainer): what measures is handed to it.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from tests.helpers import REPO_ROOT

ROOT = REPO_ROOT
PACKAGES = ("workloads", "conf", "harness", "launchers", "hydra_plugins")

# Commands that start cells through the launchers (`python -m harness`, `harness.probe`, and
# `harness.stage_timing`, whose `main()`s submit their jobs with the local or SLURM launcher).
ENTRY_POINTS = frozenset({"harness.__main__", "harness.probe", "harness.stage_timing"})

# Each module's layer; an import may go to its own layer or a lower one.
LAYERS = {"workloads": 0, "conf": 0, "harness": 1, "launchers": 2, "hydra_plugins": 3}
ENTRY_POINT_LAYER = 3


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    line: int


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def source_files() -> dict[str, Path]:
    """Every module of the packages, by dotted name."""
    return {
        module_name(path): path
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
    }


def _ancestors(name: str) -> list[str]:
    """The packages Python executes before the module `a.b.c`: `a`, `a.b`."""
    parts = name.split(".")
    return [".".join(parts[:end]) for end in range(1, len(parts))]


def _imported(
    node: ast.Import | ast.ImportFrom, module: str, is_package: bool, modules: dict[str, Path]
) -> tuple[set[str], set[str]]:
    """What an import statement of `module` loads: the modules it names, and the packages
    Python executes on the way (candidates, not all of them ours)."""
    if isinstance(node, ast.Import):
        named = {alias.name for alias in node.names}
    else:
        if node.level:  # relative: from the module's package, one level up per further dot
            package = module.split(".") if is_package else module.split(".")[:-1]
            base = package[: len(package) - (node.level - 1)]
            source = ".".join(base + ([node.module] if node.module else []))
        else:
            source = node.module or ""
        # `from package import module` names the module; `from package import name` uses
        # what the package's __init__ defines, so it names the package
        named = {
            f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else source
            for alias in node.names
        }
    return named, {ancestor for name in named for ancestor in _ancestors(name)}


def import_edges(modules: dict[str, Path]) -> list[Edge]:
    """Every import of a module of `modules` by another. A package that Python executes only
    on the way to one of its own submodules is no edge of theirs: a package's __init__ that
    re-exports its modules' names (`workloads.datasets`) is not in a cycle with them for that,
    only if a module uses a name from it."""
    edges = []
    for module, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        is_package = path.name == "__init__.py"
        own_packages = set(_ancestors(module))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            named, on_the_way = _imported(node, module, is_package, modules)
            targets = named | (on_the_way - own_packages)
            edges += [
                Edge(module, target, node.lineno)
                for target in sorted(targets)
                if target in modules and target != module
            ]
    return edges


def strongly_connected_components(nodes: list[str], edges: list[Edge]) -> list[list[str]]:
    """Tarjan's algorithm: the components of the graph in which every module reaches every
    other; a cycle is a component of more than one module."""
    successors: dict[str, list[str]] = {node: [] for node in nodes}
    for edge in edges:
        successors[edge.source].append(edge.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in successors[node]:
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            components.append(sorted(component))

    for node in nodes:
        if node not in index:
            visit(node)
    return components


def a_cycle(component: list[str], edges: list[Edge]) -> list[Edge]:
    """One closed path through the component's first module (breadth first: a shortest one)."""
    inside = set(component)
    start = component[0]
    reached: dict[str, Edge | None] = {start: None}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for edge in edges:
                if edge.source != node or edge.target not in inside:
                    continue
                if edge.target == start:
                    path = [edge]
                    while (previous := reached[path[0].source]) is not None:
                        path.insert(0, previous)
                    return path
                if edge.target not in reached:
                    reached[edge.target] = edge
                    following.append(edge.target)
        frontier = following
    raise AssertionError(f"{component} is not strongly connected")


def describe(path: list[Edge], modules: dict[str, Path]) -> str:
    steps = [
        f"{edge.source} -> {edge.target} ({modules[edge.source].relative_to(ROOT)}:{edge.line})"
        for edge in path
    ]
    return "\n    ".join(steps)


def layer(module: str) -> int:
    return ENTRY_POINT_LAYER if module in ENTRY_POINTS else LAYERS[module.split(".")[0]]


def test_the_module_graph_has_no_cycle() -> None:
    modules = source_files()
    edges = import_edges(modules)
    cycles = [
        component
        for component in strongly_connected_components(sorted(modules), edges)
        if len(component) > 1
    ]
    assert not cycles, "\n".join(
        f"{len(component)} modules import each other ({', '.join(component)}); one cycle:\n"
        f"    {describe(a_cycle(component, edges), modules)}"
        for component in cycles
    )


def test_every_import_goes_to_its_own_layer_or_a_lower_one() -> None:
    modules = source_files()
    assert set(ENTRY_POINTS) <= set(modules), "an entry point listed here no longer exists"
    upward = [edge for edge in import_edges(modules) if layer(edge.target) > layer(edge.source)]
    assert not upward, (
        "imports against the layering (workloads, conf -> harness -> "
        "launchers -> hydra_plugins, entry points):\n    "
        + "\n    ".join(describe([edge], modules) for edge in upward)
    )


# The layers inside harness/, lowest first: a module may import its own layer or a lower one.
# Every package of harness/ is one layer (its `__init__` docstring says what it may import);
# the top level holds the entry points a user types. An entry is a module, or `package.*` for
# every module under a package (the longest entry that matches a module places it); a module
# no entry places fails the test, so that a new module is given its place.
HARNESS_LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("configuration", ("harness", "harness.config.*")),
    ("the operating system's side", ("harness.system.*",)),
    ("the command line's plumbing", ("harness.cli.*",)),
    ("profiles: measured records", ("harness.profiles.*",)),
    ("the cost models", ("harness.costs.*",)),
    ("measuring", ("harness.measure.*",)),
    ("the worker's runtime", ("harness.runtime.*",)),
    ("the distribution models", ("harness.distributions.*",)),
    ("the records: results, MLflow, event logs, a cell's identity", ("harness.records.*",)),
    ("the worker", ("harness.worker.*",)),
    ("prediction", ("harness.predict.*",)),
    (
        "analysis, sweeps and what the commands share",
        ("harness.analysis.*", "harness.sweeps.*", "harness.commands.*"),
    ),
    (
        "the entry points",
        (
            "harness.__main__",
            "harness.describe",
            "harness.plan",
            "harness.probe",
            "harness.recommend",
            "harness.sync",
            "harness.compliance",
            "harness.stage_timing",
        ),
    ),
)


def harness_layer(module: str) -> int | None:
    """The layer of a module of harness/: the layer that names it, else the one whose longest
    `package.*` entry covers it; None where no entry places it."""
    named = [level for level, (_, entries) in enumerate(HARNESS_LAYERS) if module in entries]
    if named:
        return named[0]
    covering = [
        (len(entry), level)
        for level, (_, entries) in enumerate(HARNESS_LAYERS)
        for entry in entries
        if entry.endswith(".*") and f"{module}.".startswith(entry.removesuffix("*"))
    ]
    return max(covering)[1] if covering else None


def test_harness_has_layers_that_import_downwards_only() -> None:
    modules = {
        name: path for name, path in source_files().items() if name.split(".")[0] == "harness"
    }
    unplaced = sorted(name for name in modules if harness_layer(name) is None)
    assert not unplaced, f"modules of harness/ without a layer in HARNESS_LAYERS: {unplaced}"
    upward = [
        edge
        for edge in import_edges(modules)
        if harness_layer(edge.target) > harness_layer(edge.source)
    ]  # type: ignore[operator]
    assert not upward, (
        "imports against harness/'s layers ("
        + " -> ".join(name for name, _ in HARNESS_LAYERS)
        + "):\n    "
        + "\n    ".join(
            f"{describe([edge], modules)}: {HARNESS_LAYERS[harness_layer(edge.source)][0]} "  # type: ignore[index]
            f"-> {HARNESS_LAYERS[harness_layer(edge.target)][0]}"
            for edge in upward
        )
    )


# The modules that train: a model's trainer (`harness.distributions.<name>.trainer`), the trainer
# protocol, the one-replica loop, the pipelines' plumbing and weight snapshots (the 1F1B schedule
# as data, `harness.costs.onefoneb`, is arithmetic the cost models share with the trainer).
# Prediction imports none of them, nor the worker, not even inside a function: a prediction from
# kept facts starts no worker and loads no trainer, and what measures is handed to it
# (`harness.predict.facts.measurements.Measurements`, implemented by `harness.worker.measurements`).
TRAINING_MODULES = frozenset(
    {
        "harness.distributions.base",
        "harness.distributions.loop",
        "harness.distributions.pipeline",
        "harness.distributions.state",
    }
)


def _in_package(module: str, package: str) -> bool:
    return module == package or module.startswith(f"{package}.")


def trains_or_starts_workers(module: str) -> bool:
    """Whether `module` is the worker's or one that trains (`TRAINING_MODULES`, a trainer)."""
    trainer = _in_package(module, "harness.distributions") and module.endswith(".trainer")
    return _in_package(module, "harness.worker") or module in TRAINING_MODULES or trainer


def test_the_training_modules_named_here_exist() -> None:
    # a module renamed away would make the prediction's check below pass on nothing
    modules = source_files()
    assert TRAINING_MODULES <= set(modules), sorted(TRAINING_MODULES - set(modules))
    trainers = sorted((ROOT / "harness" / "distributions").glob("*/trainer.py"))
    assert trainers and all(trains_or_starts_workers(module_name(path)) for path in trainers)


def test_prediction_imports_no_worker_and_no_trainer() -> None:
    modules = source_files()
    offending = [
        edge
        for edge in import_edges(modules)
        if _in_package(edge.source, "harness.predict") and trains_or_starts_workers(edge.target)
    ]
    assert not offending, (
        "harness.predict imports the worker or a training module (measuring belongs to "
        "harness.worker.measurements, handed in as harness.predict.facts.measurements."
        "Measurements):\n    " + "\n    ".join(describe([edge], modules) for edge in offending)
    )


def test_the_graph_reader_sees_lazy_relative_and_submodule_imports(tmp_path: Path) -> None:
    # The reader itself, on the forms the packages use: an import inside a function, a relative
    # import from a package, `from package import module`, and a name of a package's __init__.
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("from . import a\nVERSION = 1\n")
    (package / "a.py").write_text("def f():\n    from pkg.b import g\n")
    (package / "b.py").write_text("from pkg import a\n")
    (package / "c.py").write_text("from pkg import VERSION\n")
    modules = {
        "pkg": package / "__init__.py",
        "pkg.a": package / "a.py",
        "pkg.b": package / "b.py",
        "pkg.c": package / "c.py",
    }
    edges = {(edge.source, edge.target) for edge in import_edges(modules)}
    assert edges == {("pkg", "pkg.a"), ("pkg.a", "pkg.b"), ("pkg.b", "pkg.a"), ("pkg.c", "pkg")}
    components = strongly_connected_components(
        sorted(modules), [Edge(source, target, 1) for source, target in edges]
    )
    assert sorted(components) == [["pkg"], ["pkg.a", "pkg.b"], ["pkg.c"]]
