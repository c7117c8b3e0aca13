"""What a user means by EXPERIMENT_OR_SWEEP, and that selection's cells as one pandas table.

Cell runs are the runs with a `status` tag (`harness.records.tracking.record_cell`); a sweep's
parent run, the analysis and probe runs have none. A sweep's cells are the runs nested under its
parent run, and the runs recorded from the sweep's directory (a cell uploaded later by
`harness.sync` is not nested: its launcher's parent run was closed by then).

Each cell's config axes come from the resolved config its run recorded, read and typed as the
analysis reads it (`harness.records.recorded_runs.recorded_config`): the batch size Table 3.3 gave,
the stage plan a pipeline trained.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from harness.cli.cell_results import failure_reason
from harness.config.schema import ConfigError, DistbenchConfig
from harness.distributions.registry import setting_names
from harness.records.mlflow_store import KIND_TAG, SWEEP_KIND, quiet_store_logs, store_not_created
from harness.records.recorded_runs import recorded_config
from harness.records.tracking import CELL_KEY_TAG, OUTPUT_DIR_TAG

log = logging.getLogger(__name__)

PARENT_TAG = "mlflow.parentRunId"
# set on a sweep's parent run (harness.records.sweep_runs._open_parent_run)
SWEEP_DIR_TAG = "sweep_dir"
# Metrics logged once per epoch or per repeat (harness.records.tracking._metrics, step = epoch or
# repeat): MLflow's run keeps only the last value, so they are read whole, as lists.
_SERIES = re.compile(r"epoch_\w+|repeat_\w+")
_PAGE = 1000  # runs per search request
# Columns in the order a reader scans them; the other metrics follow, then the series.
IDENTITY = ["experiment", "sweep", "run_name", "status"]
# ... then every model's own settings (`registry.setting_names`), then the epoch's size
AXES = [
    "dataset",
    "network",
    "distribution",
    "hardware",
    "device",
    "nodes",
    "workers",
    "batch_size",
    "global_batch_size",
    *setting_names(),
    "num_samples",
    "epochs",
    "seed",
]
KEY_METRICS = [
    "seconds_per_epoch",
    "steady",  # 0: measured while the machine was unsteady (harness.measure.steadiness)
    "seconds_per_epoch_ci95_low",
    "seconds_per_epoch_ci95_high",
    "repeats",
    "images_per_second",
    "tokens_per_second",
    "peak_memory_mb",
    "eval_accuracy",
    "reached_target",
    "time_to_target_s",
    "epochs_to_target",
]
TRAILER = [
    "error",
    "run_id",
    "parent_run_id",
    "cell_key",
    "output_dir",
    "started",
    "ended",
    "duration_s",
]


@dataclass(frozen=True)
class Selection:
    """One experiment, or one sweep of it."""

    text: str  # as the user wrote it
    experiment: str
    experiment_id: str
    sweep_run_id: str | None = None  # None: the whole experiment
    sweep_name: str | None = None

    def __str__(self) -> str:
        if self.sweep_run_id is None:
            return f"experiment {self.experiment}"
        return f"sweep {self.sweep_name} (run {self.sweep_run_id}) of experiment {self.experiment}"


def client_for(uri: str) -> Any:
    """An MLflow client of the store at `uri`, which must exist: opening a missing SQLite
    store would create an empty one where nothing was measured."""
    if store_not_created(uri):
        raise ConfigError(
            f"tracking.uri={uri} is invalid: no MLflow store there (nothing "
            f"measured under run.output_dir); allowed: the store a sweep "
            f"recorded to (run.output_dir=... or tracking.uri=...)"
        )
    from harness.records.mlflow_store import open_store

    # One tiny config file per run: MLflow's per-download progress bar would only be noise.
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    quiet_store_logs()
    return open_store(uri)  # checked, and bounded like a cell's (2 retries)


def select(client: Any, text: str) -> Selection:
    """The experiment named `text`, else the one sweep `text` names (parent run id, directory,
    the directory's last parts, or run name); ConfigError if none or several."""
    experiment = client.get_experiment_by_name(text)
    if experiment is not None:
        return Selection(text, experiment.name, experiment.experiment_id)
    names = {e.experiment_id: e.name for e in client.search_experiments()}
    matches = [
        run
        for run in _search(client, list(names), f"tags.`{KIND_TAG}` = '{SWEEP_KIND}'")
        if _names_sweep(run, text)
    ]
    if len(matches) > 1:
        raise ConfigError(
            f"selection {text!r} is invalid: it names {len(matches)} sweeps ("
            + ", ".join(
                f"{run.info.run_id} of {names[run.info.experiment_id]}" for run in matches[:5]
            )
            + "); allowed: one sweep's parent run id or directory"
        )
    if not matches:
        raise ConfigError(
            f"selection {text!r} is invalid: no such experiment or sweep at "
            f"{client.tracking_uri}; allowed: an experiment ({', '.join(sorted(names.values()))})"
            f" or a sweep (parent run id, sweep directory, or sweep-<time>)"
        )
    run = matches[0]
    return Selection(
        text,
        names[run.info.experiment_id],
        run.info.experiment_id,
        run.info.run_id,
        run.info.run_name,
    )


def _names_sweep(run: Any, text: str) -> bool:
    sweep_dir = run.data.tags.get(SWEEP_DIR_TAG, "")
    if text in (run.info.run_id, run.info.run_name):
        return True
    if not sweep_dir:
        return False
    trimmed = text.rstrip("/")
    return str(Path(text).expanduser().resolve()) == sweep_dir or sweep_dir.endswith("/" + trimmed)


def _search(client: Any, experiment_ids: Sequence[str], filter_string: str = "") -> Iterator[Any]:
    """Every active run matching `filter_string`, oldest first, page by page."""
    for start in range(0, len(experiment_ids), 100):  # search_runs takes up to 100
        token = None
        while True:
            page = client.search_runs(
                list(experiment_ids[start : start + 100]),
                filter_string,
                max_results=_PAGE,
                page_token=token,
                order_by=["attributes.start_time ASC"],
            )
            yield from page
            token = page.token
            if not token:
                break


@dataclass(frozen=True)
class _Sweeps:
    """The sweeps' parent runs of some experiments: name by run id, run id by directory."""

    names: dict[str, str]
    by_dir: dict[str, str]

    def parent_of(self, run: Any) -> str | None:
        """The sweep's parent run of the cell run `run`: the one it is nested under, else the
        one whose directory holds the cell's (a cell synced after its sweep had ended)."""
        tags = run.data.tags
        if PARENT_TAG in tags:
            return tags[PARENT_TAG]
        return self.by_dir.get(str(Path(tags.get(OUTPUT_DIR_TAG, "/")).parent))


def _sweeps(client: Any, experiment_ids: set[str]) -> _Sweeps:
    runs = list(_search(client, sorted(experiment_ids), f"tags.`{KIND_TAG}` = '{SWEEP_KIND}'"))
    return _Sweeps(
        {run.info.run_id: run.info.run_name for run in runs},
        {
            run.data.tags[SWEEP_DIR_TAG]: run.info.run_id
            for run in runs
            if run.data.tags.get(SWEEP_DIR_TAG)
        },
    )


def cell_runs(client: Any, selection: Selection, sweeps: _Sweeps) -> list[Any]:
    """The selection's cell runs (those with a status tag), oldest first."""
    return [
        run
        for run in _search(client, [selection.experiment_id], "tags.status != ''")
        if selection.sweep_run_id in (None, sweeps.parent_of(run))
    ]


def cells_table(client: Any, selections: Sequence[Selection]) -> pd.DataFrame:
    """One row per cell run of `selections` (a run in several of them counts once)."""
    rows, seen = [], set()
    sweeps = _sweeps(client, {selection.experiment_id for selection in selections})
    with tempfile.TemporaryDirectory(prefix="distbench-sweeps-") as scratch:
        for selection in selections:
            for run in cell_runs(client, selection, sweeps):
                if run.info.run_id in seen:
                    continue
                seen.add(run.info.run_id)
                rows.append(_row(client, run, selection, Path(scratch), sweeps))
    return _ordered(pd.DataFrame(rows))


def _row(
    client: Any, run: Any, selection: Selection, scratch: Path, sweeps: _Sweeps
) -> dict[str, Any]:
    tags, info = run.data.tags, run.info
    parent = sweeps.parent_of(run)
    row: dict[str, Any] = {
        "experiment": selection.experiment,
        "sweep": sweeps.names.get(parent, parent) if parent else None,
        "run_name": info.run_name,
        "status": tags["status"],
    }
    row.update(_axes(client, run, scratch))
    metrics = dict(run.data.metrics)
    series = {key: _history(client, info.run_id, key) for key in metrics if _SERIES.fullmatch(key)}
    for key, value in metrics.items():
        if key not in series:
            row[key if key not in row else f"metrics.{key}"] = value
    row.update(series)
    row.update(
        {
            "error": failure_reason(tags["error"]) if tags.get("error") else None,
            "run_id": info.run_id,
            "parent_run_id": parent,
            "cell_key": tags.get(CELL_KEY_TAG),
            "output_dir": tags.get(OUTPUT_DIR_TAG),
            "started": _time(info.start_time),
            "ended": _time(info.end_time),
            "duration_s": (info.end_time - info.start_time) / 1000 if info.end_time else None,
        }
    )
    return row


def _history(client: Any, run_id: str, key: str) -> list[float]:
    return [m.value for m in sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)]


