"""Least-squares fits of each model's free parameters, judged on cells held out of the fit.

The time equations are linear in their free parameters (`predict.cell.EpochTerms`), so a fit
is a non-negative least-squares problem. It minimises the *relative* error (each row divided
by the measured time), so a slow cell does not outweigh a fast one, and the quantity fitted is
the one reported (percentage error).

A fit never frees more parameters than the cells it has, less one: with n training cells of a
model it frees alpha, then beta, then gamma, up to n - 1 of them (alpha alone from one cell).
Cross-validation holds out one group of cells at a time (a cell, or a workload), fits on the
rest and predicts the held-out ones; a model with no other cells to learn from falls back to
the raw equation, and the row says so.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import nnls

from harness.analysis.grid import MeasuredCell
from harness.predict.cell import RAW, EpochTerms, ModelParams


@dataclass(frozen=True)
class CellPrediction:
    """A measured cell and what the models said of it."""

    cell: MeasuredCell
    terms: EpochTerms
    memory_model_mb: float  # weights, gradients, optimizer, buffers, activations (max worker)
    fitted_s: float = float("nan")  # held out: parameters fitted without this cell's group
    fitted_from: int = 0  # training cells behind `fitted_s` (0: raw equation)
    memory_fitted_mb: float = float("nan")  # with the held-out runtime share

    @property
    def raw_s(self) -> float:
        return self.terms.seconds(RAW)

    @property
    def measured_s(self) -> float:
        return self.cell.seconds_per_epoch


def fit_params(rows: Sequence[tuple[EpochTerms, float]]) -> ModelParams:
    """(terms, measured seconds) -> the parameters minimising the squared relative error."""
    if not rows:
        return RAW
    features = np.array([terms.features() for terms, _ in rows])
    measured = np.array([seconds for _, seconds in rows])
    usable = [column for column in range(3) if np.any(features[:, column] > 0)]
    free = usable[:max(1, len(rows) - 1)]
    values = [RAW.compute_scale, RAW.communication_scale, RAW.step_overhead_s]
    fixed = [column for column in range(3) if column not in free]
    # Parameters not freed keep their raw value; the free ones explain the rest.
    residual = measured - features[:, fixed] @ np.array([values[c] for c in fixed])
    solution, _ = nnls(features[:, free] / measured[:, None], residual / measured)
    for column, value in zip(free, solution):
        values[column] = float(value)
    return ModelParams(*values)


def held_out(predictions: Sequence[CellPrediction],
             group: Callable[[MeasuredCell], Hashable]) -> list[CellPrediction]:
    """Each prediction with `fitted_s` from the parameters of its model fitted on the cells
    of other groups, and memory with the runtime share learnt the same way."""
    result = []
    for prediction in predictions:
        key = group(prediction.cell)
        training = [p for p in predictions if group(p.cell) != key]
        same_model = [p for p in training if p.cell.model == prediction.cell.model]
        params = fit_params([(p.terms, p.measured_s) for p in same_model])
        runtime = runtime_mb(training)
        result.append(CellPrediction(
            prediction.cell, prediction.terms, prediction.memory_model_mb,
            fitted_s=prediction.terms.seconds(params), fitted_from=len(same_model),
            memory_fitted_mb=prediction.memory_model_mb + runtime))
    return result


def runtime_mb(training: Sequence[CellPrediction]) -> float:
    """What a worker holds besides the model's own memory (the framework, the process): the
    median gap between measured and modelled peaks (0 without cells to learn from)."""
    gaps = [p.cell.peak_memory_mb - p.memory_model_mb for p in training
            if p.cell.peak_memory_mb == p.cell.peak_memory_mb]  # skip NaN (not measured)
    return statistics.median(gaps) if gaps else 0.0


def params_per_model(predictions: Sequence[CellPrediction]) -> dict[str, ModelParams]:
    """Parameters fitted on all cells of each model: what the recommender uses."""
    models = sorted({p.cell.model for p in predictions})
    return {model: fit_params([(p.terms, p.measured_s) for p in predictions
                               if p.cell.model == model]) for model in models}


@dataclass(frozen=True)
class Accuracy:
    """One model's errors over its cells, in percent."""

    model: str
    cells: int
    raw_mape: float
    raw_worst: float
    fitted_mape: float
    fitted_worst: float


def percent_error(predicted: float, measured: float) -> float:
    return abs(predicted - measured) / measured * 100


def accuracy(predictions: Sequence[CellPrediction]) -> list[Accuracy]:
    """MAPE and worst case per model, raw equations against held-out fits."""
    table = []
    for model in sorted({p.cell.model for p in predictions}):
        rows = [p for p in predictions if p.cell.model == model]
        raw = [percent_error(p.raw_s, p.measured_s) for p in rows]
        fitted = [percent_error(p.fitted_s, p.measured_s) for p in rows]
        table.append(Accuracy(model, len(rows), statistics.fmean(raw), max(raw),
                              statistics.fmean(fitted), max(fitted)))
    return table
