"""The command fuzzer's long profile: LONG_DRAWS drawn command lines through every command's real
entry point, each refused in one line with exit status 2 and nothing written, or run as promised,
and no file outside the temporary root (tests/fuzz/test_commands.py has the property, the short
profile the suite runs and the regression cases). A benchmark:
`python -m pytest -m perf tests/benchmarks/test_fuzz_commands_long.py` (BENCHMARKS.md, "Faults and
bad input held", has its time)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fuzz.test_commands import assert_kept_every_promise, fuzz_in_subprocess

pytestmark = pytest.mark.perf

LONG_DRAWS = 10_000


@pytest.mark.timeout(4 * 3600)
def test_ten_thousand_command_lines_are_refused_in_one_line_or_run_as_promised(
    tmp_path: Path,
) -> None:
    report = fuzz_in_subprocess(tmp_path, LONG_DRAWS, timeout_s=4 * 3600)
    assert report["draws"] >= LONG_DRAWS // 2
    assert_kept_every_promise(report)
