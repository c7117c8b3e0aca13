"""Benchmarks (pytest-benchmark; `-m perf`): how long a command makes a person wait.

Each command runs as a user types it, in a fresh interpreter, one round after another (never two at
once), on a quiet machine: `python -m harness --help`, a TAB of bash's completion (what the function
`-sc install=bash` installs runs: `-sc query=bash` with COMP_LINE), bad input refused in one line,
and the dry run of the thesis grid (480 cells composed, checked and predicted; the built-in
networks' layer counts are kept with the code). Targets: --help under 1 s, a TAB under 0.5 s, the
dry run under 5 s.

Run: .venv/bin/python -m pytest tests/benchmarks/test_command_latency.py -m perf
     --benchmark-enable -s
The medians and spreads are printed and attached to the benchmark JSON (extra_info);
BENCHMARKS.md, "How long commands take, and the test suite", keeps the latest; the first are in
docs/benchmarks/2026-11-27-command-latency.md, "How long a command makes a person wait, and the
suite's time (2026-11-27)".
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
    "tab": ("harness", ["-sc", "query=bash"], {"COMP_LINE": LINE, "COMP_POINT": str(len(LINE))}, 0),
    "bad input": ("harness", ["dataset=nope"], {}, 2),
    # the other commands' help, and a command of overrides refusing bad input
    "recommend help": ("harness.recommend", ["--help"], {}, 0),
    "analysis help": ("harness.analysis", ["--help"], {}, 0),
    "describe help": ("harness.describe", ["--help"], {}, 0),
    "probe help": ("harness.probe", ["--help"], {}, 0),
    "describe bad input": ("harness.describe", ["network=resnet19"], {}, 2),
}


def _seconds(
    args: list[str], environment: dict[str, str], status: int, cwd: Path, module: str = "harness"
) -> float:
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **environment},
    )
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
    print(
        f"python -m {module} {' '.join(args)}: median {median:.2f} s over {ROUNDS} "
        f"(min {min(rounds):.2f}, max {max(rounds):.2f})"
    )


def test_the_thesis_grids_dry_run(benchmark, tmp_path: Path) -> None:  # noqa: ANN001
    """On a machine that never ran a pipeline cell (the suite's cache is empty): the grid's
    pipelines are checked from the layer counts kept with the code, so nothing loads torch."""
    args = ["+sweep=thesis_grid", "--dry-run"]
    _seconds(args, {}, 0, tmp_path)  # warm the file system's caches
    rounds = [_seconds(args, {}, 0, tmp_path) for _ in range(3)]
    median = statistics.median(rounds)
    benchmark.extra_info.update(median_s=median, spread_s=max(rounds) - min(rounds))
    benchmark.pedantic(lambda: None, rounds=1)
    print(
        f"python -m harness +sweep=thesis_grid --dry-run: "
        f"median {median:.2f} s over 3 (min {min(rounds):.2f}, max {max(rounds):.2f})"
    )


# A worker's imports, then its last act: the wall clock, written where the parent reads it.
_LAST_LINE = (
    "import os, time\n"
    "import harness.worker, harness.distributions.registry, torch, torchvision, mlflow\n"
    "os.write(2, repr(time.time()).encode())\n"
)


def _exit_seconds(cwd: Path) -> float:
    """Seconds from a process's last line to its exit, as its parent sees it."""
    done = subprocess.run(
        [sys.executable, "-c", _LAST_LINE], cwd=cwd, capture_output=True, text=True, timeout=600
    )
    ended = time.time()
    assert done.returncode == 0, done.stderr[-2000:]
    return ended - float(done.stderr.strip().splitlines()[-1])


def test_a_process_that_imported_torch_exits_at_once(benchmark, tmp_path: Path) -> None:  # noqa: ANN001
    """The exit every command, worker and probe pays after its work (`harness/__init__.py`'s
    exit hook: 1.5-1.8 s without it on the calibration VM, 0.3-0.5 s with it)."""
    _exit_seconds(tmp_path)  # warm the file system's caches
    rounds = [_exit_seconds(tmp_path) for _ in range(ROUNDS)]
    median = statistics.median(rounds)
    benchmark.extra_info.update(median_s=median, spread_s=max(rounds) - min(rounds))
    benchmark.pedantic(lambda: None, rounds=1)
    print(
        f"exit after a worker's imports: median {median:.2f} s over {ROUNDS} "
        f"(min {min(rounds):.2f}, max {max(rounds):.2f})"
    )
