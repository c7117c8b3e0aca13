"""A worker's peak memory (`harness.measure.metrics.PeakMemory`): what runs `left_out()` (the
steadiness check's reference kernel) is no part of it, and the peak before such a block is kept. On
the CPU, through the process's resettable RSS high-water mark; on CUDA, the allocator's peak
(tests/integration/test_cuda.py, where a GPU is)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers import REPO_ROOT

BLOCK_MB = 400  # far above the RSS noise of a test process; freed back to the kernel (mmap)


def test_work_left_out_is_no_part_of_the_peak_and_the_peak_before_it_stays() -> None:
    """In a fresh process, as a cell's worker measures: a test process late in the suite holds
    freed memory still resident (2.5 GB in one CI run), which a new block reuses without
    raising the high-water mark, so that the block outside `left_out()` went uncounted there."""
    done = subprocess.run(
        [sys.executable, "-c", _IN_A_FRESH_PROCESS],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
    )
    if "SKIP:" in done.stdout:
        pytest.skip(done.stdout.split("SKIP:", 1)[1].strip())
    assert done.returncode == 0, done.stderr[-3000:]


_IN_A_FRESH_PROCESS = f"""
import sys
import torch
from harness.measure.metrics import PeakMemory

BLOCK_MB = {BLOCK_MB}


def _touch(megabytes):
    block = torch.ones(megabytes * 2**20 // 4, dtype=torch.float32)
    del block


memory = PeakMemory(torch.device("cpu"))
memory.reset()
if memory.kind != "process_peak_rss":
    print("SKIP: this kernel does not let a process reset its RSS high-water mark")
    sys.exit(0)
start = memory.peak_mb()
with memory.left_out():
    _touch(BLOCK_MB)
assert memory.peak_mb() < start + BLOCK_MB / 4  # the block's pages are not counted
_touch(BLOCK_MB)
counted = memory.peak_mb()
assert counted > start + BLOCK_MB * 3 / 4, (counted, start)  # outside a left-out block they are
with memory.left_out():
    pass
assert memory.peak_mb() >= counted  # the peak measured before the block is kept
memory.reset()
assert memory.peak_mb() < start + BLOCK_MB / 4  # a reset forgets it
"""
