"""Fits of the time equations' free parameters, judged on cells held out of the fit.

The parameters (`harness.predict.parameters.PARAMETERS`) are few and belong to the hardware,
not to a model: every multi-worker model's compute is scaled by the same contention factor and
its communication by the same communication factor, because the physics they stand for is
shared (workers that share a node's cores and memory bandwidth; the share of the probed
bandwidth a transfer gets while the workers compute). So each model has at most two, the
sequential model none, plus those a model declares for a term of its own (Horovod's
background thread), and a fit learns them from every model's cells of that hardware at once,
which makes them hard to bend towards one network's quirks.

The equations are linear in the parameters (`predict.cell.EpochTerms.coefficients`), so a fit
is a bounded linear least-squares problem on the *relative* error (a slow cell does not
outweigh a fast one; the quantity fitted is the one reported), with a Gaussian prior that keeps
each parameter at its raw value unless the data pull it away: one extra row per parameter,
(value - prior) / sigma. With no cells the fit is the raw equation.

Cross-validation holds out one group of cells at a time (a cell, or every cell of a network),
fits on the rest of the same hardware and predicts the held-out ones.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from harness.analysis.grid import MeasuredCell
from harness.costs.terms import EpochTerms
from harness.predict.parameters import PARAMETERS, RAW


@dataclass(frozen=True)
class CellPrediction:
    """A measured cell and what the models said of it."""

    cell: MeasuredCell
    terms: EpochTerms
    memory_model_mb: float  # the memory model's peak per worker (max worker), its measured
    # runtime share included, as the cell records it (`predict.cell.recorded_peak_mb`: on
    # CUDA without the context); what the cells teach on top is `runtime_mb`'s remainder
    fitted_s: float = float("nan")  # held out: parameters fitted without this cell's group
    fitted_from: int = 0  # training cells behind `fitted_s` (0: raw equation)
    memory_fitted_mb: float = float("nan")  # with the held-out runtime share
    # The machine's speed while the cell ran over its speed around the step time the cell was
    # predicted from (reference kernels, cell / step time; NaN where either is not recorded),
    # and whether the step time was scaled by it (`predict.facts.speed.at_machine_speed`).
    speed_ratio: float = float("nan")
    speed_scaled: bool = False

    @property
    def raw_s(self) -> float:
        return self.terms.seconds(RAW)

    @property
    def measured_s(self) -> float:
        return self.cell.seconds_per_epoch


def fit_params(rows: Sequence[tuple[EpochTerms, float]]) -> dict[str, float]:
    """(terms, measured seconds) -> the parameters minimising the squared relative error plus
    the prior's penalty (module docstring); non-negative."""
    names = list(PARAMETERS)
    design, target = [], []
    for terms, measured in rows:
        coefficients = terms.coefficients()
        design.append([coefficients.get(name, 0.0) / measured for name in names])
        target.append((measured - terms.fixed_s()) / measured)
    for index, name in enumerate(names):  # the prior: (value - prior) / sigma
        parameter = PARAMETERS[name]
        row = [0.0] * len(names)
        row[index] = 1.0 / parameter.sigma
        design.append(row)
        target.append(parameter.prior / parameter.sigma)
    from scipy.optimize import lsq_linear  # 0.4 s to import: only when fitting

    solution = lsq_linear(np.array(design), np.array(target), bounds=(0.0, np.inf))
    return {name: float(value) for name, value in zip(names, solution.x)}


def _hardware(cell: MeasuredCell) -> str:
    return cell.config.hardware.name


def _every_cell(cell: MeasuredCell) -> bool:
    return True


def held_out(
    predictions: Sequence[CellPrediction],
    group: Callable[[MeasuredCell], Hashable],
    fit_on: Callable[[MeasuredCell], bool] = _every_cell,
) -> list[CellPrediction]:
    """Each prediction with `fitted_s` from the parameters fitted on the cells of its hardware
    in other groups, and memory with the runtime share learnt the same way. `fit_on` limits
    the cells fitted on (a small calibration inside a larger grid): the others are only
    predicted."""
    result = []
    for prediction in predictions:
        key, hardware = group(prediction.cell), _hardware(prediction.cell)
        training = [
            p
            for p in predictions
            if group(p.cell) != key and _hardware(p.cell) == hardware and fit_on(p.cell)
        ]
        params = fit_params([(p.terms, p.measured_s) for p in training])
        runtime = runtime_mb(training)
        result.append(
            CellPrediction(
                prediction.cell,
                prediction.terms,
                prediction.memory_model_mb,
                fitted_s=prediction.terms.seconds(params),
                fitted_from=len(training),
                memory_fitted_mb=prediction.memory_model_mb + runtime,
            )
        )
    return result


def runtime_mb(training: Sequence[CellPrediction]) -> float:
    """What the memory model misses, learnt from cells: the median gap between measured and
    modelled peaks (0 without cells to learn from). The model measures the process' runtime
    share itself (`predict.runtime`), so this is a remainder (the heap's fragmentation,
    about 100 MB on a CPU), not the runtime."""
    gaps = [
        p.cell.peak_memory_mb - p.memory_model_mb
        for p in training
        if p.cell.peak_memory_mb == p.cell.peak_memory_mb
    ]  # skip NaN (not measured)
    return statistics.median(gaps) if gaps else 0.0


