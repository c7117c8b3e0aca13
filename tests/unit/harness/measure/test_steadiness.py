"""The steadiness record's arithmetic (`harness.measure.steadiness.Steadiness`); the kernels and
whole cells are tests/integration/test_steadiness.py's."""

from __future__ import annotations

import pytest

from harness.measure.steadiness import Steadiness


def test_a_memory_kernel_a_worker_could_not_time_is_left_out_of_the_record() -> None:
    # 0: the worker's memory limit left no room for the kernel's arrays after its last epoch
    # (harness.worker.run): the cell is steady or not by its reference kernel alone, and no
    # memory figure is recorded rather than a drift of -100 %
    steadiness = Steadiness(
        reference_before=[0.020, 0.021],
        reference_after=[0.021, 0.021],
        repeat_epochs=[[1.0]],
        threshold=0.10,
        memory_before=[0.030, 0.031],
        memory_after=[0.032, 0.0],
    )
    assert steadiness.steady
    assert steadiness.memory_drift == pytest.approx(0.032 / 0.030 - 1)
    assert "memory_kernel_ms_after" not in steadiness.metrics()
    assert "memory-bound" not in steadiness.text()


def test_a_memory_kernel_every_worker_timed_is_recorded_not_judged() -> None:
    steadiness = Steadiness(
        reference_before=[0.020],
        reference_after=[0.020],
        repeat_epochs=[[1.0]],
        threshold=0.10,
        memory_before=[0.030],
        memory_after=[0.060],
    )
    assert steadiness.steady  # +100 % on the memory-bound kernel: recorded, not judged
    assert steadiness.metrics()["memory_kernel_drift"] == pytest.approx(1.0)
    assert steadiness.metrics()["memory_kernel_ms_after"] == pytest.approx(60.0)
    assert "memory-bound kernel +100.0% (not judged)" in steadiness.text()
