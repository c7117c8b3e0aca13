"""A step time the recommender probes while the machine's speed changes is timed again, and
where it stays so the steadiest timing is kept marked with how much the speed changed, which
every later use of it says. The step is really trained and timed; the disturbance is the one
part stood in for: the reference kernel's clock reports a machine that slows down around the
probe (a real competing load, as tests/integration/test_steadiness.py starts around a cell,
would make this test as slow and as noisy as the machine it disturbs)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import harness.measure.steadiness as steadiness
from harness.commands.compose import compose_config
from harness.config.schema import validate
from harness.worker.measurements import WorkerMeasurements

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


def test_a_step_that_stays_disturbed_is_kept_marked_and_said_wherever_used(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from harness.predict.facts.store import FactsStore

    kernel = _kernel([0.010, 0.0175, 0.010, 0.014, 0.010, 0.016])  # +75 %, +40 %, +60 %
    monkeypatch.setattr(steadiness, "reference_seconds", lambda device: next(kernel))
    timing = WorkerMeasurements().step_time(
        validate(compose_config(CELL)), 2, threads=1, probe_batches=2, spread=0.0
    )
    assert timing.unsteady_drift == pytest.approx(0.40)  # the steadiest of the three
    path = tmp_path / "facts.json"
    store = FactsStore.load(path, "local_cpu")
    for batch, change in ((2, timing.unsteady_drift), (4, -0.107)):  # faster after: either sign
        store.record_step(
            network="n",
            dataset="d",
            device="cpu",
            batch=batch,
            seconds=timing.median_s,
            speed_change=change,
        )
    store.save()
    kept = FactsStore.load(path, "local_cpu").steps("n", "d", "cpu", None)  # read back
    assert "measured while the machine's speed changed by +40%" in kept[0].source
    assert "measured while the machine's speed changed by -11%" in kept[1].source