def _time(milliseconds: int | None) -> pd.Timestamp | None:
    return pd.Timestamp(milliseconds, unit="ms", tz="UTC") if milliseconds else None


def _axes(client: Any, run: Any, scratch: Path) -> dict[str, Any]:
    """The cell's config axes; none (with a warning) if its recorded config cannot be read
    (a run uploaded without its artifacts, or a config today's schema refuses)."""
    from mlflow.exceptions import MlflowException
    from omegaconf.errors import OmegaConfBaseException

    try:
        config = recorded_config(client, run, scratch)
    except (MlflowException, OSError, ConfigError, OmegaConfBaseException) as err:
        log.warning(
            "run %s (%s): config axes left empty, its config.yaml cannot be read (%s)",
            run.info.run_id,
            run.info.run_name,
            failure_reason(err),
        )
        return {}
    return axes(config)


def axes(config: DistbenchConfig) -> dict[str, Any]:
    """What a cell's grid position is; a model's own settings only for that model (None
    elsewhere, so that they do not split cells they do not apply to)."""
    return {
        "dataset": config.dataset.key,
        "network": config.network.label,
        "distribution": config.distribution.name,
        "hardware": config.hardware.name,
        "device": config.hardware.device.value,
        "nodes": config.hardware.nodes if config.world_size > 1 else 1,
        "workers": config.world_size,
        "batch_size": config.batch_size,
        "global_batch_size": config.global_batch_size,
        # the model's own settings (a pipeline's planned plan is in its result, not here)
        **config.distribution.own_settings(config),
        "num_samples": config.samples_per_epoch,
        "epochs": config.run.epochs,
        "seed": config.run.seed,
    }


def _ordered(table: pd.DataFrame) -> pd.DataFrame:
    """Identity, axes, the key metrics, the other metrics (A-Z), the series, then ids and
    times; integer axes as nullable integers (a cell without axes leaves them empty)."""
    if table.empty:
        return table
    series = sorted(c for c in table.columns if _SERIES.fullmatch(c))
    for column in series:  # a list, or None: never NaN (Parquet stores a list column)
        table[column] = table[column].map(lambda v: v if isinstance(v, list) else None)
    first = [c for c in IDENTITY + AXES + KEY_METRICS if c in table.columns]
    last = [c for c in TRAILER if c in table.columns]
    rest = sorted(set(table.columns) - set(first) - set(last) - set(series))
    table = table[first + rest + series + last]
    for column in (
        "nodes",
        "workers",
        "batch_size",
        "global_batch_size",
        "micro_batches",
        "num_samples",
        "epochs",
    ):
        if column in table.columns:
            table[column] = table[column].astype("Int64")
    return table.reset_index(drop=True)
