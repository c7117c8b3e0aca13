"""Step times of one workload at two batches contradict each other only where the larger
batch's step took less time beyond both spreads; a contradiction is said beside the source."""

from __future__ import annotations

from harness.profiles.steps import MeasuredStep, StepTime, contradict


def _step(batch: int, seconds: float, low: float | None, high: float | None) -> StepTime:
    return StepTime(batch, seconds, "facts file f.json", batch, low=low, high=high)


def test_a_larger_batch_faster_beyond_both_spreads_contradicts() -> None:
    assert contradict(_step(1, 0.0062, 0.0060, 0.0065), _step(2, 0.0016, 0.0015, 0.0017))


def test_overlapping_spreads_or_a_slower_larger_batch_do_not() -> None:
    assert not contradict(_step(1, 0.0062, 0.0050, 0.0065), _step(2, 0.0055, 0.0045, 0.0061))
    assert not contradict(_step(1, 0.0016, 0.0015, 0.0017), _step(2, 0.0062, 0.0060, 0.0065))
    # without quartiles (an MLflow cell's one number), the numbers themselves
    assert contradict(_step(2, 0.010, None, None), _step(4, 0.009, None, None))
    assert not contradict(_step(4, 0.010, None, None), _step(2, 0.001, None, None))


def test_a_contradicting_step_says_so_beside_its_source_and_a_scaled_one_does_not() -> None:
    kept = MeasuredStep(4, 0.002, "facts file f.json", contradicts=2)
    said = kept.at(4).describe()
    assert "facts file f.json (contradicts batch 2: the step at batch 4 took less time" in said
    assert "--remeasure" in said
    assert kept.at(8).contradicts is None  # scaled to another batch, it contradicts nothing
