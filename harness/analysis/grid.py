"""The measured grid: every finished cell of an MLflow experiment, with its config and timings.

A cell's config is read from the `config.yaml` artifact each run carries (the resolved config,
including the stage plan a pipeline cell actually trained), not from the flattened params,
whose values MLflow keeps as strings.
"""

from __future__ import annotations

import os
import statistics
import tempfile
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from harness.config.schema import ConfigError, DistbenchConfig
from harness.measure.spread import repeat_std
from harness.measure.steadiness import machine_speed_ms
from harness.profiles.steps import StepTime, steps_from_other_machines
from harness.records.recorded_runs import recorded_config
from harness.records.results import RunStatus
from harness.records.tracking import CELL_KEY_TAG


@dataclass(frozen=True)
class MeasuredCell:
    run_id: str
    run_name: str
    config: DistbenchConfig
    seconds_per_epoch: float  # NaN for a cell that did not fit (status oom)
    peak_memory_mb: float
    status: str = "ok"  # `ok`, or `oom`: a cell that ran out of its device's memory
    # Measured while the machine held still (harness.measure.steadiness; cells recorded before it
    # was measured count as steady).
    steady: bool = True
    # The standard deviation of seconds per epoch over the cell's repeats (None: one repeat).
    repeat_std: float | None = None
    # The cell's identity (harness.records.resume.cell_key): the same cell measured in several runs.
    cell_key: str = ""
    # How fast the machine was while the cell ran: the reference kernel's milliseconds
    # (harness.measure.steadiness.machine_speed_ms); None for a cell recorded without it.
    reference_ms: float | None = None
    # How many runs its figures are the median of (`one_per_cell`): more than one where the
    # cell was measured again.
    runs: int = 1
    # Which machine measured it (`machine_label`): "" for a cell recorded before the CPU's
    # instruction set was (`harness.runtime.environment.cpu_capability`).
    machine: str = ""

    @property
    def fitted_in_memory(self) -> bool:
        return self.status != "oom"

    @property
    def model(self) -> str:
        return self.config.distribution.name

    @property
    def network(self) -> str:
        return self.config.network.key

    @property
    def family(self) -> str:
        """The kind of network, for holding a whole family out of a fit: language models
        (token data) or image networks."""
        return LANGUAGE_MODELS if self.config.dataset.spec.tokens else IMAGE_NETWORKS

    @property
    def workload(self) -> tuple[str, str]:
        """What a user asks the recommender about: (dataset, network)."""
        return self.config.dataset.key, self.config.network.key


IMAGE_NETWORKS = "image networks"
LANGUAGE_MODELS = "language models"


def load_grid(
    uri: str, experiment: str, *, statuses: tuple[str, ...] = (RunStatus.ok.value,)
) -> list[MeasuredCell]:
    """The experiment's cells with one of `statuses` (`ok`: finished; `oom`: did not fit),
    oldest first (a sweep's parent run, the probe and analysis runs carry no cell status and
    are skipped)."""
    from harness.records.mlflow_store import open_store
    from harness.runtime.environment import machine_label  # loads torch: not on `--help`'s path

    # One tiny config file per run: MLflow's per-download progress bar would only be noise.
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    client = open_store(uri)  # checked, and bounded like a cell's (2 retries)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        raise ConfigError(
            f"tracking.experiment={experiment} is invalid: no such MLflow experiment at {uri}"
        )
    # One query per status: MLflow's filter has no IN for tags.
    runs = sorted(
        (
            run
            for status in statuses
            for run in client.search_runs(
                [found.experiment_id], filter_string=f"tags.status = '{status}'", max_results=10_000
            )
        ),
        key=lambda run: run.info.start_time,
    )
    cells = []
    with tempfile.TemporaryDirectory() as scratch:
        for run in runs:
            config = recorded_config(client, run, Path(scratch))
            metrics = run.data.metrics
            cells.append(
                MeasuredCell(
                    run.info.run_id,
                    run.info.run_name or run.info.run_id,
                    config,
                    metrics.get("seconds_per_epoch", float("nan")),
                    metrics.get("peak_memory_mb", float("nan")),
                    run.data.tags["status"],
                    steady=metrics.get("steady", 1.0) != 0.0,
                    repeat_std=repeat_std(metrics),
                    cell_key=run.data.tags.get(CELL_KEY_TAG, ""),
                    reference_ms=machine_speed_ms(metrics),
                    machine=machine_label(run.data.tags),
                )
            )
    return cells


