"""`python -m harness.analysis [tracking.experiment=NAME] [overrides] [--probe-batches N]`

Reads the finished cells of an MLflow experiment, predicts each with the performance models,
fits their free parameters, and writes `<run.output_dir>/analysis/<experiment>/`:
`report.md` with its plots and `fit.json` (the fitted parameters `harness.recommend` reads).
The same files are logged as artifacts of an `analysis` run in the experiment.

The models' facts are measured here (the sequential probe, the layer profile), so run it on a
machine with the grid's kind of device, as nothing else is running, right after the grid: a
shared machine's speed drifts over the hours (a workload whose one-worker cells ran slower or
faster than its probe says is named). `--no-probe` reuses the facts measured earlier
(`<run.output_dir>/facts/<hardware>.json`, else the grid's sequential cells, each cell then
scaled to the speed it ran at by the reference kernels) and times no step; a layer profile
the facts file lacks is still taken on this CPU (shares, not times). Where the grid has
one-worker cells the models are judged a second time with each network's step time from them
(`harness.analysis.step_from_cells`): the models' own error, apart from the probe's.
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from harness.analysis.calibration import noise_for_ties
from harness.analysis.fit import (
    CellPrediction,
    accuracy,
    family_held_out,
    held_out,
    leave_one_network_out_note,
    params_per_hardware,
    runtime_per_hardware,
    signed_error,
)
from harness.analysis.grid import (
    MeasuredCell,
    load_grid,
    mixed_machine_lines,
    one_per_cell,
    step_time_machine_lines,
)
from harness.analysis.noise import NoiseFloor, noise_floor, noise_floor_per_model
from harness.analysis.recommendations import judge, memory_verdicts, tie_summary
from harness.analysis.report import write_report
from harness.analysis.step_from_cells import StepFromCells, judge_with_steps_from_cells
from harness.cli.errors import command
from harness.cli.preflight import check_writable_dir
from harness.commands.compose import compose_config
from harness.commands.facts_options import command_parser
from harness.config.schema import ConfigError, DistbenchConfig, validate
from harness.predict.cell import epoch_terms, memory_per_worker_mb, recorded_peak_mb
from harness.predict.facts.cache import FactsCache, cache_for, step_time_source, step_times_used
from harness.predict.facts.gather import gather
from harness.predict.facts.speed import at_machine_speed, speed_ratio
from harness.predict.labels import setting_label
from harness.predict.parameters import PARAMETERS
from harness.profiles.hardware import (
    HardwareProfile,
    link_line,
    links_label,
    profile_for,
    profile_path,
)
from harness.records.mlflow_store import tracking_uri
from harness.records.tracking import log_run
from harness.worker.measurements import WorkerMeasurements
from workloads.datasets.atomic import write_json_atomic
from workloads.progress import track

FIT_FILE = "fit.json"


def hardware_profiles(
    cells: Sequence[MeasuredCell], output_root: Path
) -> dict[str, HardwareProfile | None]:
    """The link profile the predictions use for each hardware of the cells (`profile_for`:
    the latest `harness.probe` measured under `output_root`, else the configured speeds;
    None for one worker), one file read per hardware."""
    profiles: dict[str, HardwareProfile | None] = {}
    for cell in cells:
        hardware = cell.config.hardware
        if hardware.name not in profiles:
            profiles[hardware.name] = profile_for(hardware, output_root)
    return profiles


def link_lines(
    cells: Sequence[MeasuredCell], profiles: dict[str, HardwareProfile | None], output_root: Path
) -> list[str]:
    """Where each hardware's link speeds come from. Configured speeds are a guess the fitted
    `communication` factor then makes up for, and a profile probed after the analysis would
    meet a factor fitted against the guess: said, with the command that measures them."""
    lines = []
    configs = {cell.config.hardware.name: cell.config.hardware for cell in cells}
    for name, profile in sorted(profiles.items()):
        if profile is None:  # one worker: no link
            continue
        if profile.source == "measured":
            lines.append(f"{name}'s {link_line(configs[name], profile)}")
            continue
        lines.append(
            f"{name}'s links: its configured speeds, not measured (no harness.probe "
            f"profile in {profile_path(output_root, name).parent}); the fitted "
            f"communication factor makes up for how far they are off, and would not "
            f"match a profile probed later: python -m harness.probe hardware={name} "
            f"run.output_dir={output_root}, then analyse again"
        )
    return lines


def predict_cells(
    cells: Sequence[MeasuredCell],
    cache: FactsCache,
    profiles: dict[str, HardwareProfile | None],
    *,
    at_cells_speed: bool = True,
) -> list[CellPrediction]:
    """The raw equations' terms and memory for every measured cell, each hardware's links
    from `profiles` (`hardware_profiles`); `at_cells_speed`: a step time taken from
    sequential cells is moved to the machine speed each cell ran at
    (`predict.facts.speed.at_machine_speed`)."""
    predictions = []
    for cell in track(cells, len(cells), "predicting cells", "cell(s)"):
        facts, scale = gather(cell.config, cache), 1.0
        step = step_time_source(cell.config, cache)
        if at_cells_speed:
            facts, scale = at_machine_speed(facts, step, cell.reference_ms)
        profile = profiles[cell.config.hardware.name]
        predictions.append(
            CellPrediction(
                cell,
                epoch_terms(cell.config, facts, profile),
                recorded_peak_mb(cell.config, facts),
                speed_ratio=speed_ratio(step, cell.reference_ms),
                speed_scaled=scale != 1.0,
            )
        )
    return predictions


def speed_lines(predictions: Sequence[CellPrediction], *, scaling: bool) -> list[str]:
    """What the machine's speed while the cells ran did to the predictions: how many step
    times were moved to it, how far the one-worker cells stood from the step times they were
    predicted from (the range over workloads), and each workload whose one-worker cells ran
    slower or faster than its probed step time says by more than the cells' steadiness
    threshold (a one-worker cell is that step time, batch after batch: the gap is the
    machine's drift between the cells and the probe, and every cell of the workload carries
    it)."""
    scaled = sorted(p.speed_ratio for p in predictions if p.speed_scaled)
    lines = []
    if scaled:
        lines.append(
            f"{len(scaled)} of {len(predictions)} cells predicted at the machine "
            f"speed they ran at (step times from the grid's one-worker cells, scaled by "
            f"the reference kernel: x{scaled[0]:.2f}-x{scaled[-1]:.2f}, median "
            f"x{statistics.median(scaled):.2f})"
        )
    elif not scaling:
        lines.append(
            "step times used at the machine speed they were measured at (--no-speed-scaling)"
        )
    by_workload: dict[tuple[str, str, str], list[CellPrediction]] = {}
    for p in predictions:
        if p.cell.config.world_size == 1 and not p.speed_scaled and p.raw_s > 0:
            by_workload.setdefault(
                (p.cell.network, p.cell.config.dataset.key, p.cell.config.hardware.name), []
            ).append(p)
    ratios = {
        workload: statistics.median(p.cell.seconds_per_epoch / p.raw_s for p in own)
        for workload, own in by_workload.items()
    }
    if len(ratios) > 1:  # the spread first: how far the step times stood from the cells
        low, middle, high = (
            min(ratios.values()),
            statistics.median(ratios.values()),
            max(ratios.values()),
        )
        lines.append(
            f"the one-worker cells took x{low:.2f}-x{high:.2f} the time their step "
            f"times say (median x{middle:.2f}, {len(ratios)} workloads): the machine's "
            f"drift between the cells and the step times, which every cell of a "
            f"workload carries (the judgement with the cells' own step times leaves "
            f"it out)"
        )
    for (network, dataset, hardware), own in sorted(by_workload.items()):
        ratio = ratios[(network, dataset, hardware)]
        threshold = own[0].cell.config.run.steadiness_threshold
        if abs(ratio - 1) > threshold:
            kernel = statistics.median(p.speed_ratio for p in own)
            lines.append(
                f"{network}/{dataset} on {hardware}: its one-worker cells took x{ratio:.2f} "
                f"the time its step times say (threshold {threshold:.0%})"
                + (f", the reference kernel x{kernel:.2f}" if math.isfinite(kernel) else "")
                + f": the machine was {'slower' if ratio > 1 else 'faster'} when its cells "
                f"ran than when the step times were probed, and every cell of it carries "
                f"that drift; probe right after the cells, or measure them again"
            )
    return lines


def analyse(
    config: DistbenchConfig,
    *,
    experiment: str,
    cache: FactsCache,
    exclude_unsteady: bool = False,
    fit_on_networks: Sequence[str] = (),
    at_cells_speed: bool = True,
) -> Path:
    """Everything the module docstring says; returns the report's folder. `exclude_unsteady`
    leaves out of the fit the cells measured while the machine was unsteady;
    `fit_on_networks` fits on those networks' cells only (a small calibration) and predicts
    every other network's cells from that fit; `at_cells_speed`: see `predict_cells`."""
    output_root = Path(config.run.output_dir)
    uri = tracking_uri(config.tracking.uri, output_root)
    measured = load_grid(uri, experiment, statuses=("ok", "oom"))
    runs = [cell for cell in measured if cell.status == "ok"]
    cells = one_per_cell(runs)
    if len(cells) < len(runs):
        print(
            f"{len(runs)} runs of {len(cells)} cells: each cell measured in more than one "
            f"run counts once, at the median of its steady runs"
        )
    unsteady = [cell for cell in cells if not cell.steady]
    if exclude_unsteady and unsteady:
        cells = [cell for cell in cells if cell.steady]
        print(
            f"left out {len(unsteady)} cell(s) measured while the machine was unsteady "
            f"(--exclude-unsteady): {', '.join(cell.run_name for cell in unsteady[:5])}"
            + (", ..." if len(unsteady) > 5 else "")
        )
    elif unsteady:
        print(
            f"{len(unsteady)} of {len(cells)} cells were measured while the machine was "
            f"unsteady; --exclude-unsteady leaves them out of the fit"
        )
    if not cells:
        raise ConfigError(
            f"tracking.experiment={experiment!r}: no finished (status ok) cells "
            f"at {uri}; measure a grid first"
        )
    fit_on = _fit_on(cells, fit_on_networks)
    # The floor is measured between the runs of one cell, so on the runs, not the merged cells.
    measured_runs = [run for run in runs if run.steady] if exclude_unsteady else runs
    noise = noise_floor_per_model(measured_runs)
    overall = noise_floor(measured_runs)
    profiles = hardware_profiles(cells, output_root)
    links = link_lines(cells, profiles, output_root)
    for line in links:
        print(line)
    started = time.perf_counter()
    predictions = predict_cells(cells, cache, profiles, at_cells_speed=at_cells_speed)
    probe_seconds = time.perf_counter() - started
    step_times = step_times_used(cache)
    scaled = [f"{workload}, batch {step.batch}" for workload, step in step_times if step.scaled]
    if scaled:  # the cells at those batches are judged against a guess: say so
        print(
            f"{len(scaled)} step time(s) scaled per sample from another batch, none measured "
            f"there ({'; '.join(scaled[:3])}{'; ...' if len(scaled) > 3 else ''}): report.md "
            f"lists where every step time came from"
        )
    # A grid measured on two machines, or step times from another machine than the cells',
    # first: no speed scaling makes those comparable.
    speed = [
        *mixed_machine_lines(cells),
        *step_time_machine_lines(step_times, cells),
        *speed_lines(predictions, scaling=at_cells_speed),
    ]
    for line in speed:
        print(line)
    by_cell = held_out(predictions, group=lambda cell: cell.run_id, fit_on=fit_on)
    by_network = held_out(predictions, group=lambda cell: cell.network, fit_on=fit_on)
    by_family = family_held_out(predictions, fit_on=fit_on)
    # Recommendations are judged where a network could be held out (another network of its
    # hardware to fit on); with one network there is nothing to judge them by.
    note = leave_one_network_out_note(predictions)
    table = accuracy(by_cell, by_network, by_family)
    # Judged as the recommender answers from this fit: its ties take each model's error on an
    # unseen network and the grid's noise floor (harness.analysis.calibration).
    verdicts = judge(
        [p for p in by_network if p.fitted_from > 0],
        errors={row.model: row.network_mape for row in table if math.isfinite(row.network_mape)},
        noise_percent=tie_noise_percent(overall),
        memory_errors={
            row.model: row.memory_mape for row in table if math.isfinite(row.memory_mape)
        },
    )
    at_cells_step = (
        None
        if note is not None
        else judge_with_steps_from_cells(
            cells,
            cache,
            lambda facts: predict_cells(cells, facts, profiles, at_cells_speed=at_cells_speed),
            fit_on=fit_on,
            noise_percent=tie_noise_percent(overall),
        )
    )
    fit_verdicts = memory_verdicts(
        measured,
        lambda cell: max(
            memory_per_worker_mb(cell.config, gather(cell.config, cache, timed=False))
        ),
        predictions,
    )
    fitted = [p for p in predictions if fit_on(p.cell)]
    params, runtime = params_per_hardware(fitted), runtime_per_hardware(fitted)
    folder = output_root / "analysis" / experiment
    files = write_report(
        folder,
        experiment=experiment,
        uri=uri,
        by_cell=by_cell,
        by_network=by_network,
        table=table,
        verdicts=verdicts,
        params=params,
        runtime_mb=runtime,
        probe_seconds=probe_seconds,
        fit_verdicts=fit_verdicts,
        single_network=note,
        noise=noise,
        overall_noise=overall,
        step_times=step_times,
        speed=speed,
        links=links,
        at_cells_step=at_cells_step,
    )
    fit_path = folder / FIT_FILE
    write_json_atomic(
        fit_path,
        {
            "experiment": experiment,
            "tracking_uri": uri,
            "cells": len(cells),
            "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "parameters": {
                name: {
                    "meaning": parameter.meaning,
                    "prior": parameter.prior,
                    "sigma": parameter.sigma,
                }
                for name, parameter in PARAMETERS.items()
            },
            "hardware": {
                hardware: _hardware_entry(
                    hardware, [p.cell for p in fitted], params, runtime, profiles.get(hardware)
                )
                for hardware in params
            },
            # The networks fitted on (null: every network of the grid); the others were only
            # predicted, which is how a small calibration is judged against a larger grid.
            "fitted_on_networks": sorted(fit_on_networks) or None,
            # The typical difference between two measurements of one cell (percent; null where no
            # cell was measured twice), per model and over the grid: the floor under any error.
            "noise_floor_percent": {
                "all": overall.percent if overall.measured else None,
                **{
                    model: floor.percent if floor.measured else None
                    for model, floor in noise.items()
                },
            },
            # The same, from each kind of repeated measurement apart: back-to-back repeats within
            # one run, and separate runs of the same cell (harness.analysis.noise).
            "noise_floor_by_kind": {
                "all": _kinds(overall),
                **{model: _kinds(floor) for model, floor in noise.items()},
            },
            "cells_left_out_unsteady": len(unsteady) if exclude_unsteady else 0,
            # Whether the accuracy's `network_*` errors (NaN where not) could be measured.
            "leave_one_network_out": {"measured": note is None, "why": note},
            "probe_batches": cache.policy.probe_batches,
            "accuracy": [asdict(row) for row in table],
            "recommendations": [
                {
                    "workload": list(v.workload),
                    "hardware": v.hardware,
                    "fastest": setting_label(v.fastest.cell.config),
                    "recommended": setting_label(v.recommended.cell.config),
                    "correct": v.correct,
                    "time_lost_percent": v.time_lost_percent,
                    # what the recommender names, its tie rule applied, and the options it
                    # called tied
                    "named": setting_label(v.named.cell.config),
                    "named_correct": v.named_correct,
                    "named_time_lost_percent": v.named_time_lost_percent,
                    "tied": [setting_label(p.cell.config) for p in v.tied_predictions],
                    "fastest_among_tied": v.fastest_among_tied,
                }
                for v in verdicts
            ],
            # The same judgement with each network's step time from its own one-worker cells
            # (harness.analysis.step_from_cells; null for a grid without them): the models' own
            # error, without the probe's drift from the cells.
            "step_from_cells": at_cells_step.to_json() if at_cells_step else None,
            "residuals": residuals(by_cell, by_network, by_family),
            "fit_in_memory": [
                {
                    "run": v.cell.run_name,
                    "status": v.cell.status,
                    "predicted_mb": v.predicted_mb,
                    "limit_mb": v.limit_mb,
                    "predicted_fit": v.predicted_fit,
                    "right": v.right,
                }
                for v in fit_verdicts
            ],
        },
    )
    _log(uri, experiment, table, verdicts, [*files, fit_path])
    _print_summary(table, verdicts, fit_verdicts, folder, note, noise, overall, at_cells_step)
    return folder


