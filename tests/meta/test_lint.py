"""ruff (lint and format) and mypy on the code, as configured in pyproject.toml, with no finding:
the suite (the README's test command) runs them, so CI does."""

from __future__ import annotations

import subprocess
import sys

from tests.helpers import REPO_ROOT

ROOT = REPO_ROOT


def _run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *command], cwd=ROOT, capture_output=True, text=True, timeout=600
    )


def test_ruff_finds_nothing() -> None:
    done = _run("ruff", "check", "--no-cache", ".")
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]


def test_the_code_is_formatted_as_ruff_formats_it() -> None:
    # `ruff format .` once, then this check: a diff in review is a change, never a restyling
    done = _run("ruff", "format", "--check", "--no-cache", ".")
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]


def test_mypy_finds_nothing() -> None:
    # its cache under the repository's .mypy_cache (ignored by git): a second run is quick
    done = _run("mypy")
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