def mixed_machine_lines(cells: Sequence[MeasuredCell]) -> list[str]:
    """One line for each hardware config whose cells were measured on more than one machine
    (cells of an unknown machine are not counted): their times are not comparable, and a fit
    over them learns the difference between the machines as model error."""
    by_hardware: dict[str, Counter[str]] = {}
    for cell in cells:
        if cell.machine:
            by_hardware.setdefault(cell.config.hardware.name, Counter())[cell.machine] += 1
    return [
        f"hardware={hardware}: its cells were measured on {len(counts)} machines "
        f"({'; '.join(f'{machine}: {n} cell(s)' for machine, n in sorted(counts.items()))}): "
        f"their times are not comparable; measure them again on one machine "
        f"(hydra.launcher.force=true) or analyse each machine's cells in an experiment "
        f"of their own"
        for hardware, counts in sorted(by_hardware.items())
        if len(counts) > 1
    ]


def step_time_machine_lines(
    step_times: Sequence[tuple[str, StepTime]], cells: Sequence[MeasuredCell]
) -> list[str]:
    """One line for each machine other than the cells' that measured step times the
    predictions use (probed by an analysis run elsewhere, or read from a facts file kept on
    another machine with --no-probe). Such a step time holds that machine's speed: the
    reference kernel scales only step times taken from the cells themselves
    (`predict.facts.speed.at_machine_speed`), and across instruction sets not even those reliably.
    Silent where no cell names its machine (recorded before `cpu_capability` was)."""
    machines = {cell.machine for cell in cells if cell.machine}
    other = steps_from_other_machines(
        (
            (f"{workload}, batch {step.batch}", step)
            for workload, step in step_times
            if not step.reference_in_cells
        ),
        machines,
    )
    return [
        f"{len(used)} step time(s) the predictions use were measured on {machine} "
        f"({'; '.join(used[:3])}{'; ...' if len(used) > 3 else ''}), the cells on "
        f"{'; '.join(sorted(machines))}: the predictions hold the other machine's speed; "
        f"run the analysis on the cells' machine (or --no-probe with a facts file probed "
        f"there)"
        for machine, used in other.items()
    ]


def one_per_cell(runs: Sequence[MeasuredCell]) -> list[MeasuredCell]:
    """Each cell once, however many runs measured it (an unsteady cell measured again, cells
    re-measured at random, a sweep repeated), in the order each was first measured.

    A cell measured in several runs stands at the median of its steady runs: a run the machine
    disturbed is what measuring again replaces. Where no run was steady it stands at the median
    of all of them and stays unsteady. Counting each run apart would weigh a re-measured cell
    twice in the fit, and leave-one-cell-out would hold out one run while its twin stays in the
    fit. The runs themselves are still what the noise floor is measured on
    (`harness.analysis.noise`)."""
    groups: dict[str, list[MeasuredCell]] = {}
    for run in runs:
        groups.setdefault(run.cell_key or run.run_id, []).append(run)
    return [_merged(group) for group in groups.values()]


def _merged(group: Sequence[MeasuredCell]) -> MeasuredCell:
    if len(group) == 1:
        return group[0]
    chosen = [run for run in group if run.steady] or list(group)
    references = [run.reference_ms for run in chosen if run.reference_ms is not None]
    # The latest chosen run's identity; the medians of what was measured.
    return replace(
        chosen[-1],
        seconds_per_epoch=statistics.median(r.seconds_per_epoch for r in chosen),
        peak_memory_mb=statistics.median(r.peak_memory_mb for r in chosen),
        repeat_std=chosen[-1].repeat_std if len(chosen) == 1 else None,
        reference_ms=statistics.median(references) if references else None,
        runs=len(chosen),
    )
