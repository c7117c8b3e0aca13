"""Shared fixtures: every test gets its own output root, MLflow store and dataset cache; the
SLURM tests share the local cluster's fixture."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import SLURM_SCRIPT, install_slurm_where_missing

# The suite keeps both cores busy from start to end, with more torch threads than cores (two
# test processes, each cell's workers, the forkserver's): OpenMP threads that spin while they
# wait for each other burn the CPU the others need (a saved-activations measurement took 1.74
# CPU-s spinning, 0.30 passive, at the suite's load). Passive waiting changes no result, only
# who gets the cores; set before anything imports torch, and inherited by every child.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# The whole suite's time budget on a usual 2-core host (its reference kernel at 17-30 ms), so
# that CI (2 cores, no GPU, hosts up to three times slower) stays well inside its 90 minutes
# (BENCHMARKS.md, "How long commands take, and the test suite").
# A run of the whole suite that takes longer says so at its end, with what to do: the guard
# reports and fails nothing, since a slow machine is no bug of the code.
SUITE_BUDGET_S = 15 * 60
_SUITE_STARTED = time.monotonic()


# The suite runs in two processes (pytest-xdist, `-n 2` in pyproject.toml), each test module
# whole in one of them (its module-scoped fixtures, a cluster or a table of runs, are built
# once). The modules that bring up a SLURM cluster (the loopback one, or the emulated nodes,
# which stop it first) run in one process, one after another: this machine has one /etc/slurm
# and one set of daemons. They go first, being the longest unit of work.
CLUSTER_MODULES = (
    "tests/integration/test_slurm.py",
    "tests/integration/test_slurm_plugin_config.py",
    "tests/integration/test_emulated_nodes.py",
    "tests/benchmarks/test_emulated_faults.py",
    "tests/benchmarks/test_fsdp_units_across_nodes.py",
)
_CLUSTER_FIXTURES = frozenset({"slurm_cluster", "emulated_nodes"})
# Then the longest modules, longest first (their time on 2026-12-07, about 40-150 s each), and
# the rest in pytest's order: many short modules last, so that the two processes end within
# seconds of each other instead of one finishing a long module alone (xdist's own reordering,
# by the number of tests in a module, put the longest module near the end).
LONGEST_MODULES = (
    "tests/integration/test_analysis.py",
    "tests/integration/test_open_networks.py",
    "tests/integration/test_trajectories.py",
    "tests/unit/harness/distributions/test_fsdp.py",
    "tests/faults/test_bad_input.py",
    "tests/integration/test_distributed.py",
    "tests/faults/test_cells_that_hang_or_crash.py",
    "tests/unit/harness/distributions/test_pipedream.py",
)


def pytest_configure(config: pytest.Config) -> None:
    """Benchmarks (`-m perf`) run in one process, one at a time: side by side they would time
    each other (and pytest-benchmark measures nothing under xdist)."""
    marks = config.option.markexpr or ""
    if "perf" in marks and "not perf" not in marks:
        config.option.numprocesses, config.option.dist, config.option.tx = 0, "no", []
    config.option.loadscopereorder = False  # modules in the order below (LONGEST_MODULES)


@pytest.hookimpl(trylast=True)  # on the tests selected (-m)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The cluster modules first, then the longest modules; a module that brings up a cluster
    must be one of the cluster modules."""

    def module(item: pytest.Item) -> str:
        return item.nodeid.split("::", 1)[0]

    unlisted = {
        module(item)
        for item in items
        if _CLUSTER_FIXTURES & set(getattr(item, "fixturenames", ()))
        and module(item) not in CLUSTER_MODULES
    }
    if unlisted:
        raise pytest.UsageError(
            f"{', '.join(sorted(unlisted))} bring(s) up a SLURM cluster: "
            f"add them to CLUSTER_MODULES in tests/conftest.py"
        )

    def rank(item: pytest.Item) -> tuple[bool, int]:
        name = module(item)
        longest = LONGEST_MODULES.index(name) if name in LONGEST_MODULES else len(LONGEST_MODULES)
        return name not in CLUSTER_MODULES, longest

    items.sort(key=rank)  # stable: within a rank, pytest's order


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """xdist's scheduling by file, the cluster modules as one unit. (Its `loadgroup` marks
    are ignored under pytest 9.2: pytest-dev/pytest-xdist#1386.)"""
    from xdist.scheduler import LoadFileScheduling

    class ModulesOneClusterAtATime(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = super()._split_scope(nodeid)
            return "one SLURM cluster at a time" if module in CLUSTER_MODULES else module

    return ModulesOneClusterAtATime(config, log)  # type: ignore[arg-type]


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    took = time.monotonic() - _SUITE_STARTED
    if took <= SUITE_BUDGET_S:
        return
    terminalreporter.write_sep("!", "over the suite's time budget", yellow=True)
    terminalreporter.write_line(
        f"distbench: the tests took {took / 60:.1f} min, over the suite's budget of "
        f"{SUITE_BUDGET_S / 60:.0f} min on CI (tests/conftest.py SUITE_BUDGET_S); the slowest "
        f"are listed above (--durations): shrink them (tiny grids, shared servers per module) "
        f"or move a measurement of scale to tests/benchmarks (-m perf)"
    )
    # The suite's time scales with the host: on one whose reference kernel read 93 ms it took
    # 46 min, where 21 min on hosts at 17-30 ms (BENCHMARKS.md, "How long commands take, and the
    # test suite"). Timed now, after the tests, on a quiet machine: which of the two the overrun is.
    from harness.measure.steadiness import reference_seconds

    terminalreporter.write_line(
        f"distbench: this host's reference kernel (harness/measure/steadiness.py) reads "
        f"{reference_seconds() * 1e3:.0f} ms now, 17-30 ms on the hosts the budget was measured "
        f"on: where it reads several times that, the host got slower, not only the suite"
    )


@pytest.fixture(autouse=True)
def isolated_environment(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Keep tests off the user's ~/.cache and MLflow settings."""
    cache = tmp_path_factory.getbasetemp() / "dataset-cache"  # shared: generated once per test run
    monkeypatch.setenv("DISTBENCH_CACHE_DIR", str(cache))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("DISTBENCH_PARENT_RUN_ID", raising=False)


@pytest.fixture
def output_root(tmp_path: Path) -> Path:
    root = tmp_path / "outputs"
    root.mkdir()
    return root


# Module scope: each SLURM test module starts the 2-node cluster of scripts/slurm_local.sh for
# its tests and stops it after them.
@pytest.fixture(scope="module")
def slurm_cluster() -> Iterator[None]:
    refused = install_slurm_where_missing()
    if refused is not None:
        pytest.skip(refused)
    started = subprocess.run(
        ["bash", str(SLURM_SCRIPT), "start"], capture_output=True, text=True, timeout=600
    )
    assert started.returncode == 0, started.stdout + started.stderr
    yield
    subprocess.run(["bash", str(SLURM_SCRIPT), "stop"], capture_output=True, timeout=60)


def emulation_unavailable() -> str | None:
    """Why this machine cannot emulate nodes (None if it can): root, iproute2 and a network
    namespace that can really be created."""
    if os.geteuid() != 0:
        return "emulated nodes need root (network namespaces, tc)"
    missing = [tool for tool in ("ip", "tc", "nsenter", "taskset") if shutil.which(tool) is None]
    if missing:
        return f"emulated nodes need {', '.join(missing)}"
    probe = "distbench-nscheck"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    if made.returncode != 0:
        return f"this machine cannot create a network namespace: {made.stderr.strip()}"
    return None


@pytest.fixture(scope="module")
def emulated_nodes(request: pytest.FixtureRequest) -> Iterator[object]:
    """A 2-node emulated SLURM cluster (launchers.emulated) for a module's tests, up before
    them and down after them, leaving nothing behind. Its hardware is the module's
    EMULATED_HARDWARE (default emulated_2nodes_200mbit)."""
    reason = emulation_unavailable()
    if reason is not None:
        pytest.skip(reason)
    refused = install_slurm_where_missing()
    if refused is not None:
        pytest.skip(refused)
    # One SLURM cluster at a time: the loopback one of another module may still run.
    subprocess.run(["bash", str(SLURM_SCRIPT), "stop"], capture_output=True, timeout=120)
    from harness.commands.compose import compose_config
    from harness.config.schema import validate
    from launchers import emulated

    hardware = getattr(request.module, "EMULATED_HARDWARE", "emulated_2nodes_200mbit")
    config = validate(compose_config([f"hardware={hardware}"]))
    cluster = emulated.up(emulated.Cluster.for_hardware(config.hardware))
    try:
        yield cluster
    finally:
        emulated.down()