def _fit_on(
    cells: Sequence[MeasuredCell], networks: Sequence[str]
) -> Callable[[MeasuredCell], bool]:
    """Which cells the fit may learn from: every cell, or those of `networks` (each must have
    finished cells, else the fit would silently be the raw equations)."""
    if not networks:
        return lambda cell: True
    measured = sorted({cell.network for cell in cells})
    missing = sorted(set(networks) - set(measured))
    if missing:
        raise ConfigError(
            f"--fit-on {','.join(networks)} is invalid: no finished cells of "
            f"{', '.join(missing)}; the grid measured {', '.join(measured)}"
        )
    print(
        f"fitting on {', '.join(sorted(networks))} only; the other networks "
        f"({', '.join(n for n in measured if n not in networks) or 'none'}) are predicted "
        f"from that fit"
    )
    chosen = frozenset(networks)
    return lambda cell: cell.network in chosen


def _hardware_entry(
    hardware: str,
    cells: Sequence[MeasuredCell],
    params: dict[str, dict[str, float]],
    runtime: dict[str, float],
    profile: HardwareProfile | None,
) -> dict[str, Any]:
    """fit.json's entry of one hardware: its parameters, and what they were fitted on (cells,
    networks, cells per model: what `harness.recommend` counts as calibrated; the links:
    when `harness.probe` measured them, "configured" for the config's speeds, null for one
    worker; the machines the cells ran on, `harness.runtime.environment.machine_label`)."""
    own = [cell for cell in cells if cell.config.hardware.name == hardware]
    models: dict[str, int] = {}
    for cell in own:
        models[cell.model] = models.get(cell.model, 0) + 1
    return {
        "params": params[hardware],
        "runtime_mb": runtime[hardware],
        "cells": len(own),
        "networks": sorted({cell.network for cell in own}),
        "models": dict(sorted(models.items())),
        "links": links_label(profile),
        "machines": sorted({cell.machine for cell in own if cell.machine}),
    }


