"""A step time the recommender probes while the machine's speed changes is timed again, and
refused if it stays so: never kept, since every later prediction would reuse it. The step is
really trained and timed; the disturbance is the one part stood in for: the reference kernel's
clock reports a machine that slows down around the probe (a real competing load, as
tests/integration/test_steadiness.py starts around a cell, would make this test as slow and
as noisy as the machine it disturbs)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import harness.measure.steadiness as steadiness
from harness.cli.errors import StateError
from harness.commands.compose import compose_config
from harness.config.schema import validate
from harness.worker.measurements import PROBE_ATTEMPTS, WorkerMeasurements

CELL = [
    "dataset=mnist",
    "network=mobilenetv2",
    "dataset.num_samples=16",
    "distribution.batch_size=8",
    "run.progress=false",
]


def _kernel(readings: list[float]) -> Iterator[float]:
    yield from readings


@pytest.mark.parametrize(
    ("readings", "attempts"),
    [
        ([0.010, 0.010], 1),  # steady: timed once
        ([0.010, 0.020, 0.010, 0.0105], 2),  # disturbed once (+100 %), then steady
    ],
)
def test_a_step_timed_while_the_machine_changes_speed_is_timed_again(
    monkeypatch: pytest.MonkeyPatch, readings: list[float], attempts: int
) -> None:
    kernel = _kernel(readings)
    monkeypatch.setattr(steadiness, "reference_seconds", lambda device: next(kernel))
    timing = WorkerMeasurements().step_time(
        validate(compose_config(CELL)), 2, threads=1, probe_batches=2, spread=0.0
    )
    assert timing.median_s > 0 and timing.batches == 2
    assert timing.reference_ms == pytest.approx(1e3 * sum(readings[-2:]) / 2)
    assert next(kernel, None) is None  # every reading taken: `attempts` probes
    assert len(readings) == 2 * attempts


def test_a_step_that_stays_disturbed_is_refused_not_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    kernel = _kernel([0.010, 0.0175] * PROBE_ATTEMPTS)  # +75 % every time
    monkeypatch.setattr(steadiness, "reference_seconds", lambda device: next(kernel))
    with pytest.raises(StateError) as refused:
        WorkerMeasurements().step_time(
            validate(compose_config(CELL)), 2, threads=1, probe_batches=2, spread=0.0
        )
    message = str(refused.value)
    assert f"timed {PROBE_ATTEMPTS} times and the machine's speed changed each time" in message
    assert "+75%, +75%, +75%" in message and "nothing was kept" in message
