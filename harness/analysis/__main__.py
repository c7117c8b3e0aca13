"""`python -m harness.analysis [tracking.experiment=NAME] [overrides] [--probe-batches N]`

Reads the finished cells of an MLflow experiment, predicts each with the performance models,
fits their free parameters, and writes `<run.output_dir>/analysis/<experiment>/`:
`report.md` with its plots and `fit.json` (the fitted parameters `harness.recommend` reads).
The same files are logged as artifacts of an `analysis` run in the experiment.

The models' facts are measured here (the sequential probe, the layer profile), so run it on a
machine with the grid's kind of device, as nothing else is running.
"""

from __future__ import annotations

import datetime as dt
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from tqdm import tqdm

from harness.analysis.fit import (
    CellPrediction,
    accuracy,
    held_out,
    params_per_model,
    runtime_mb,
)
from harness.analysis.grid import MeasuredCell, load_grid
from harness.analysis.recommendations import judge
from harness.analysis.report import setting_label, write_report
from harness.cli import command
from harness.compose import compose_config
from harness.config import ConfigError, DistbenchConfig, validate
from harness.hardware_profile import profile_for
from harness.predict.cell import epoch_terms, memory_per_worker_mb
from harness.predict.facts import FactsCache, cache_for, command_parser, gather
from harness.results import write_json_atomic
from harness.tracking import log_run, tracking_uri

FIT_FILE = "fit.json"


def predict_cells(cells: Sequence[MeasuredCell], output_root: Path,
                  cache: FactsCache) -> list[CellPrediction]:
    """The raw equations' terms and memory for every measured cell."""
    predictions, profiles = [], {}
    for cell in tqdm(cells, desc="predicting cells", unit="cell", file=sys.stderr):
        facts = gather(cell.config, cache)
        hardware = cell.config.hardware
        if hardware.name not in profiles:  # one file read per hardware, not per cell
            profiles[hardware.name] = profile_for(hardware, output_root)
        profile = profiles[hardware.name]
        predictions.append(CellPrediction(
            cell, epoch_terms(cell.config, facts, profile),
            max(memory_per_worker_mb(cell.config, facts))))
    return predictions


def analyse(config: DistbenchConfig, *, experiment: str, cache: FactsCache) -> Path:
    """Everything the module docstring says; returns the report's folder."""
    output_root = Path(config.run.output_dir)
    uri = tracking_uri(config.tracking.uri, output_root)
    cells = load_grid(uri, experiment)
    if not cells:
        raise ConfigError(f"tracking.experiment={experiment!r}: no finished (status ok) cells "
                          f"at {uri}; measure a grid first")
    started = time.perf_counter()
    predictions = predict_cells(cells, output_root, cache)
    probe_seconds = time.perf_counter() - started
    by_cell = held_out(predictions, group=lambda cell: cell.run_id)
    by_workload = held_out(predictions, group=lambda cell: cell.workload)
    table, verdicts = accuracy(by_cell), judge(by_workload)
    params, runtime = params_per_model(predictions), runtime_mb(predictions)
    folder = output_root / "analysis" / experiment
    files = write_report(folder, experiment=experiment, uri=uri, by_cell=by_cell,
                         by_workload=by_workload, table=table, verdicts=verdicts,
                         params=params, runtime_mb=runtime, probe_seconds=probe_seconds)
    fit_path = folder / FIT_FILE
    write_json_atomic(fit_path, {
        "experiment": experiment, "tracking_uri": uri, "cells": len(cells),
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "hardware": sorted({cell.config.hardware.name for cell in cells}),
        "params": {model: p.to_dict() for model, p in params.items()},
        "runtime_mb": runtime, "probe_batches": cache.probe_batches,
        "accuracy": [asdict(row) for row in table],
        "recommendations": [{"workload": list(v.workload), "fastest": setting_label(
            v.fastest.cell.config), "recommended": setting_label(v.recommended.cell.config),
            "correct": v.correct, "time_lost_percent": v.time_lost_percent}
            for v in verdicts],
    })
    _log(uri, experiment, table, verdicts, [*files, fit_path])
    _print_summary(table, verdicts, folder)
    return folder


def _log(uri: str, experiment: str, table, verdicts, files: list[Path]) -> None:  # noqa: ANN001
    metrics = {}
    for row in table:
        metrics[f"mape_raw_{row.model}"] = row.raw_mape
        metrics[f"mape_fitted_{row.model}"] = row.fitted_mape
        metrics[f"worst_fitted_{row.model}"] = row.fitted_worst
    if verdicts:
        metrics["recommendations_correct"] = sum(v.correct for v in verdicts) / len(verdicts)
    try:
        log_run(uri=uri, experiment=experiment, run_name="analysis",
                tags={"distbench.kind": "analysis"}, params={}, metrics=metrics,
                artifacts=files)
    except Exception as err:  # noqa: BLE001 - the report is on disk either way
        print(f"distbench: MLflow could not record the analysis ({type(err).__name__}: "
              f"{err}); the report is on disk", file=sys.stderr)


def _print_summary(table, verdicts, folder: Path) -> None:  # noqa: ANN001
    print(f"{'model':<12}{'cells':>6}{'raw MAPE %':>12}{'fitted MAPE %':>15}{'worst %':>9}")
    for row in table:
        print(f"{row.model:<12}{row.cells:>6}{row.raw_mape:>12.1f}{row.fitted_mape:>15.1f}"
              f"{row.fitted_worst:>9.1f}")
    if verdicts:
        print(f"recommendations correct: {sum(v.correct for v in verdicts)} of {len(verdicts)} "
              f"workloads")
    print(f"report: {folder / 'report.md'}")


@command
def main(argv: Sequence[str] | None = None) -> None:
    parser = command_parser("python -m harness.analysis", __doc__)
    options, overrides = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    config = validate(compose_config(overrides))
    analyse(config, experiment=config.tracking.experiment,
            cache=cache_for(options.probe_batches))


if __name__ == "__main__":
    main()
