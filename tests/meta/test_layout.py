"""The layout a newcomer finds their way in by: harness/'s top level holds only the entry points a
user types, every package says in its `__init__` what it holds and what it may import, and a
module's unit tests are found from its path (tests/unit/<the module's path>, test_<module>.py).

The layers themselves (which package may import which) are tests/meta/test_import_graph.py's."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers import REPO_ROOT

# What `python -m harness.<X>` runs, and the package's own __init__: nothing else lives at the
# top of harness/ (docs/layout.md says which package holds what).
ENTRY_POINTS = {
    "__init__",
    "__main__",
    "compliance",
    "describe",
    "plan",
    "probe",
    "recommend",
    "stage_timing",
    "sync",
}
MAX_TOP_LEVEL_MODULES = 10
# The kinds of tests, one folder each (tests/conftest.py, docs/layout.md).
TEST_KINDS = {"unit", "integration", "faults", "fuzz", "meta", "benchmarks"}
SOURCE_ROOTS = ("harness", "workloads", "launchers", "hydra_plugins")


def test_harness_top_level_holds_the_entry_points_only() -> None:
    modules = {path.stem for path in (REPO_ROOT / "harness").glob("*.py")}
    assert modules == ENTRY_POINTS, (
        f"harness/ holds {sorted(modules - ENTRY_POINTS)} beside its entry points: give each a "
        f"package that says what it holds (docs/layout.md)"
    )
    assert len(modules) <= MAX_TOP_LEVEL_MODULES


def test_every_package_says_what_it_holds() -> None:
    silent = []
    for root in SOURCE_ROOTS:
        for init in sorted((REPO_ROOT / root).rglob("__init__.py")):
            if "conf" in init.relative_to(REPO_ROOT).parts:
                continue
            docstring = ast.get_docstring(ast.parse(init.read_text())) or ""
            if len(docstring.split()) < 8:
                silent.append(str(init.relative_to(REPO_ROOT)))
    assert silent == [], f"packages whose __init__ docstring does not say what they hold: {silent}"


def test_tests_are_grouped_by_kind() -> None:
    folders = {path.name for path in (REPO_ROOT / "tests").iterdir() if path.is_dir()}
    assert folders - {"__pycache__"} == TEST_KINDS
    loose = sorted(path.name for path in (REPO_ROOT / "tests").glob("test_*.py"))
    assert loose == [], f"tests outside a kind's folder: {loose}"


def _source_of(test: Path) -> list[Path]:
    """Where the module or package a unit test file names would be: tests/unit/a/b/test_c.py
    tests a/b/c.py or the package a/b/c/; tests/unit/a/b/test_b.py the package a/b/ itself."""
    relative = test.relative_to(REPO_ROOT / "tests" / "unit")
    stem = relative.stem.removeprefix("test_")
    folder = REPO_ROOT / relative.parent
    itself = [folder / "__init__.py"] if folder.name == stem else []
    return [folder / f"{stem}.py", folder / stem / "__init__.py", *itself]


def test_a_modules_unit_tests_are_found_from_its_path() -> None:
    unit = REPO_ROOT / "tests" / "unit"
    orphans = [
        str(test.relative_to(REPO_ROOT))
        for test in sorted(unit.rglob("test_*.py"))
        if not any(candidate.exists() for candidate in _source_of(test))
    ]
    assert orphans == [], (
        f"unit tests named for no module (tests/unit/<path of the module>/test_<module>.py): "
        f"{orphans}"
    )


def test_the_mirror_rule_is_read_as_documented() -> None:
    # the rule itself, on a module and a package of the repository
    assert REPO_ROOT / "harness/costs/memory.py" in _source_of(
        REPO_ROOT / "tests/unit/harness/costs/test_memory.py"
    )
    assert REPO_ROOT / "harness/config/schema.py" in _source_of(
        REPO_ROOT / "tests/unit/harness/config/test_schema.py"
    )