def params_per_hardware(predictions: Sequence[CellPrediction]) -> dict[str, dict[str, float]]:
    """Parameters fitted on all cells of each hardware: what the recommender uses."""
    return {
        hardware: fit_params(
            [(p.terms, p.measured_s) for p in predictions if _hardware(p.cell) == hardware]
        )
        for hardware in sorted({_hardware(p.cell) for p in predictions})
    }


def runtime_per_hardware(predictions: Sequence[CellPrediction]) -> dict[str, float]:
    return {
        hardware: runtime_mb([p for p in predictions if _hardware(p.cell) == hardware])
        for hardware in sorted({_hardware(p.cell) for p in predictions})
    }


@dataclass(frozen=True)
class Accuracy:
    """One model's errors over its cells, in percent (signed errors: predicted above measured
    is positive)."""

    model: str
    cells: int
    raw_mape: float
    raw_worst: float
    cell_mape: float  # leave one cell out
    network_mape: float  # leave one network out: what a recommendation for a new network gets
    network_worst: float
    network_bias: float  # mean signed error, leave one network out
    memory_mape: float  # peak MB per worker, runtime share learnt without the network
    # Leave one family out (fitted on image networks only, predicting language models, and
    # the reverse): NaN when the cells hold one family.
    family_mape: float = float("nan")
    family_worst: float = float("nan")
    family_bias: float = float("nan")


def percent_error(predicted: float, measured: float) -> float:
    return abs(predicted - measured) / measured * 100


def signed_error(predicted: float, measured: float) -> float:
    return (predicted - measured) / measured * 100


def accuracy(
    by_cell: Sequence[CellPrediction],
    by_network: Sequence[CellPrediction],
    by_family: Sequence[CellPrediction] = (),
) -> list[Accuracy]:
    """MAPE and worst case per model: raw equations, leave one cell out, leave one network
    out (time and memory), and with `by_family` leave one family out."""
    table = []
    for model in sorted({p.cell.model for p in by_cell}):
        cells = [p for p in by_cell if p.cell.model == model]
        networks = [p for p in by_network if p.cell.model == model]
        families = [
            percent_error(p.fitted_s, p.measured_s) for p in by_family if p.cell.model == model
        ]
        family_bias = [
            signed_error(p.fitted_s, p.measured_s) for p in by_family if p.cell.model == model
        ]
        raw = [percent_error(p.raw_s, p.measured_s) for p in cells]
        # A network held out where its hardware has no other network was predicted by the
        # raw equations (nothing to fit on): that is no leave-one-network-out error.
        networks = [p for p in networks if p.fitted_from > 0]
        unseen = [percent_error(p.fitted_s, p.measured_s) for p in networks]
        bias = [signed_error(p.fitted_s, p.measured_s) for p in networks]
        memory = [
            percent_error(p.memory_fitted_mb, p.cell.peak_memory_mb)
            for p in networks
            if p.cell.peak_memory_mb == p.cell.peak_memory_mb
        ]
        table.append(
            Accuracy(
                model,
                len(cells),
                statistics.fmean(raw),
                max(raw),
                statistics.fmean(percent_error(p.fitted_s, p.measured_s) for p in cells),
                _mean(unseen),
                max(unseen, default=float("nan")),
                _mean(bias),
                _mean(memory),
                statistics.fmean(families) if families else float("nan"),
                max(families) if families else float("nan"),
                statistics.fmean(family_bias) if family_bias else float("nan"),
            )
        )
    return table


def _mean(values: Sequence[float]) -> float:
    """The mean, NaN for none (what could not be measured)."""
    return statistics.fmean(values) if values else float("nan")


def single_network_hardware(predictions: Sequence[CellPrediction]) -> dict[str, str]:
    """Hardware whose cells hold one network, with that network: leave one network out
    cannot be measured there (it needs a second network to fit on)."""
    networks: dict[str, set[str]] = {}
    for p in predictions:
        networks.setdefault(_hardware(p.cell), set()).add(p.cell.network)
    return {
        hardware: next(iter(names))
        for hardware, names in sorted(networks.items())
        if len(names) == 1
    }


def leave_one_network_out_note(predictions: Sequence[CellPrediction]) -> str | None:
    """Why leave one network out was not measured for some hardware, in one sentence; None
    where it was measured everywhere."""
    single = single_network_hardware(predictions)
    if not single:
        return None
    where = "; ".join(
        f"hardware={hardware}: {network} only" for hardware, network in single.items()
    )
    return (
        f"leave one network out cannot be measured ({where}): it needs cells of two "
        f"networks or more on the same hardware, one held out and one to fit on"
    )


def family_held_out(
    predictions: Sequence[CellPrediction],
    fit_on: Callable[[MeasuredCell], bool] = _every_cell,
) -> list[CellPrediction]:
    """Every cell predicted from the parameters fitted on the other families' cells (of its
    hardware); empty when the cells hold one family, where nothing can be held out."""
    if len({p.cell.family for p in predictions}) < 2:
        return []
    return held_out(predictions, group=lambda cell: cell.family, fit_on=fit_on)