def residuals(
    by_cell: Sequence[CellPrediction],
    by_network: Sequence[CellPrediction],
    by_family: Sequence[CellPrediction],
) -> list[dict[str, Any]]:
    """Every cell's measured seconds per epoch and its signed error (percent, + = predicted
    slower) by the raw equations, with its network held out, and with its family held out
    (null with one family): what a MAPE hides."""
    network_error = {
        p.cell.run_id: signed_error(p.fitted_s, p.measured_s)
        for p in by_network
        if p.fitted_from > 0
    }  # none where no other network could be fitted on
    family_error = {p.cell.run_id: signed_error(p.fitted_s, p.measured_s) for p in by_family}
    return [
        {
            "run": p.cell.run_name,
            "model": p.cell.model,
            "network": p.cell.network,
            "family": p.cell.family,
            "measured_s": p.measured_s,
            "raw_error_percent": signed_error(p.raw_s, p.measured_s),
            "network_held_out_error_percent": network_error.get(p.cell.run_id),
            "family_held_out_error_percent": family_error.get(p.cell.run_id),
        }
        for p in by_cell
    ]


def _log(uri: str, experiment: str, table, verdicts, files: list[Path]) -> None:  # noqa: ANN001
    metrics = {}
    for row in table:
        metrics[f"mape_raw_{row.model}"] = row.raw_mape
        metrics[f"mape_held_out_cell_{row.model}"] = row.cell_mape
        if row.network_mape == row.network_mape:  # NaN: no network could be held out
            metrics[f"mape_held_out_network_{row.model}"] = row.network_mape
            metrics[f"worst_held_out_network_{row.model}"] = row.network_worst
        if row.memory_mape == row.memory_mape:
            metrics[f"memory_mape_held_out_network_{row.model}"] = row.memory_mape
        if row.family_mape == row.family_mape:
            metrics[f"mape_held_out_family_{row.model}"] = row.family_mape
            metrics[f"worst_held_out_family_{row.model}"] = row.family_worst
    if verdicts:
        metrics["recommendations_correct"] = sum(v.correct for v in verdicts) / len(verdicts)
    try:
        log_run(
            uri=uri,
            experiment=experiment,
            run_name="analysis",
            tags={"distbench.kind": "analysis"},
            params={},
            metrics=metrics,
            artifacts=files,
        )
    except Exception as err:  # noqa: BLE001 - the report is on disk either way
        print(
            f"distbench: MLflow could not record the analysis ({type(err).__name__}: "
            f"{err}); the report is on disk",
            file=sys.stderr,
        )


