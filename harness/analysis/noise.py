"""The measurement noise floor of a grid: how much two measurements of the same cell differ.

A model's error on a cell cannot be told from the cell's own noise below that floor, so the
analysis states every model's error beside it. Two kinds of repeated measurement give it:

- a cell of `run.repeats` >= 2: its repeats' standard deviation s over their mean m; two
  independent draws of a normal variable differ by 2 s / sqrt(pi) = 1.128 s on average, so the
  cell's expected difference between two measurements is 1.128 s / m;
- a cell measured more than once (the same cell key in several runs, e.g. a sweep measured
  again): the mean absolute difference between its steady runs' seconds per epoch, over their
  mean. A run measured while the machine was unsteady (`harness.measure.steadiness`) is left out of
  this figure: the cells re-measured because they were unsteady were chosen for being noisy,
  and their first run is what a fit can leave out (`--exclude-unsteady`); cells re-measured
  at random (`hydra.launcher.remeasure_sample`) give the floor a next run is judged against.

The floor is the median of those per-cell figures (per model, and over the grid). The two
kinds are also stated apart, since they are not the same noise: back-to-back repeats share the
machine's state (its clock, its neighbours, its caches), separate runs do not. On the emulated
calibration (docs/benchmarks/2026-11-28-commands-and-suite.md, "The suite in two processes; a prompt
cell's launcher without torch; the noise floor by kind (2026-11-28)") repeats differed by a median
0.9 %, and the 11 cells measured in two runs, each because its first run was unsteady, by 8.6 %; an
error can only be judged against the floor of the kind of measurement it will be compared with,
which for a recommendation is another run: where it is measured, the recommender's ties use it
(`harness.analysis.calibration`).
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
class Floor:
    """The median relative difference between two measurements of one cell, in percent, and
    how many cells it was measured on (0: not measured, `percent` NaN)."""

    percent: float
    cells: int

    @property
    def measured(self) -> bool:
        return self.cells > 0

    @classmethod
    def of(cls, differences: Sequence[float]) -> Floor:
        if not differences:
            return cls(float("nan"), 0)
        return cls(statistics.median(differences), len(differences))

    def part(self, kind: str) -> str:
        return (
            f"{kind} {self.percent:.1f} % ({self.cells} cell(s))"
            if self.measured
            else f"{kind} not measured"
        )


@dataclass(frozen=True)
class NoiseFloor(Floor):
    """The noise floor from both kinds of repeated measurement (`percent`, `cells`), and from
    each kind apart: `repeats` (back to back, within one run) and `runs` (separate runs)."""

    repeats: Floor = Floor(float("nan"), 0)
    runs: Floor = Floor(float("nan"), 0)

    def text(self) -> str:
        if not self.measured:
            return (
                "noise floor: not measured (no cell measured twice: run.repeats=2 or more, "
                "or measure the sweep again)"
            )
        return (
            f"noise floor: {self.percent:.1f} % (median difference between two measurements "
            f"of the same cell, over {self.cells} cell(s); "
            f"{self.repeats.part('between repeats of one run')}, "
            f"{self.runs.part('between runs')})"
        )


@dataclass(frozen=True)
class CellNoise:
    """One cell's expected relative difference between two of its measurements (percent): from
    its repeats (the mean over its runs), from its runs (None: not measured that way), and
    from both (the mean of every figure: one per run with repeats, one for its runs)."""

    repeats: float | None
    runs: float | None
    both: float


def cell_noise(cells: Sequence[MeasuredCell]) -> dict[str, CellNoise]:
    """Per cell key, the expected relative difference between two of its measurements."""
    by_key: dict[str, list[MeasuredCell]] = {}
    for cell in cells:
        by_key.setdefault(cell.cell_key or cell.run_id, []).append(cell)
    noise = {}
    for key, runs in by_key.items():
        repeat_figures = [
            EXPECTED_DIFFERENCE_PER_STD * cell.repeat_std / cell.seconds_per_epoch * 100
            for cell in runs
            if cell.repeat_std is not None and cell.seconds_per_epoch > 0
        ]
        seconds = [cell.seconds_per_epoch for cell in runs if cell.steady]
        run_figure = None
        if len(seconds) >= 2:
            pairs = list(itertools.combinations(seconds, 2))
            run_figure = (
                statistics.fmean(abs(a - b) for a, b in pairs) / statistics.fmean(seconds) * 100
            )
        figures = [*repeat_figures, *([] if run_figure is None else [run_figure])]
        if figures:
            noise[key] = CellNoise(
                statistics.fmean(repeat_figures) if repeat_figures else None,
                run_figure,
                statistics.fmean(figures),
            )
    return noise


def noise_floor(cells: Sequence[MeasuredCell]) -> NoiseFloor:
    """The grid's noise floor (module docstring)."""
    noise = list(cell_noise(cells).values())
    both = Floor.of([cell.both for cell in noise])
    return NoiseFloor(
        both.percent,
        both.cells,
        repeats=Floor.of([c.repeats for c in noise if c.repeats is not None]),
        runs=Floor.of([c.runs for c in noise if c.runs is not None]),
    )


def noise_floor_per_model(cells: Sequence[MeasuredCell]) -> dict[str, NoiseFloor]:
    return {
        model: noise_floor([cell for cell in cells if cell.model == model])
        for model in sorted({cell.model for cell in cells})
    }
