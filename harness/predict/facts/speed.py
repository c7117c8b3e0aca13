"""A step time moved to the machine speed a measured cell ran at: a shared host drifts over an
hour, and a cell and the step time it is predicted from were timed at different moments. Both
carry the reference kernel timed around them (`harness.measure.steadiness`); their ratio moves
the one to the other (`harness.analysis` predicts its grid's cells so).
"""

from __future__ import annotations

import math
from dataclasses import replace

from harness.costs.terms import CellFacts
from harness.profiles.steps import StepTime


def speed_ratio(step: StepTime | None, reference_ms: float | None) -> float:
    """How much slower the machine ran a cell than when `step` was measured: the cell's
    reference kernel (`harness.measure.steadiness`) over the one timed around the step time;
    NaN where either was not recorded."""
    if step is None or not step.reference_ms or not reference_ms:
        return float("nan")
    return reference_ms / step.reference_ms


def at_machine_speed(
    facts: CellFacts, step: StepTime | None, reference_ms: float | None
) -> tuple[CellFacts, float]:
    """`facts` with the step time moved to the machine speed a measured cell ran at, and the
    factor (1: left as measured). The factor is `speed_ratio`, where the step time's kernel was
    timed in the sequential cells it comes from: a shared host drifts by tens of percent over
    an hour (here a block of ResNet-50 cells ran with the kernel at 15.4-18.0 ms where the
    cells before it read 13.3-16.9, and its sequential cells' steps were 22-29 % slower than a
    probe's at 13.8 ms).

    A step time probed by the analysing process is left as measured, its kernel only reported
    (`harness.analysis.__main__.speed_lines`): one probe's kernel moved 13.1-14.4 ms between probes
    seconds apart whose step times held still, and scaling by it raised PipeDream's held-out error
    from 3.8 to 5.9 % (docs/benchmarks/2026-11-29-machine-speed-between-cells.md, "The machine's
    speed between the cells (shipped in part) (2026-11-29)")."""
    if facts.stages_in_place is not None:  # timed by workers, as the cells time the kernel
        facts = replace(facts, stages_in_place=facts.stages_in_place.at_speed(reference_ms))
    ratio = speed_ratio(step, reference_ms)
    if step is None or not step.reference_in_cells or not math.isfinite(ratio):
        return facts, 1.0
    return replace(facts, step_seconds=facts.step_seconds * ratio), ratio
