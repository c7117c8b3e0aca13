"""The measurement noise floor of a grid: how much two measurements of the same cell differ.

A model's error on a cell cannot be told from the cell's own noise below that floor, so the
analysis states every model's error beside it. Two kinds of repeated measurement give it:

- a cell of `run.repeats` >= 2: its repeats' standard deviation s over their mean m; two
  independent draws of a normal variable differ by 2 s / sqrt(pi) = 1.128 s on average, so the
  cell's expected difference between two measurements is 1.128 s / m;
- a cell measured more than once (the same cell key in several runs, e.g. a sweep measured
  again): the mean absolute difference between its runs' seconds per epoch, over their mean.

The floor is the median of those per-cell figures (per model, and over the grid).
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from harness.analysis.grid import MeasuredCell

# E|X - Y| for X, Y independent normal with standard deviation s: 2 s / sqrt(pi).
EXPECTED_DIFFERENCE_PER_STD = 2 / math.sqrt(math.pi)


@dataclass(frozen=True)
class NoiseFloor:
    """The typical relative difference between two measurements of one cell, in percent, and
    how many cells it was measured on (0: not measured, `percent` NaN)."""

    percent: float
    cells: int

    @property
    def measured(self) -> bool:
        return self.cells > 0

    def text(self) -> str:
        if not self.measured:
            return ("noise floor: not measured (no cell measured twice: run.repeats=2 or more, "
                    "or measure the sweep again)")
        return (f"noise floor: {self.percent:.1f} % (median difference between two measurements "
                f"of the same cell, over {self.cells} cell(s))")


def cell_differences(cells: Sequence[MeasuredCell]) -> dict[str, float]:
    """Per cell key, the expected relative difference between two of its measurements
    (percent), from its repeats and from its runs."""
    by_key: dict[str, list[MeasuredCell]] = {}
    for cell in cells:
        by_key.setdefault(cell.cell_key or cell.run_id, []).append(cell)
    differences = {}
    for key, runs in by_key.items():
        figures = [EXPECTED_DIFFERENCE_PER_STD * cell.repeat_std / cell.seconds_per_epoch * 100
                   for cell in runs if cell.repeat_std is not None and cell.seconds_per_epoch > 0]
        seconds = [cell.seconds_per_epoch for cell in runs]
        if len(seconds) >= 2:
            pairs = list(itertools.combinations(seconds, 2))
            figures.append(statistics.fmean(abs(a - b) for a, b in pairs)
                           / statistics.fmean(seconds) * 100)
        if figures:
            differences[key] = statistics.fmean(figures)
    return differences


def noise_floor(cells: Sequence[MeasuredCell]) -> NoiseFloor:
    """The grid's noise floor (module docstring)."""
    differences = list(cell_differences(cells).values())
    if not differences:
        return NoiseFloor(float("nan"), 0)
    return NoiseFloor(statistics.median(differences), len(differences))


def noise_floor_per_model(cells: Sequence[MeasuredCell]) -> dict[str, NoiseFloor]:
    return {model: noise_floor([cell for cell in cells if cell.model == model])
            for model in sorted({cell.model for cell in cells})}
