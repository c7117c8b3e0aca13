"""MLflow records: one run per grid cell (nested under its sweep's parent run,
`harness.records.sweep_runs`), and any other run distbench logs at once (`log_run`: the
analysis', the probe's).

Only the process that measured a cell writes its run (one writer per run: SQLite stores lock
under many concurrent writers). Stores are opened one way, `harness.records.mlflow_store`.

A cell's run is tagged with its result's identity (`distbench.result_id`), so that an upload
that broke off half-way is found and replaced, never duplicated (`harness.sync`). For a person
comparing cells in the MLflow UI, a cell's run spans the cell's own training (its result's
started_at to finished_at), and every experiment carries a view of its runs table listing the
cells with the columns to compare (`harness.records.mlflow_store.VIEW_STATE`).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import os
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from harness.records.artifacts import artifact_file, artifact_names
from harness.records.mlflow_store import (
    CELL_KIND,
    KIND_TAG,
    experiment_id,
    open_store,
    store_not_created,
    tracking_failure,
)
from harness.records.results import RESULT_FILE, CellResult, RunStatus
from harness.records.sweep_runs import PARENT_RUN_ENV

log = logging.getLogger(__name__)

_MAX_PARAMS_PER_BATCH = 100  # MLflow's log_batch limit
# A cell's run carries its cell key (harness.records.resume), its result's directory and its
# result's identity, which is what `harness.sync` looks for before uploading a result, so nothing is
# uploaded twice. The identity is a hex digest: a filter on it needs no quoting.
CELL_KEY_TAG = "distbench.cell_key"
OUTPUT_DIR_TAG = "output_dir"
RESULT_ID_TAG = "distbench.result_id"


def flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """{"a": {"b": 1}} -> {"a.b": "1"}: MLflow params are flat strings."""
    flat: dict[str, str] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, prefix=f"{name}."))
        else:
            flat[name] = str(value)
    return flat


def _metrics(result: CellResult) -> Iterator[tuple[str, float, int]]:
    """(key, value, step) of every metric; per-epoch series use the epoch as step."""
    for key, value in result.metrics.items():
        yield key, float(value), 0
    for epoch, seconds in enumerate(result.epoch_seconds):
        yield "epoch_seconds", seconds, epoch
    for name in ("train_loss", "eval_loss", "eval_accuracy"):
        for epoch, value in enumerate(getattr(result, name)):
            yield f"epoch_{name}", value, epoch
    for repeat in result.repeats:
        yield "repeat_seconds_per_epoch", repeat.seconds_per_epoch, repeat.repeat
        yield "repeat_seed", float(repeat.seed), repeat.repeat
        if repeat.time_to_target_s is not None:
            yield "repeat_time_to_target_s", repeat.time_to_target_s, repeat.repeat
    for phase, per_epoch in result.phase_seconds.items():
        for epoch, seconds in enumerate(per_epoch):
            yield f"epoch_{phase}_seconds", seconds, epoch


def error_tag(error: str, limit: int = 5000) -> str:
    """`error` within MLflow's tag length limit: its first line (a multi-worker cell's
    headline, e.g. which rank ran out of memory) and as much of its end as fits."""
    if len(error) <= limit:
        return error
    head = error.splitlines()[0][: limit // 5] + "\n[...]\n"
    return head + error[-(limit - len(head)) :]


def result_id(result: CellResult) -> str:
    """The identity of one result (one measurement of one cell): the same whichever process
    uploads it and however often; a re-run of the cell is another result."""
    identity = json.dumps([result.output_dir, result.started_at, result.cell_key])
    return hashlib.sha256(identity.encode()).hexdigest()


def record_cell(result: CellResult, *, uri: str, experiment: str, artifacts: list[Path]) -> str:
    """Log a finished (or failed) cell as one MLflow run; return the run id."""
    tags = {
        **result.environment,
        "status": result.status.value,
        KIND_TAG: CELL_KIND,
        OUTPUT_DIR_TAG: result.output_dir,
        RESULT_ID_TAG: result_id(result),
    }
    if result.cell_key:
        tags[CELL_KEY_TAG] = result.cell_key
    parent = os.environ.get(PARENT_RUN_ENV)
    if parent:
        tags["mlflow.parentRunId"] = parent
    if result.error:
        tags["error"] = error_tag(result.error)
    params = dict(result.config)
    if result.repeats:  # every seed used, exactly (a metric is a float)
        params["seeds"] = " ".join(str(repeat.seed) for repeat in result.repeats)
    return log_run(
        uri=uri,
        experiment=experiment,
        run_name=result.run_name,
        tags=tags,
        params=params,
        metrics=list(_metrics(result)),
        artifacts=artifacts,
        finished=result.status is RunStatus.ok,
        # The cell's own times, not the upload's (which may be a later sync's):
        # the runs table's Duration is then the time the cell took.
        start_time=_epoch_ms(result.started_at),
        end_time=_epoch_ms(result.finished_at),
    )


def _epoch_ms(iso: str) -> int | None:
    """An ISO 8601 time as MLflow's milliseconds since the epoch; None if it is not one."""
    try:
        return round(dt.datetime.fromisoformat(iso).timestamp() * 1000)
    except (TypeError, ValueError):
        return None


