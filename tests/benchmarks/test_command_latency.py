"""Benchmarks (pytest-benchmark; `-m perf`): how long a command makes a person wait (issue 26).

Each command runs as a user types it, in a fresh interpreter, one round after another (never
two at once), on a quiet machine: `python -m harness --help`, a TAB of bash's completion
(what the function `-sc install=bash` installs runs: `-sc query=bash` with COMP_LINE), bad
input refused in one line, and the dry run of the thesis grid (480 cells composed, checked and
predicted), with and without its pipelines' layer counts kept. Targets (issue 26): --help
under 1 s, a TAB under 0.5 s, the dry run under 5 s.

Run: .venv/bin/python -m pytest tests/benchmarks/test_command_latency.py -m perf
     --benchmark-enable -s
The medians and spreads are printed and attached to the benchmark JSON (extra_info);
BENCHMARKS.md section 16 keeps them.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.perf

ROUNDS = 5
LINE = "distbench distribution=ddp hardware="  # a TAB after `hardware=`

# name: (module, its arguments, environment, the exit status it must end with)
COMMANDS = {
    "help": ("harness", ["--help"], {}, 0),
    "tab": ("harness", ["-sc", "query=bash"], {"COMP_LINE": LINE,
                                               "COMP_POINT": str(len(LINE))}, 0),
    "bad input": ("harness", ["dataset=nope"], {}, 2),
    # the other commands' help, and a command of overrides refusing bad input
    "recommend help": ("harness.recommend", ["--help"], {}, 0),
    "analysis help": ("harness.analysis", ["--help"], {}, 0),
    "describe help": ("harness.describe", ["--help"], {}, 0),
    "probe help": ("harness.probe", ["--help"], {}, 0),
    "describe bad input": ("harness.describe", ["network=resnet19"], {}, 2),
}


def _seconds(args: list[str], environment: dict[str, str], status: int, cwd: Path,
             module: str = "harness") -> float:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", module, *args], cwd=cwd,
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, **environment})
    took = time.perf_counter() - started
    assert done.returncode == status, done.stderr[-2000:]
    return took


@pytest.mark.parametrize("name", list(COMMANDS))
def test_a_command_answers_at_once(benchmark, tmp_path: Path, name: str) -> None:  # noqa: ANN001
    module, args, environment, status = COMMANDS[name]
    _seconds(args, environment, status, tmp_path, module)  # warm the file system's caches
    rounds = [_seconds(args, environment, status, tmp_path, module) for _ in range(ROUNDS)]
    median = statistics.median(rounds)
    benchmark.extra_info.update(median_s=median, spread_s=max(rounds) - min(rounds))
    benchmark.pedantic(lambda: None, rounds=1)
    print(f"python -m {module} {' '.join(args)}: median {median:.2f} s over {ROUNDS} "
          f"(min {min(rounds):.2f}, max {max(rounds):.2f})")


@pytest.mark.parametrize("layer_counts", ["none kept", "kept"])
def test_the_thesis_grids_dry_run(benchmark, tmp_path: Path,  # noqa: ANN001
                                  layer_counts: str) -> None:
    """Where no pipeline's layer count is kept (a machine that never ran a pipeline cell of
    these workloads: the suite's cache), checking the grid's pipelines loads torch to count
    them; where they are kept (a pipeline cell's workers keep its count), nothing does."""
    if layer_counts == "kept":
        _keep_the_grids_layer_counts()
    args = ["+sweep=thesis_grid", "--dry-run"]
    _seconds(args, {}, 0, tmp_path)  # warm the file system's caches
    rounds = [_seconds(args, {}, 0, tmp_path) for _ in range(3)]
    median = statistics.median(rounds)
    benchmark.extra_info.update(median_s=median, spread_s=max(rounds) - min(rounds))
    benchmark.pedantic(lambda: None, rounds=1)
    print(f"python -m harness +sweep=thesis_grid --dry-run, layer counts {layer_counts}: "
          f"median {median:.2f} s over 3 (min {min(rounds):.2f}, max {max(rounds):.2f})")


def _keep_the_grids_layer_counts() -> None:
    """What the workers of the grid's pipeline cells would have kept in the cache."""
    from workloads.datasets.spec import DATASET_SPECS
    from workloads.networks.layer_counts import remembered_layer_count
    from workloads.networks.ref import NetworkRef

    for dataset in ("mnist", "cifar10", "imagenet", "highres"):
        for network in ("resnet18", "resnet50", "resnet152", "vgg11", "vgg16", "mobilenetv2"):
            remembered_layer_count(NetworkRef.builtin(network), DATASET_SPECS[dataset],
                                   os.environ["DISTBENCH_CACHE_DIR"])
