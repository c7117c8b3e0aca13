"""The recommender judged on the measured grid: per workload, the configuration it would name
(predicted fastest that fits in memory) against the one measured fastest.

Predictions come from parameters fitted without any cell of the workload's network (leave one
network out), as for a network the grid never measured. A miss costs the time lost: how much slower
the recommended configuration measured than the fastest.

The recommender does not always name the predicted fastest: where the best options are
predicted within the models' error and the measurement noise of one another it calls them
tied and takes the one with fewer workers, less memory or lower cost (`harness.predict.ties`).
Each verdict also judges that answer, with the models' held-out errors and the grid's noise
floor as the recommender would read them from the fit, and says whether the measured fastest
was among the options it called tied: a miss inside a tie it declared is one it warned of.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import cast

from harness.analysis.fit import CellPrediction, runtime_mb
from harness.analysis.grid import MeasuredCell
from harness.costs.memory import fits
from harness.predict.ties import Tie, tie_with_fastest


@dataclass(frozen=True)
class WorkloadVerdict:
    workload: tuple[str, str]  # (dataset, network)
    candidates: int
    fastest: CellPrediction  # measured
    recommended: CellPrediction  # held-out fitted equations
    raw_recommended: CellPrediction  # raw equations
    hardware: str = ""  # the hardware they were measured on: a workload is judged per hardware
    # The options the tie rule holds tied with the predicted fastest (None: it stands apart,
    # or its model's error on an unseen network is not known), and the one it takes.
    tie: Tie | None = None

    @property
    def correct(self) -> bool:
        return self.recommended.measured_s <= self.fastest.measured_s

    @property
    def named(self) -> CellPrediction:
        """What the recommender names: the tie rule's choice where it declared a tie."""
        # the tie rule ran on `_Option`s (`judge`)
        return cast(_Option, self.tie.chosen).prediction if self.tie else self.recommended

    @property
    def named_correct(self) -> bool:
        return self.named.measured_s <= self.fastest.measured_s

    @property
    def named_time_lost_percent(self) -> float:
        return (self.named.measured_s / self.fastest.measured_s - 1) * 100

    @property
    def tied_predictions(self) -> list[CellPrediction]:
        """The options called tied, the predicted fastest first (none without a tie)."""
        return [cast(_Option, option).prediction for option in self.tie.tied] if self.tie else []

    @property
    def fastest_among_tied(self) -> bool:
        """The measured fastest was one of the options the recommender called tied."""
        return any(prediction is self.fastest for prediction in self.tied_predictions)

    @property
    def time_lost_percent(self) -> float:
        return (self.recommended.measured_s / self.fastest.measured_s - 1) * 100

    @property
    def raw_time_lost_percent(self) -> float:
        return (self.raw_recommended.measured_s / self.fastest.measured_s - 1) * 100


def tie_summary(verdicts: Sequence[WorkloadVerdict]) -> str | None:
    """The verdicts with the tie rule, in one sentence (None: no tie was declared, so the
    recommender named the predicted fastest everywhere)."""
    tied = [v for v in verdicts if v.tie is not None]
    if not tied:
        return None
    missed = [v for v in verdicts if not v.correct]
    warned = sum(v.fastest_among_tied for v in missed)
    lost = max(v.named_time_lost_percent for v in verdicts)
    return (
        f"with its tie rule (harness.recommend: options predicted within the models' "
        f"error and the noise of one another are tied, and the one with fewer workers or "
        f"less memory beyond the memory models' error taken), {len(tied)} of "
        f"{len(verdicts)} answers were ties, and the recommender's answer was right for "
        f"{sum(v.named_correct for v in verdicts)} (worst time lost {lost:.1f} %); of the "
        f"{len(missed)} misses of the predicted fastest, {warned} were inside a tie it "
        f"declared"
    )


def _fits_memory(prediction: CellPrediction) -> bool:
    memory_gb = prediction.cell.config.hardware.device_memory_gb
    return fits([prediction.memory_fitted_mb], memory_gb)


@dataclass(frozen=True)
class _Option:
    """A measured configuration as the tie rule reads an option (`harness.predict.ties.Ranked`),
    at its held-out prediction."""

    prediction: CellPrediction
    error_percent: float | None  # its model's error on an unseen network (None: not measured)
    memory_error_percent: float | None = None  # the same of its memory model

    @property
    def label(self) -> str:
        return self.prediction.cell.run_name

    @property
    def workers(self) -> int:
        return self.prediction.cell.config.world_size

    @property
    def seconds_per_epoch(self) -> float:
        return self.prediction.fitted_s

    @property
    def memory_mb(self) -> float:
        return self.prediction.memory_fitted_mb

    @property
    def cost_per_epoch(self) -> float | None:
        return None  # the grid's configurations are priced alike: none is cheaper per se

    @property
    def calibrated(self) -> bool:
        return self.error_percent is not None


def judge(
    predictions: Sequence[CellPrediction],
    *,
    errors: Mapping[str, float] | None = None,
    noise_percent: float = 0.0,
    memory_errors: Mapping[str, float] | None = None,
) -> list[WorkloadVerdict]:
    """One verdict per workload and hardware with two or more measured configurations: the
    recommender answers for the hardware it is asked about, so a grid over two link rates
    judges each rate's answer (the fastest may change with the rate). Each cell once: a cell
    measured in several runs is merged first (`harness.analysis.grid.one_per_cell`).
    `errors`: each model's error on an unseen network, percent (a model without one is
    uncalibrated and ties with none); `noise_percent`: the noise floor two options are tied
    within (`harness.analysis.calibration.noise_for_ties`); `memory_errors`: each memory
    model's error on an unseen network, which less memory must beat to break a tie."""
    verdicts = []
    for workload, hardware in sorted({(p.cell.workload, _hardware(p)) for p in predictions}):
        cells = [p for p in predictions if p.cell.workload == workload and _hardware(p) == hardware]
        if len(cells) < 2:
            continue
        allowed = sorted([p for p in cells if _fits_memory(p)] or cells, key=lambda p: p.fitted_s)
        options = [
            _Option(p, (errors or {}).get(p.cell.model), (memory_errors or {}).get(p.cell.model))
            for p in allowed
        ]
        verdicts.append(
            WorkloadVerdict(
                workload,
                len(cells),
                fastest=min(cells, key=lambda p: p.measured_s),
                recommended=allowed[0],
                raw_recommended=min(allowed, key=lambda p: p.raw_s),
                hardware=hardware,
                tie=tie_with_fastest(options, noise_percent),
            )
        )
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


def memory_verdicts(
    cells: Sequence[MeasuredCell],
    model_mb: Callable[[MeasuredCell], float],
    predictions: Sequence[CellPrediction],
) -> list[MemoryVerdict]:
    """A verdict for every cell whose hardware sets `device_memory_gb`: `model_mb` is the
    memory model's peak per worker as it fills the device (its measured runtime share, a CUDA
    context included); what the model misses beside it (`runtime_mb`) is learnt from the
    finished cells of other networks on the same kind of device (leave one network out)."""
    verdicts = []
    for cell in cells:
        limit_gb = cell.config.hardware.device_memory_gb
        if limit_gb is None:
            continue
        device = cell.config.hardware.device
        training = [
            p
            for p in predictions
            if p.cell.network != cell.network and p.cell.config.hardware.device is device
        ]
        verdicts.append(MemoryVerdict(cell, model_mb(cell) + runtime_mb(training), limit_gb * 1000))
    return verdicts