def recorded_run_id(client: Any, experiment_id_: str, result: CellResult) -> str | None:
    """The id of the run that holds `result` completely, if any. Runs of the result that broke
    off half-way (still RUNNING, or without result.json among their artifacts: the uploader was
    killed, or lost the store, mid-way) are deleted, so that the result is uploaded again in one
    piece and nothing is counted twice."""
    from mlflow.entities import ViewType

    runs = client.search_runs(
        [experiment_id_],
        run_view_type=ViewType.ACTIVE_ONLY,
        max_results=100,
        order_by=["attributes.start_time ASC"],
        filter_string=f"tags.`{RESULT_ID_TAG}` = '{result_id(result)}'",
    )
    complete = None
    for run in runs:
        whole = _complete(client, run)
        if whole and complete is None:
            complete = run.info.run_id
        elif not whole:
            log.info(
                "deleting MLflow run %s: an upload of %s that broke off",
                run.info.run_id,
                result.output_dir,
            )
            client.delete_run(run.info.run_id)
    return complete


def result_recorded_for(
    uri: str, experiment: str, key: str, output_dir: Path
) -> dict[str, Any] | None:
    """The result.json that MLflow holds for the cell `key` measured in `output_dir`, if its
    run is there and complete: the record of a cell whose own directory refused it (a full or
    read-only disk, harness.records.record). None if there is none, or no store to ask (a SQLite
    store that does not exist is not created)."""
    if store_not_created(uri):
        return None
    try:
        client = open_store(uri)
        experiment_ = client.get_experiment_by_name(experiment)
        if experiment_ is None:
            return None
        # By the cell key (hex: no quoting in the filter), then by directory.
        runs = client.search_runs(
            [experiment_.experiment_id],
            max_results=100,
            filter_string=f"tags.`{CELL_KEY_TAG}` = '{key}'",
            order_by=["attributes.start_time DESC"],
        )
        for run in runs:
            if run.data.tags.get(OUTPUT_DIR_TAG) == str(output_dir.resolve()) and _complete(
                client, run
            ):
                with tempfile.TemporaryDirectory(prefix="distbench-lookup-") as folder:
                    path = artifact_file(client, run, RESULT_FILE, Path(folder))
                    result = json.loads(path.read_text())
                return {**result, "mlflow_run_id": run.info.run_id}
    except Exception as err:  # noqa: BLE001 - without it, the cell is recorded as failed
        log.warning(
            "could not look up the record of %s in MLflow (%s)", output_dir, tracking_failure(err)
        )
    return None


def _complete(client: Any, run: Any) -> bool:
    """A cell's run is complete once its uploader closed it (the last step of `log_run`) and
    its copy of result.json is there (beside the store where it was moved with it:
    `harness.records.artifacts`)."""
    if run.info.status not in ("FINISHED", "FAILED"):
        return False
    return RESULT_FILE in artifact_names(client, run)


def log_run(
    *,
    uri: str,
    experiment: str,
    run_name: str,
    tags: Mapping[str, str],
    params: Mapping[str, Any],
    metrics: Mapping[str, float] | list[tuple[str, float, int]],
    artifacts: list[Path],
    finished: bool = True,
    start_time: int | None = None,
    end_time: int | None = None,
) -> str:
    """One MLflow run with everything at once (nested params flattened; metrics as a mapping
    or as (key, value, step) series); return its id. `start_time` and `end_time` (ms since the
    epoch) default to now."""
    from mlflow.entities import Metric, Param

    client = open_store(uri)
    run = client.create_run(
        experiment_id(client, experiment, uri),
        run_name=run_name,
        tags=dict(tags),
        start_time=start_time,
    )
    run_id = run.info.run_id
    timestamp = int(time.time() * 1000)
    flat = [Param(k, v[:6000]) for k, v in flatten(params).items()]
    for start in range(0, len(flat), _MAX_PARAMS_PER_BATCH):
        client.log_batch(run_id, params=flat[start : start + _MAX_PARAMS_PER_BATCH])
    series = [(k, v, 0) for k, v in metrics.items()] if isinstance(metrics, Mapping) else metrics
    client.log_batch(
        run_id, metrics=[Metric(k, float(v), timestamp, step) for k, v, step in series]
    )
    for path in artifacts:
        if path.exists():
            client.log_artifact(run_id, str(path))
    client.set_terminated(run_id, status="FINISHED" if finished else "FAILED", end_time=end_time)
    return run_id
