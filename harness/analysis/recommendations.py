"""The recommender judged on the measured grid: per workload, the configuration it would name
(predicted fastest that fits in memory) against the one measured fastest.

Predictions come from parameters fitted without any cell of the workload's network (leave one
network out), as for a network the grid never measured. A miss costs the time lost: how much slower
the recommended configuration measured than the fastest.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from harness.analysis.fit import CellPrediction, runtime_mb
from harness.analysis.grid import MeasuredCell
from harness.predict.memory import fits


@dataclass(frozen=True)
class WorkloadVerdict:
    workload: tuple[str, str]  # (dataset, network)
    candidates: int
    fastest: CellPrediction  # measured
    recommended: CellPrediction  # held-out fitted equations
    raw_recommended: CellPrediction  # raw equations
    hardware: str = ""  # the hardware they were measured on: a workload is judged per hardware

    @property
    def correct(self) -> bool:
        return self.recommended.measured_s <= self.fastest.measured_s

    @property
    def time_lost_percent(self) -> float:
        return (self.recommended.measured_s / self.fastest.measured_s - 1) * 100

    @property
    def raw_time_lost_percent(self) -> float:
        return (self.raw_recommended.measured_s / self.fastest.measured_s - 1) * 100


def _fits_memory(prediction: CellPrediction) -> bool:
    memory_gb = prediction.cell.config.hardware.device_memory_gb
    return fits([prediction.memory_fitted_mb], memory_gb)


def judge(predictions: Sequence[CellPrediction]) -> list[WorkloadVerdict]:
    """One verdict per workload and hardware with two or more measured configurations: the
    recommender answers for the hardware it is asked about, so a grid over two link rates
    judges each rate's answer (the fastest may change with the rate). Each cell once: a cell
    measured in several runs is merged first (`harness.analysis.grid.one_per_cell`)."""
    verdicts = []
    for workload, hardware in sorted({(p.cell.workload, _hardware(p)) for p in predictions}):
        cells = [p for p in predictions
                 if p.cell.workload == workload and _hardware(p) == hardware]
        if len(cells) < 2:
            continue
        allowed = [p for p in cells if _fits_memory(p)] or cells
        verdicts.append(WorkloadVerdict(
            workload, len(cells), fastest=min(cells, key=lambda p: p.measured_s),
            recommended=min(allowed, key=lambda p: p.fitted_s),
            raw_recommended=min(allowed, key=lambda p: p.raw_s), hardware=hardware))
    return verdicts


def _hardware(prediction: CellPrediction) -> str:
    return prediction.cell.config.hardware.name


@dataclass(frozen=True)
class MemoryVerdict:
    """Whether a cell on hardware with a memory limit was predicted to fit, against whether it
    did (status `oom` or not)."""

    cell: MeasuredCell
    predicted_mb: float  # the largest worker's, runtime share learnt without the cell's network
    limit_mb: float

    @property
    def predicted_fit(self) -> bool:
        return self.predicted_mb <= self.limit_mb

    @property
    def right(self) -> bool:
        return self.predicted_fit == self.cell.fitted_in_memory


def memory_verdicts(cells: Sequence[MeasuredCell], model_mb: Callable[[MeasuredCell], float],
                    predictions: Sequence[CellPrediction]) -> list[MemoryVerdict]:
    """A verdict for every cell whose hardware sets `device_memory_gb`: `model_mb` is the
    memory model's peak per worker without the runtime share, which is learnt from the
    finished cells of other networks on the same kind of device (leave one network out)."""
    verdicts = []
    for cell in cells:
        limit_gb = cell.config.hardware.device_memory_gb
        if limit_gb is None:
            continue
        device = cell.config.hardware.device
        training = [p for p in predictions if p.cell.network != cell.network
                    and p.cell.config.hardware.device is device]
        verdicts.append(MemoryVerdict(cell, model_mb(cell) + runtime_mb(training),
                                      limit_gb * 1000))
    return verdicts
