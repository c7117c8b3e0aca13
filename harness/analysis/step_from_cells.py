"""The models judged again, each network's step time taken from its own one-worker cells.

Every prediction stands on a sequential step time. The analysis' main judgement takes it from
a probe of a few batches, timed once, minutes to hours away from the cells: what a
recommendation for a network never measured gets. On a shared host the probe and the cells
then ran at different speeds: on `local_2cpu` two probes' step times were 0.86-1.13 of the
grid's own one-worker cells (two probes four minutes apart disagreed as much), and every cell of
a network carried its probe's miss (docs/benchmarks/2026-11-30-step-from-cells.md, "The
models' own error, apart from the probe's step times (2026-11-30)").

So the models are judged a second time, with the grid's sequential cells as the step time of
their network (measured minutes from its other cells, over as many batches; each cell scaled
by its reference kernel over theirs, `predict.facts.speed.at_machine_speed`), the parameters fitted
the same way, network held out. What error is left is the models' own; the gap between the two
judgements is the step time's. Judged there are the cells whose step time their network's
one-worker cells measured: not the sequential model's (its cells are its step time), nor a
batch no one-worker cell ran (GPipe's micro-batch keeps the probe's step time; its cells are
only predicted, for the recommendations).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from harness.analysis.fit import Accuracy, CellPrediction, accuracy, held_out
from harness.analysis.grid import MeasuredCell
from harness.analysis.recommendations import WorkloadVerdict, judge
from harness.distributions.registry import baseline
from harness.predict.facts.cache import FactsCache, step_time_source
from harness.predict.facts.store import MissingMeasurement


@dataclass(frozen=True)
class StepFromCells:
    """The judgement with each network's step from its own one-worker cells."""

    # Network held out, over the cells whose step time came from their network's one-worker
    # cells, the sequential model's aside.
    table: list[Accuracy]
    verdicts: list[WorkloadVerdict]
    cells: int  # cells predicted from a step time their network's one-worker cells measured
    of: int  # cells in all

    def lines(self) -> list[str]:
        """What the console shows: the errors per model and the recommendations."""
        lines = [
            f"held out by network, each network's step time from its own one-worker "
            f"cells ({self.cells} of {self.of} cells; the models' own error, without "
            f"the probe's drift from the cells):",
            f"{'model':<12}{'cells':>6}{'MAPE %':>8}{'worst %':>9}{'bias %':>8}",
        ]
        lines += [
            f"{row.model:<12}{row.cells:>6}{row.network_mape:>8.1f}"
            f"{row.network_worst:>9.1f}{row.network_bias:>+8.1f}"
            for row in self.table
        ]
        if self.verdicts:
            lines.append(
                f"recommendations right for {self.right} of {len(self.verdicts)} "
                f"workloads that way (worst time lost {self.worst_lost:.1f} %)"
            )
        return lines

    @property
    def right(self) -> int:
        return sum(verdict.correct for verdict in self.verdicts)

    @property
    def worst_lost(self) -> float:
        return max((verdict.time_lost_percent for verdict in self.verdicts), default=0.0)

    def to_json(self) -> dict[str, object]:
        return {
            "cells": self.cells,
            "of": self.of,
            "accuracy": [
                {
                    "model": row.model,
                    "cells": row.cells,
                    "network_mape": row.network_mape,
                    "network_worst": row.network_worst,
                    "network_bias": row.network_bias,
                }
                for row in self.table
            ],
            "recommendations_right": self.right,
            "recommendations": len(self.verdicts),
            "worst_time_lost_percent": self.worst_lost,
        }


def cells_step_cache(cache: FactsCache) -> FactsCache:
    """A cache that takes step times from the grid's one-worker cells first and times nothing,
    sharing what `cache` measured besides step times (layer profiles, stages in place,
    memory facts)."""
    return replace(
        cache,
        policy=replace(cache.policy, steps_from_cells=True, probe=False, time_in_place=False),
        step_seconds={},
        sources={},
        recorded={},
        measured=[],
    )


def judge_with_steps_from_cells(
    cells: Sequence[MeasuredCell],
    cache: FactsCache,
    predict: Callable[[FactsCache], list[CellPrediction]],
    *,
    fit_on: Callable[[MeasuredCell], bool],
    noise_percent: float,
) -> StepFromCells | None:
    """The second judgement (module docstring); None where no cell's step time came from its
    network's one-worker cells (a grid without sequential cells), or where a step time the
    main judgement probed was not kept (an unwritable facts file) and is not to be had without
    timing it again: the main judgement stands, and this one is not made."""
    at_cells = cells_step_cache(cache)
    try:
        predictions = predict(at_cells)
    except MissingMeasurement as missing:
        print(
            f"distbench: not judged with the one-worker cells' step times: {missing}",
            file=sys.stderr,
            flush=True,
        )
        return None
    from_cells = {p.cell.run_id for p in predictions if _step_from_cells(p, at_cells)}
    if not from_cells:
        return None
    by_network = held_out(predictions, group=lambda cell: cell.network, fit_on=fit_on)
    judged = [
        p for p in by_network if p.cell.run_id in from_cells and p.cell.model != baseline().name
    ]
    table = [row for row in accuracy(judged, judged) if math.isfinite(row.network_mape)]
    verdicts = judge(
        [p for p in by_network if p.fitted_from > 0],
        errors={row.model: row.network_mape for row in table},
        noise_percent=noise_percent,
    )
    return StepFromCells(table, verdicts, len(from_cells), len(predictions))


def _step_from_cells(prediction: CellPrediction, cache: FactsCache) -> bool:
    step = step_time_source(prediction.cell.config, cache)
    return step is not None and step.reference_in_cells