def tie_noise_percent(floor: NoiseFloor) -> float:
    """The noise floor the recommender's ties would take from this grid's fit.json."""
    return noise_for_ties(
        floor.runs.percent if floor.runs.measured else None,
        floor.runs.cells,
        floor.percent if floor.measured else None,
    )[0]


def _kinds(floor: NoiseFloor) -> dict[str, dict[str, float | int | None]]:
    return {
        kind: {"percent": part.percent if part.measured else None, "cells": part.cells}
        for kind, part in (("repeats", floor.repeats), ("runs", floor.runs))
    }


def _noise_column(noise: dict[str, NoiseFloor], model: str) -> str:
    floor = noise.get(model)
    return f"{floor.percent:>8.1f}" if floor is not None and floor.measured else f"{'-':>8}"


def _print_summary(
    table,  # noqa: ANN001
    verdicts,  # noqa: ANN001
    fit_verdicts,  # noqa: ANN001
    folder: Path,
    single_network: str | None = None,
    noise: dict[str, NoiseFloor] | None = None,
    overall: NoiseFloor | None = None,
    at_cells_step: StepFromCells | None = None,
) -> None:
    noise = noise or {}
    if overall is not None:
        print(overall.text() + "; an error below it cannot be told from the cells' noise")
    if single_network is not None:
        print(f"{single_network}; the recommender counts this fit's error as unknown")
    if all(row.network_mape != row.network_mape for row in table):  # none measured (NaN)
        print("held out by cell, and the raw equations (no network could be held out):")
        print(
            f"{'model':<12}{'cells':>6}{'cell MAPE %':>13}{'raw MAPE %':>12}"
            f"{'raw worst %':>13}{'noise %':>8}"
        )
        for row in table:
            print(
                f"{row.model:<12}{row.cells:>6}{row.cell_mape:>13.1f}{row.raw_mape:>12.1f}"
                f"{row.raw_worst:>13.1f}{_noise_column(noise, row.model)}"
            )
    else:
        print("held out by network (what a recommendation for a new network relies on):")
        print(
            f"{'model':<12}{'cells':>6}{'MAPE %':>8}{'worst %':>9}{'bias %':>8}"
            f"{'noise %':>8}{'memory %':>10}{'| cell MAPE %':>14}{'raw MAPE %':>12}"
        )
        for row in table:
            print(
                f"{row.model:<12}{row.cells:>6}{row.network_mape:>8.1f}"
                f"{row.network_worst:>9.1f}{row.network_bias:>+8.1f}"
                f"{_noise_column(noise, row.model)}{row.memory_mape:>10.1f}"
                f"{row.cell_mape:>14.1f}{row.raw_mape:>12.1f}"
            )
    if any(row.family_mape == row.family_mape for row in table):
        print(
            "held out by family (fitted on image networks only, predicting language models, "
            "and the reverse):"
        )
        print(f"{'model':<12}{'MAPE %':>8}{'worst %':>9}{'bias %':>8}")
        for row in table:
            print(
                f"{row.model:<12}{row.family_mape:>8.1f}{row.family_worst:>9.1f}"
                f"{row.family_bias:>+8.1f}"
            )
    if verdicts:
        lost = max(v.time_lost_percent for v in verdicts)
        print(
            f"recommendations right for {sum(v.correct for v in verdicts)} of "
            f"{len(verdicts)} workloads with their network held out (worst time lost "
            f"{lost:.1f} %)"
        )
        ties = tie_summary(verdicts)
        if ties:
            print(f"  {ties}")
    for line in at_cells_step.lines() if at_cells_step else []:
        print(line)
    if fit_verdicts:
        print(
            f"fit in memory predicted right for {sum(v.right for v in fit_verdicts)} of "
            f"{len(fit_verdicts)} cells with a memory limit "
            f"({sum(not v.cell.fitted_in_memory for v in fit_verdicts)} ran out of memory)"
        )
    print(f"report: {folder / 'report.md'}")


