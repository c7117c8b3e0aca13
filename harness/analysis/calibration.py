"""How sure a prediction is: which analysis' fit a recommendation takes its parameters from,
which distribution models that fit covers, and how wide a model's range is with and without one.

An analysis (`harness.analysis`) writes `<run.output_dir>/analysis/<experiment>/fit.json`:
parameters per hardware, fitted on that hardware's cells, and each model's error on a network
the fit never saw (leave one network out). A model is *calibrated* for a hardware when the fit
holds cells of that model on that hardware and its leave-one-network-out error was measured
(two networks or more); its range is then widened by that error. Any other model, and every
model without a fit, is *uncalibrated*: the raw equations' error holds for it, which is far
larger than a fit's (`RAW_ERROR_FACTOR`), and the output names the command that calibrates.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.config.accepts import finite_number
from harness.config.schema import ConfigError, HardwareConfig
from harness.predict.parameters import RAW
from harness.profiles.steps import StepTime, steps_from_other_machines

# How far the raw (uncalibrated) equations have missed measured cells, as a factor either way: an
# uncalibrated option's range is its prediction / RAW_ERROR_FACTOR to its prediction x
# RAW_ERROR_FACTOR. Measured (docs/recommend.md, "How sure a range is"): a first day's cells on
# local_2cpu, with no probe and no fit, ran 1.8-2.8x (DDP, ResNet-18/MNIST: 2.97 s predicted,
# 5.44-8.35 s measured) and 2.9x (GPipe: 3.53 s, 10.27 s) the raw prediction; the raw equations were
# up to 63 % off on a busy machine (docs/benchmarks/2026-11-23-local-calibration-held-out.md, "A
# first 20-cell grid (superseded by the held-out calibration below)") and up to 31 % on a quiet one
# (docs/benchmarks/2026-11-25-transformers-and-open-networks.md, "A small calibration of two
# families"). 3 covers every recorded miss.
RAW_ERROR_FACTOR = 3.0

# The sweep and analysis that calibrate a hardware (conf/sweep/calibrate_local.yaml: every
# model on four networks, two datasets; its experiment is `calibrate_local`).
CALIBRATION_SWEEP = "calibrate_local"


def calibrate_commands(hardware: HardwareConfig) -> str:
    """The commands that fit the models for `hardware`, as one line for the user: the
    calibration sweep (made for local_2cpu) on it, on one node (the sweep's pipelines have a
    stage per worker, and its smallest network 15 layers: a 4 x 4 cluster's 16 are too many),
    then the probe of its links, as the cells ran (without it the analysis fits against the
    configured speeds), then the analysis."""
    one_node = "" if hardware.name == "local_2cpu" else " hardware.nodes=1"
    on = (
        ""
        if hardware.name == "local_2cpu"
        else f" hydra.sweeper.params.hardware={hardware.name}{one_node}"
    )
    return (
        f"python -m harness +sweep={CALIBRATION_SWEEP}{on}, python -m harness.probe "
        f"hardware={hardware.name}{one_node}, then python -m harness.analysis "
        f"tracking.experiment={CALIBRATION_SWEEP}"
    )


@dataclass(frozen=True)
class FitCoverage:
    """What one fit.json holds for one hardware: its cells, networks and models."""

    path: Path
    hardware: str
    cells: int
    networks: tuple[str, ...]
    models: dict[str, int]  # cells per distribution model on this hardware
    modified: float  # the file's mtime: the last tie-break
    # The links the fit priced its cells with (`hardware_profile.links_label`): "measured
    # <when>", "configured"; None where the fit predates the entry or had one worker.
    links: str | None = None
    # The machines its cells ran on (`harness.runtime.environment.machine_label`); () where the fit
    # predates the entry or its cells did not record their machine.
    machines: tuple[str, ...] = ()

    @property
    def leave_one_network_out(self) -> bool:
        """Whether the fit's error on an unseen network could be measured: it needs two
        networks (one held out, one to fit on)."""
        return len(self.networks) >= 2

    def describe(self) -> str:
        networks, models = ", ".join(self.networks), ", ".join(sorted(self.models))
        return (
            f"{self.path} (hardware={self.hardware}, {self.cells} cells; networks "
            f"{networks or 'not recorded'}; models {models or 'not recorded'})"
        )


def read_fit(path: Path) -> dict[str, Any]:
    """A fit.json as written by `harness.analysis`; anything else is one line naming it."""
    try:
        data = json.loads(path.read_text())
        if not isinstance(data.get("hardware"), dict):  # before fits were per hardware
            raise TypeError("hardware is not a per-hardware table")
        for name, entry in data["hardware"].items():
            _check_fit_entry(name, entry)
        for key in ("accuracy", "residuals"):
            if not isinstance(data.get(key) or [], list):
                raise TypeError(f"{key} is not a list")
        return data
    except RecursionError:  # arrays nested past the JSON reader's depth
        raise ConfigError(
            f"--fit={path} is invalid: not a fit.json of harness.analysis (nested deeper "
            f"than any it writes); run the analysis again"
        ) from None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise ConfigError(
            f"--fit={path} is invalid: not a fit.json of harness.analysis "
            f"({type(err).__name__}: {err}); run the analysis again"
        ) from None


def _check_fit_entry(hardware: str, entry: object) -> None:
    """TypeError naming the field of fit.json's entry for `hardware` that is not what
    `harness.analysis` writes (read far from the file otherwise, as a bare KeyError)."""
    where = f"hardware.{hardware}"
    if not isinstance(entry, dict):
        raise TypeError(f"{where} is a JSON {type(entry).__name__}, not an object")
    params = entry.get("params")
    if not isinstance(params, dict) or not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in params.values()
    ):
        raise TypeError(f"{where}.params is not an object of numbers")
    for name, value in params.items():  # fitted with bounds (0, inf): finite, not negative
        _check_value(f"{where}.params.{name}", value, 0.0, MAX_PARAMETER)
    for key, kind in (
        ("cells", int),
        ("runtime_mb", (int, float)),
        ("networks", list),
        ("models", dict),
        ("machines", list),
        ("links", str),
    ):
        if entry.get(key) is not None and not isinstance(entry[key], kind):
            raise TypeError(f"{where}.{key} is a JSON {type(entry[key]).__name__}")
    for key in ("networks", "machines"):  # names, joined into the lines the commands print
        if not all(isinstance(name, str) for name in entry.get(key) or ()):
            raise TypeError(f"{where}.{key} is not a list of names")
    if not all(isinstance(count, int) for count in (entry.get("models") or {}).values()):
        raise TypeError(f"{where}.models is not an object of cell counts")
    if entry.get("runtime_mb") is not None:  # a median gap: negative where the model over-counts
        _check_value(f"{where}.runtime_mb", entry["runtime_mb"], -MAX_MEMORY_MB, MAX_MEMORY_MB)
    counts = {"cells": entry.get("cells")} | {
        f"models.{model}": count for model, count in (entry.get("models") or {}).items()
    }
    for key, count in counts.items():
        if count is not None:
            _check_value(f"{where}.{key}", count, 0, MAX_CELLS)


# What no analysis writes: a fitted parameter (seconds per unit, or a factor) beyond 10^6, a
# memory remainder beyond 10 TB, more cells than a grid of a billion. The fit's own NaN in
# `accuracy` means "not measured" and stays readable.
MAX_PARAMETER = 1e6
MAX_MEMORY_MB = 1e7
MAX_CELLS = 10**9


def _check_value(field_name: str, value: float, low: float, high: float) -> None:
    """ValueError naming fit.json's field where `value` is not finite or not in [low, high]."""
    if not (math.isfinite(value) and low <= value <= high):
        raise ValueError(f"{field_name} is {value}, allowed {low:g} to {high:g}")


def coverage(path: Path, hardware: str, data: dict[str, Any] | None = None) -> FitCoverage | None:
    """What `path` fitted for `hardware`; None where it fitted no cell of it."""
    data = read_fit(path) if data is None else data
    entry = data["hardware"].get(hardware)
    if entry is None:
        return None
    return FitCoverage(
        path,
        hardware,
        int(entry.get("cells") or 0),
        tuple(entry.get("networks") or ()),
        _models(data, hardware),
        path.stat().st_mtime,
        entry.get("links"),
        tuple(entry.get("machines") or ()),
    )


def _models(data: dict[str, Any], hardware: str) -> dict[str, int]:
    """Cells per model on `hardware`: the entry's own count (`models`, which every analysis now
    writes); an older fit of one hardware, from its residuals (every cell's model); else none is
    known."""
    entry = data["hardware"][hardware]
    if isinstance(entry.get("models"), dict):
        return {str(model): int(cells) for model, cells in entry["models"].items()}
    if len(data["hardware"]) != 1:
        return {}  # residuals do not say their hardware: no model counts as covered
    counts: dict[str, int] = {}
    for row in data.get("residuals") or []:
        if isinstance(row, dict) and "model" in row:
            counts[str(row["model"])] = counts.get(str(row["model"]), 0) + 1
    return counts


def choose_fit(output_root: Path, hardware: str, models: Collection[str]) -> Path | None:
    """The `<output_root>/analysis/*/fit.json` that best covers what is asked: cells of
    `hardware` (required), then the most of `models`, then the most networks, then the most
    cells, then the newest. A damaged or older-format file is passed over."""
    best: tuple[tuple[int, int, int, float], Path] | None = None
    for path in sorted((output_root / "analysis").glob("*/fit.json")):
        try:
            found = coverage(path, hardware)
        except ConfigError as err:  # said once, in one line: the file, and how to recover
            print(f"distbench: passing over {path}: {str(err).split(': ', 1)[-1]}", file=sys.stderr)
            continue
        if found is None:
            continue
        key = (
            len(set(models) & set(found.models)),
            len(found.networks),
            found.cells,
            found.modified,
        )
        if best is None or key > best[0]:
            best = (key, path)
    return None if best is None else best[1]


@dataclass(frozen=True)
class ModelCalibration:
    """How sure one model's prediction is."""

    calibrated: bool
    error_percent: float | None  # the fit's leave-one-network-out error; None: uncalibrated
    why: str  # what the range is made of, for the user
    # The memory model's error on an unseen network, percent (None: not measured): what less
    # memory must beat to break a tie (harness.predict.ties).
    memory_error_percent: float | None = None

    def widen(self, low: float, seconds: float, high: float) -> tuple[float, float]:
        """The range: the step times' spread put through the equations, widened by the fit's
        error, or by the raw equations' where uncalibrated."""
        low, high = min(low, seconds), max(high, seconds)
        if self.error_percent is None:
            return low / RAW_ERROR_FACTOR, high * RAW_ERROR_FACTOR
        return low * (1 - self.error_percent / 100), high * (1 + self.error_percent / 100)


@dataclass(frozen=True)
class Fitted:
    """The parameters an analysis learnt for one hardware, or the raw equations, and how
    sure each model's prediction is with them."""

    params: dict[str, float]
    runtime_mb: float
    source: str
    # Per calibrated model, the fit's error on a network it was not fitted on, in percent
    # (fit.json's `accuracy[].network_mape`, leave one network out).
    errors: dict[str, float] = field(default_factory=dict)
    fit: FitCoverage | None = None
    hardware: str = ""
    # The measurement noise floor of the fit's cells, percent (harness.analysis.noise; 0 where
    # the fit measured none): with the models' errors, what ties two options. Which floor it
    # is: between two runs of a cell where enough cells measured it, else over both kinds.
    noise_percent: float = 0.0
    noise_kind: str = "not measured"
    # Per calibrated model, the memory model's error on an unseen network, percent (fit.json's
    # `accuracy[].memory_mape`).
    memory_errors: dict[str, float] = field(default_factory=dict)

    @classmethod
    def raw(cls, why: str, hardware: str = "") -> Fitted:
        return cls(dict(RAW), 0.0, f"raw equations ({why})", hardware=hardware)

    @classmethod
    def load(cls, path: Path | None, hardware: str) -> Fitted:
        """`hardware`'s parameters in `path`; the raw equations when there are none."""
        if path is None:
            return cls.raw(f"no analysis of hardware={hardware} found", hardware)
        data = read_fit(path)
        found = coverage(path, hardware, data)
        if found is None:
            return cls.raw(f"{path} fitted no cell of hardware={hardware}", hardware)
        entry = data["hardware"][hardware]
        held_out = found.leave_one_network_out
        errors = _held_out_errors(data, found, "network_mape") if held_out else {}
        memory_errors = _held_out_errors(data, found, "memory_mape") if held_out else {}
        return cls(
            {**RAW, **entry["params"]},
            float(entry.get("runtime_mb") or 0.0),
            found.describe(),
            errors,
            found,
            hardware,
            *_noise_floor(data),
            memory_errors=memory_errors,
        )

    @property
    def noise_text(self) -> str:
        """The noise floor in a few words: "2.3 % between runs (12 cells)"."""
        if self.noise_kind == "not measured":
            return self.noise_kind
        return f"{self.noise_percent:.1f} % {self.noise_kind}"

    @property
    def calibrated_models(self) -> list[str]:
        return sorted(self.errors)

    def calibration(self, model: str) -> ModelCalibration:
        """How sure `model`'s prediction is with these parameters (module docstring)."""
        if model in self.errors:
            return ModelCalibration(
                True,
                self.errors[model],
                f"the fit's error on an unseen network, {self.errors[model]:.1f}%",
                self.memory_errors.get(model),
            )
        if self.fit is None:
            why = "no fit of this hardware"
        elif model not in self.fit.models:
            why = f"the fit has no cell of the model on hardware={self.hardware}"
        elif not self.fit.leave_one_network_out:
            why = (
                "the fit's cells hold one network: its error on another network cannot be measured"
            )
        else:
            why = f"the fit measured no error of {model} on an unseen network"
        return ModelCalibration(
            False,
            None,
            f"uncalibrated ({why}): the raw equations' "
            f"error, x/{RAW_ERROR_FACTOR:g} to "
            f"x{RAW_ERROR_FACTOR:g}",
        )

    def summary(self) -> dict[str, Any]:
        """The fit's facts for `--json`."""
        if self.fit is None:
            return {"path": None, "why": self.source}
        return {
            "path": str(self.fit.path),
            "hardware": self.fit.hardware,
            "cells": self.fit.cells,
            "networks": list(self.fit.networks),
            "models": dict(sorted(self.fit.models.items())),
            "leave_one_network_out_measured": self.fit.leave_one_network_out,
        }


# Fewest cells measured in two steady runs for their median to stand for the fit's noise
# between runs (a median of fewer is one or two cells' luck).
MIN_RUN_FLOOR_CELLS = 5


def machine_since_fit(
    fitted: Fitted, used: Iterable[tuple[str, StepTime]], hardware: HardwareConfig
) -> str | None:
    """A line where step times predictions use (each with what it is of: "batch 32") were
    measured on another machine than the fit's cells: its parameters (overheads, the
    communication factor) were learnt against that machine's speed. None where they agree,
    or either machine is not recorded. `harness.recommend` and the dry run print it."""
    fit = fitted.fit
    other = steps_from_other_machines(used, fit.machines if fit is not None else ())
    if fit is None or not other:
        return None
    where = "; ".join(f"{', '.join(steps)} on {machine}" for machine, steps in other.items())
    return (
        f"machine changed since the fit: its cells ran on {'; '.join(fit.machines)}, the "
        f"step times used on another ({where}); its parameters were learnt at the "
        f"former's speed: {calibrate_commands(hardware)} on this machine fit them for it "
        f"(the fit: {fit.path})"
    )


def _noise_floor(data: dict[str, Any]) -> tuple[float, str]:
    """fit.json's noise floor for ties (`noise_for_ties`)."""
    by_kind = data.get("noise_floor_by_kind")
    overall = by_kind.get("all") if isinstance(by_kind, dict) else None
    runs = overall.get("runs") if isinstance(overall, dict) else None
    runs_percent = _percent(runs.get("percent")) if isinstance(runs, dict) else None
    runs_cells = runs.get("cells") if isinstance(runs, dict) else None
    floors = data.get("noise_floor_percent")
    return noise_for_ties(
        runs_percent,
        runs_cells if isinstance(runs_cells, int) else 0,
        _percent(floors.get("all") if isinstance(floors, dict) else None),
    )


def noise_for_ties(
    runs_percent: float | None, runs_cells: int, overall_percent: float | None
) -> tuple[float, str]:
    """The noise floor (percent) two options are tied within, and which: between two runs of
    one cell where at least MIN_RUN_FLOOR_CELLS cells measured it (a recommendation is
    compared with another run, and back-to-back repeats differ less: harness.analysis.noise),
    else over both kinds of repeated measurement; 0 where none was measured (None)."""
    if runs_percent is not None and runs_cells >= MIN_RUN_FLOOR_CELLS:
        return runs_percent, f"between runs ({runs_cells} cells)"
    if overall_percent is not None:
        return overall_percent, "between any two measurements"
    return 0.0, "not measured"


def _percent(value: object) -> float | None:
    """A finite number of fit.json's, else None (null: not measured)."""
    if finite_number(value):
        return float(value)  # type: ignore[arg-type]
    return None


def _held_out_errors(data: dict[str, Any], found: FitCoverage, key: str) -> dict[str, float]:
    """fit.json's leave-one-network-out error per model (percent; `key`: `network_mape` of
    the time, `memory_mape` of the memory per worker), where finite, for the models the fit
    holds cells of on this hardware."""
    rows = data.get("accuracy") or []
    errors = {}
    for row in rows:
        if not isinstance(row, dict) or row.get("model") not in found.models:
            continue
        value = row.get(key)
        if isinstance(value, (int, float)) and math.isfinite(value):
            errors[str(row["model"])] = float(value)
    return errors
