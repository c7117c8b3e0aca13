"""The recommender judged on the measured grid: per workload, the configuration it would name
(predicted fastest that fits in memory) against the one measured fastest.

Predictions come from parameters fitted without any cell of the workload (leave one workload
out), as for a network the grid never measured. A miss costs the time lost: how much slower
the recommended configuration measured than the fastest.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from harness.analysis.fit import CellPrediction
from harness.predict.memory import fits


@dataclass(frozen=True)
class WorkloadVerdict:
    workload: tuple[str, str]  # (dataset, network)
    candidates: int
    fastest: CellPrediction  # measured
    recommended: CellPrediction  # held-out fitted equations
    raw_recommended: CellPrediction  # raw equations

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
    """One verdict per workload with two or more measured configurations."""
    verdicts = []
    for workload in sorted({p.cell.workload for p in predictions}):
        cells = [p for p in predictions if p.cell.workload == workload]
        if len(cells) < 2:
            continue
        allowed = [p for p in cells if _fits_memory(p)] or cells
        verdicts.append(WorkloadVerdict(
            workload, len(cells), fastest=min(cells, key=lambda p: p.measured_s),
            recommended=min(allowed, key=lambda p: p.fitted_s),
            raw_recommended=min(allowed, key=lambda p: p.raw_s)))
    return verdicts