def parser() -> argparse.ArgumentParser:
    """The command's flags (the rest of its arguments are config overrides)."""
    flags = command_parser("python -m harness.analysis", __doc__)
    flags.add_argument(
        "--exclude-unsteady",
        action="store_true",
        help="leave out of the fit the cells measured while the machine was "
        "unsteady (harness.measure.steadiness; the sweep table marks them '~')",
    )
    flags.add_argument(
        "--fit-on",
        metavar="NETWORK[,NETWORK...]",
        type=_network_list,
        default=(),
        help="fit on these networks' cells only, as a small calibration "
        "would, and predict every other network's cells from that fit "
        "(their errors are then errors on networks never fitted on)",
    )
    flags.add_argument(
        "--no-speed-scaling",
        action="store_true",
        help="use step times taken from the grid's one-worker cells at the "
        "machine speed those cells ran at; by default each cell's is scaled "
        "by the reference kernel timed in it over theirs (a shared host "
        "drifts over an hour)",
    )
    return flags


def _network_list(text: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    if not names:
        raise argparse.ArgumentTypeError(
            "expected network names separated by commas, for example resnet18,vgg11"
        )
    return names


@command
def main(argv: Sequence[str] | None = None) -> None:
    options, overrides = parser().parse_known_args(sys.argv[1:] if argv is None else argv)
    config = validate(compose_config(overrides))
    uri = tracking_uri(config.tracking.uri, config.run.output_dir)
    cache = cache_for(
        options.probe_batches,
        measurements=WorkerMeasurements(),
        probe=not options.no_probe,
        facts_root=Path(config.run.output_dir),
        tracking_uri=uri,
        probe_spread=options.probe_spread,
        # A pipeline whose planner asks for it has each plan's stages timed in place, once
        # (seconds a plan; kept in the facts file): the recommender reads them from there.
        time_in_place=not options.no_probe,
    )
    check_writable_dir("run.output_dir", config.run.output_dir)  # the report goes there
    _check_store_exists(uri, config.tracking.experiment)
    analyse(
        config,
        experiment=config.tracking.experiment,
        cache=cache,
        exclude_unsteady=options.exclude_unsteady,
        fit_on_networks=options.fit_on,
        at_cells_speed=not options.no_speed_scaling,
    )


def _check_store_exists(uri: str, experiment: str) -> None:
    """A SQLite store must exist to be analysed: opening a missing one would create it,
    empty, where nothing was measured."""
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not Path(uri[len(prefix) :]).exists():
        raise ConfigError(
            f"tracking.experiment={experiment} is invalid: no MLflow store at "
            f"{uri} (nothing measured under run.output_dir, or set "
            f"tracking.uri); measure a grid first"
        )


if __name__ == "__main__":
    main()
