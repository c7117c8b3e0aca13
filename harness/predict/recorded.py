"""Sequential step times recorded in MLflow, for predicting on a device this machine lacks.

A sequential cell that finished `ok` on the hardware's kind of device, with the same network
and dataset (and on a CPU the same `hardware.cpu_threads`), measured one training step as
`seconds_per_epoch / batches trained per epoch` (`predict.cell.batches_per_epoch` of the
cell's own config, read from its `config.yaml` artifact as `harness.analysis` does). Cells of
every experiment in the store count; the median per batch size is taken, and where cells of the
same hardware configuration (`hardware.name`) exist, only theirs.
"""

from __future__ import annotations

import os
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

from harness.config.schema import DistbenchConfig
from harness.measure.steadiness import machine_speed_ms
from harness.profiles.steps import MeasuredStep
from harness.records.mlflow_store import store_not_created, tracking_failure, tracking_uri
from harness.records.results import RunStatus

_SHOWN_RUN_IDS = 3


@dataclass(frozen=True)
class _Cell:
    run_id: str
    hardware: str
    batch: int
    step_seconds: float
    # its machine (`harness.runtime.environment.machine_label`) where recorded
    device_name: str | None
    reference_ms: float | None  # the machine's speed while it ran (steadiness.machine_speed_ms)


def sequential_steps(
    config: DistbenchConfig, *, uri: str | None = None
) -> tuple[list[MeasuredStep], str]:
    """The step times recorded for `config`'s workload and device kind, one per batch size,
    and where they were looked for (for the message when there are none); in the store at
    `uri`, else `config`'s own."""
    uri = uri or tracking_uri(config.tracking.uri, config.run.output_dir)
    where = f"MLflow at {uri}"
    if store_not_created(uri):
        return [], f"{where} (no such store)"  # reading would create an empty one
    try:
        cells = _cells(uri, config)
    except Exception as err:  # noqa: BLE001 - an unreadable store is one source less
        return [], f"{where} (unreadable: {tracking_failure(err)})"
    by_batch: dict[int, list[_Cell]] = {}
    for cell in cells:
        by_batch.setdefault(cell.batch, []).append(cell)
    steps = []
    for batch, found in sorted(by_batch.items()):
        same = [cell for cell in found if cell.hardware == config.hardware.name]
        chosen = same or found
        ids = [cell.run_id for cell in chosen]
        shown = ", ".join(ids[:_SHOWN_RUN_IDS]) + (
            f" and {len(ids) - _SHOWN_RUN_IDS} more" if len(ids) > _SHOWN_RUN_IDS else ""
        )
        names = sorted({cell.device_name for cell in chosen if cell.device_name})
        source = (
            f"MLflow run{'s' if len(ids) > 1 else ''} {shown}"
            f"{' (median)' if len(ids) > 1 else ''} at {uri}"
        )
        speeds = [cell.reference_ms for cell in chosen]
        speed = None if None in speeds else statistics.median(speeds)  # type: ignore[type-var]
        steps.append(
            MeasuredStep(
                batch,
                statistics.median(c.step_seconds for c in chosen),
                source,
                1 if same else 2,
                ", ".join(names) or None,
                reference_ms=speed,
                reference_in_cells=True,
            )
        )
    return steps, where


def _cells(uri: str, config: DistbenchConfig) -> list[_Cell]:
    from harness.costs.terms import batches_per_epoch
    from harness.distributions.registry import baseline
    from harness.records.mlflow_store import open_store
    from harness.records.recorded_runs import recorded_config
    from harness.runtime.environment import machine_label  # loads torch: not on `--help`'s path

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    client = open_store(uri)  # checked, and bounded like a cell's (2 retries)
    experiments = [experiment.experiment_id for experiment in client.search_experiments()]
    if not experiments:
        return []
    wanted = {
        "distribution.name": baseline().name,
        "network.name": config.network.label,
        "dataset.name": config.dataset.name.value,
        "hardware.device": config.hardware.device.value,
    }
    runs = client.search_runs(
        experiments, filter_string=f"tags.status = '{RunStatus.ok.value}'", max_results=50_000
    )
    cells = []
    with tempfile.TemporaryDirectory() as scratch:
        for run in runs:
            params, metrics = run.data.params, run.data.metrics
            if (
                any(params.get(key) != value for key, value in wanted.items())
                or "seconds_per_epoch" not in metrics
            ):
                continue
            try:
                cell = recorded_config(client, run, Path(scratch))
            except Exception:  # noqa: BLE001, S112 - a run without a readable config: not one
                continue
            if cell.network.key != config.network.key or cell.dataset.key != config.dataset.key:
                continue  # the same label, other settings (a zoo model's options, seq_len)
            if (
                config.hardware.device.value == "cpu"
                and cell.hardware.cpu_threads != config.hardware.cpu_threads
            ):
                continue
            batches = batches_per_epoch(cell)
            if batches < 1:
                continue
            cells.append(
                _Cell(
                    run.info.run_id,
                    cell.hardware.name,
                    cell.batch_size,
                    metrics["seconds_per_epoch"] / batches,
                    machine_label(run.data.tags) or run.data.tags.get("device_name"),
                    machine_speed_ms(metrics),
                )
            )
    return cells
