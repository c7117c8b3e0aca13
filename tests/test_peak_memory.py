"""A worker's peak memory (`harness.metrics.PeakMemory`): what runs `left_out()` (the steadiness
check's reference kernel) is no part of it, and the peak before such a block is kept. On the
CPU, through the process's resettable RSS high-water mark; on CUDA, the allocator's peak
(tests/test_cuda.py, where a GPU is)."""

from __future__ import annotations

import pytest
import torch

from harness.metrics import PeakMemory

BLOCK_MB = 400  # far above the RSS noise of a test process; freed back to the kernel (mmap)


def _touch(megabytes: int) -> None:
    """Hold `megabytes` of written pages for a moment, then free them."""
    block = torch.ones(megabytes * 2**20 // 4, dtype=torch.float32)
    del block


def test_work_left_out_is_no_part_of_the_peak_and_the_peak_before_it_stays() -> None:
    memory = PeakMemory(torch.device("cpu"))
    memory.reset()
    if memory.kind != "process_peak_rss":
        pytest.skip("this kernel does not let a process reset its RSS high-water mark")
    start = memory.peak_mb()
    with memory.left_out():
        _touch(BLOCK_MB)
    assert memory.peak_mb() < start + BLOCK_MB / 4  # the block's pages are not counted
    _touch(BLOCK_MB)
    counted = memory.peak_mb()
    assert counted > start + BLOCK_MB * 3 / 4  # outside a left-out block they are
    with memory.left_out():
        pass
    assert memory.peak_mb() >= counted  # the peak measured before the block is kept
    memory.reset()
    assert memory.peak_mb() < start + BLOCK_MB / 4  # a reset forgets it
