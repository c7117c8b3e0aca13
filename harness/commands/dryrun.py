"""`python -m harness [overrides] --dry-run`: the cells a command would run, listed; none runs.

The cells are those `launchers.hydra_main.check_hydra_main` composes before a real run (Hydra's
basic sweeper lists them, `launchers.cells.cell_config` composes each as its own processes will
see it, `harness.config.schema.validate` checks it), so the list is exactly what would run. A cell
that is invalid stops the dry run as it would stop the sweep (one line, exit status 2). A cell
that is valid but cannot run where it would go (a CUDA cell on this machine without CUDA, a
multi-node cell with the local launcher) is listed all the same, with the reason: listing a
cluster's grid from a laptop or a login node is what a dry run is for.

Where an analysis fitted the cells' hardware (`harness.analysis.calibration.choose_fit`), each
cell gets its predicted seconds per epoch, and the sweep its total (seconds per epoch x
`run.epochs` x `run.repeats`, summed); nothing is timed for it: the step times and layer
profiles are those measured earlier (`<run.output_dir>/facts/<hardware>.json`, sequential
cells in MLflow), as `harness.recommend --no-probe` uses them. Nothing is launched, and
nothing is written: no output directory, no MLflow store.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig

from harness.cli.preflight import check_runs_here, check_writable_dir, is_slurm_launcher
from harness.config.schema import ConfigError, DistbenchConfig

if TYPE_CHECKING:  # loaded where predictions are made: a plain listing needs neither
    from harness.analysis.calibration import Fitted
    from harness.profiles.steps import StepTime

DRY_RUN_FLAG = "--dry-run"
_NONE = "-"


@dataclass(frozen=True)
class PlannedCell:
    """One cell of the command, as it would run."""

    number: int  # Hydra's job number (the sweep subdirectory)
    config: DistbenchConfig
    # Why this cell cannot run where the launcher would run it; None when it can.
    blocked: str | None = None

    @property
    def nodes(self) -> int:
        """Nodes the cell occupies (a one-worker cell one, whatever the hardware has; as
        `launchers.slurm.job_size` allocates it)."""
        return self.config.hardware.nodes if self.config.world_size > 1 else 1

    @property
    def stage_plan(self) -> str:
        """The pipeline plan the config gives (replicas per stage, layers per stage), else
        '-' (planned when the cell starts)."""
        own = self.config.distribution.own_settings_raw()
        stages, balance = own.get("stages"), own.get("balance")
        parts = [stages or "", str(balance) if balance is not None else ""]
        return " ".join(part for part in parts if part) or _NONE


@dataclass
class Predictions:
    """Predicted seconds per epoch by cell number, and why the others have none."""

    seconds: dict[int, float] = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)  # the fits used, one line each
    # Where a fit's parameters may not hold for the facts used (`machine_since_fit`).
    warnings: list[str] = field(default_factory=list)
    missing: dict[str, list[int]] = field(default_factory=dict)  # reason -> cell numbers


def plan_cell(
    number: int,
    cfg: DictConfig,
    launcher: DictConfig,
    size_cell: Callable[[DistbenchConfig], Any],
    launcher_error: str | None = None,
) -> PlannedCell:
    """Validate a cell (an invalid one raises, as in a real run), and find what would stop it
    where it would run: this machine for the local launchers (its device, data, output
    directory, one node), the submitting machine's output directory and the job's sizing for
    SLURM (`launcher` is the composed `hydra` node), or the launcher itself
    (`launcher_error`)."""
    from harness.config.schema import validate

    cell = validate(cfg, owned=True)  # composed for this plan alone
    if launcher_error is not None:
        return PlannedCell(number, cell, launcher_error)
    try:
        if is_slurm_launcher(launcher):
            check_writable_dir("run.output_dir", cell.run.output_dir)
        else:
            check_runs_here(cell)
        size_cell(cell)
    except ConfigError as err:
        return PlannedCell(number, cell, " ".join(str(err).split()))
    return PlannedCell(number, cell)


def predict(cells: Sequence[PlannedCell]) -> Predictions:
    """Each cell's predicted seconds per epoch where an analysis fitted its hardware, from
    facts measured earlier (module docstring); nothing is timed or written."""
    from harness.analysis.calibration import Fitted, choose_fit
    from harness.distributions.registry import specs
    from harness.predict.cell import epoch_terms
    from harness.predict.facts.cache import FactsCache, step_time_source
    from harness.predict.facts.gather import gather
    from harness.predict.facts.policy import FactsPolicy
    from harness.profiles.hardware import profile_for

    predictions = Predictions()
    fits: dict[tuple[str, str], Fitted | None] = {}
    caches: dict[str, FactsCache] = {}
    steps: dict[tuple[str, str], dict[str, StepTime]] = {}  # per fit: the step times used
    for planned in cells:
        config = planned.config
        root, hardware = config.run.output_dir, config.hardware.name
        if (root, hardware) not in fits:
            path = choose_fit(Path(root), hardware, list(specs()))
            fitted = None if path is None else Fitted.load(path, hardware)
            if fitted is not None:
                predictions.sources.append(fitted.source)
            fits[root, hardware] = fitted
        fitted = fits[root, hardware]
        if fitted is None:
            _missing(
                predictions, f"no analysis in {root}/analysis fitted hardware={hardware}", planned
            )
            continue
        why_not = _unpredictable(config)
        if why_not is not None:
            _missing(predictions, why_not, planned)
            continue
        # no measurements: a dry run reads kept facts only, and starts no worker
        policy = FactsPolicy(probe=False, measure_memory=False, facts_root=Path(root))
        cache = caches.setdefault(root, FactsCache(policy))
        try:
            facts = gather(config, cache)
            terms = epoch_terms(config, facts, profile_for(config.hardware, Path(root)))
        except (ConfigError, ValueError) as err:  # MissingMeasurement: what to measure where
            _missing(predictions, " ".join(str(err).split()), planned)
            continue
        predictions.seconds[planned.number] = terms.seconds(fitted.params)
        step = step_time_source(config, cache)
        if step is not None:
            what = f"{config.network.key}/{config.dataset.key}, batch {step.batch}"
            steps.setdefault((root, hardware), {})[what] = step
    predictions.warnings = _machine_lines(cells, fits, steps)
    return predictions


def _machine_lines(
    cells: Sequence[PlannedCell],
    fits: dict[tuple[str, str], Fitted | None],
    steps: dict[tuple[str, str], dict[str, StepTime]],
) -> list[str]:
    """For each fit, a line where the step times its cells' predictions used were measured
    on another machine than the fit's cells (`harness.analysis.calibration.machine_since_fit`):
    a dry run reads whatever facts were kept, wherever they were measured."""
    from harness.analysis.calibration import machine_since_fit

    hardware = {(p.config.run.output_dir, p.config.hardware.name): p.config.hardware for p in cells}
    lines = (
        machine_since_fit(fitted, sorted(used.items()), hardware[key])
        for key, used in steps.items()
        if (fitted := fits[key]) is not None
    )
    return [line for line in lines if line]


def _unpredictable(config: DistbenchConfig) -> str | None:
    """Why a cell whose prediction takes a layer profile (a pipeline's, or one whose
    collectives hide behind its compute: `predict.facts.gather.needs_layer_profile`) cannot be
    predicted without measuring: no profile kept for its network on its device (taking one
    means training the network's layers here)."""
    from harness.distributions.registry import spec_of
    from harness.predict.facts.gather import needs_layer_profile
    from harness.predict.facts.store import FactsStore, facts_path

    if not needs_layer_profile(config):
        return None
    needs = (
        "pipelines"
        if spec_of(config).stage_planner is not None
        else "collectives beside the compute"
    )
    threads = config.hardware.cpu_threads if config.hardware.device.value == "cpu" else None
    path = facts_path(config.run.output_dir, config.hardware.name)
    try:
        store = FactsStore.load(path, config.hardware.name)
        profile = store.profile(
            config.network.key, config.dataset.key, config.hardware.device.value, threads
        )
    except ConfigError as err:
        return " ".join(str(err).split())
    if profile is None:
        return (
            f"{needs}: no layer profile of {config.network.label}/"
            f"{config.dataset.key} kept in {path} (python -m harness.recommend "
            f"keeps one)"
        )
    return None


def _missing(predictions: Predictions, reason: str, planned: PlannedCell) -> None:
    predictions.missing.setdefault(reason, []).append(planned.number)


def _sets_the_step(config: DistbenchConfig) -> bool:
    """Whether the cell is sized by its global batch (`run.global_batch`) or splits it into
    micro-batches and accumulation steps of its own (a plan): the table then shows both."""
    own = config.distribution.own_settings(config)
    return config.run.global_batch is not None or "accumulation_steps" in own


def table(cells: Sequence[PlannedCell], predictions: Predictions) -> str:
    """The cells as a text table (pandas' formatting), one row each."""
    import pandas as pd

    rows = []
    for planned in cells:
        config = planned.config
        own = config.distribution.own_settings(config)
        micro_batches = own.get("micro_batches")
        row = {
            "#": planned.number,
            "cell": config.run_name,
            "distribution": config.distribution.name,
            "workers": config.world_size,
            "nodes": planned.nodes,
            "device": config.hardware.device.value,
            "global batch": config.global_batch_size,
            "batch": config.batch_size,
            "micro-batches": micro_batches if micro_batches is not None else _NONE,
            "accumulation": own.get("accumulation_steps", 1),
            "stage plan": planned.stage_plan,
            "can run": "no" if planned.blocked else "yes",
        }
        if predictions.sources:  # a fit for some cells' hardware
            seconds = predictions.seconds.get(planned.number)
            row["s/epoch"] = _NONE if seconds is None else f"{seconds:.3f}"
        rows.append(row)
    frame = pd.DataFrame(rows)
    if not any(planned.blocked for planned in cells):
        frame = frame.drop(columns="can run")
    if not any(_sets_the_step(planned.config) for planned in cells):
        # the model's own batch settings alone: the batch column says it all
        frame = frame.drop(columns=["global batch", "accumulation"])
    # Every column left-aligned, as text (pandas aligns values right, and its numbers keep a
    # place for a sign), under a left-aligned header.
    frame = frame.astype(str)
    left = {
        column: _left(max(len(column), *(len(value) for value in frame[column])))
        for column in frame.columns
    }
    text = frame.to_string(index=False, justify="left", formatters=left)
    return "\n".join(line.rstrip() for line in text.splitlines())


def _left(width: int) -> Callable[[Any], str]:
    return lambda value: str(value).ljust(width)


def report(what: str, launcher: str, cells: Sequence[PlannedCell], predictions: Predictions) -> str:
    """The whole listing: a header, the table, then what stops cells and what they cost."""
    lines = [
        f"{what}: {len(cells)} cell{'s' if len(cells) != 1 else ''}, launcher {launcher}; "
        f"dry run: nothing is launched or written",
        table(cells, predictions),
    ]
    blocked: dict[str, list[int]] = {}
    for planned in cells:
        if planned.blocked:
            blocked.setdefault(planned.blocked, []).append(planned.number)
    for reason, numbers in blocked.items():
        lines.append(f"cannot run {_numbers(numbers, len(cells))}: {reason}")
    return "\n".join(lines + _prediction_lines(cells, predictions))


def _prediction_lines(cells: Sequence[PlannedCell], predictions: Predictions) -> list[str]:
    lines = [f"s/epoch predicted with {source}" for source in predictions.sources]
    lines += predictions.warnings
    for reason, numbers in predictions.missing.items():
        lines.append(f"no prediction for {_numbers(numbers, len(cells))}: {reason}")
    predicted = [planned for planned in cells if planned.number in predictions.seconds]
    if predicted:
        total = sum(
            predictions.seconds[p.number] * p.config.run.epochs * p.config.run.repeats
            for p in predicted
        )
        runs = sorted({(p.config.run.epochs, p.config.run.repeats) for p in predicted})
        per_cell = "; ".join(
            f"{epochs} epoch{'s' if epochs != 1 else ''} x {repeats} "
            f"repeat{'s' if repeats != 1 else ''}"
            for epochs, repeats in runs
        )
        lines.append(
            f"predicted training time: {_duration(total)} for "
            f"{len(predicted)} of {len(cells)} cells ({per_cell} each; warm-up, "
            f"start-up and data generation not included)"
        )
    return lines


def _numbers(numbers: Sequence[int], count: int) -> str:
    """'every cell', or 'cells 0-3, 7'."""
    if len(numbers) == count:
        return "every cell" if count != 1 else "the cell"
    spans: list[list[int]] = []
    for number in sorted(numbers):
        if spans and number == spans[-1][1] + 1:
            spans[-1][1] = number
        else:
            spans.append([number, number])
    text = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)
    return f"cell{'s' if len(numbers) > 1 else ''} {text}"


def _duration(seconds: float) -> str:
    """'42.0 s', '12 min 5 s', '3 h 25 min'."""
    if not math.isfinite(seconds) or seconds < 60:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {rest} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"
