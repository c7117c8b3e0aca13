"""MLflow records: one run per grid cell, nested under one parent run per sweep.

Only the process that measured a cell writes its run (one writer per run: SQLite stores lock
under many concurrent writers). The tracking store defaults to a SQLite file beside the
results, so no server is needed; `MLFLOW_TRACKING_URI` or `tracking.uri` point elsewhere.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from harness.results import CellResult, RunStatus

log = logging.getLogger(__name__)

# The sweep's parent run id reaches every cell through the environment, which submitit's local
# and SLURM executors pass on to the jobs they start.
PARENT_RUN_ENV = "DISTBENCH_PARENT_RUN_ID"
DEFAULT_STORE_FILE = "mlflow.db"
_MAX_PARAMS_PER_BATCH = 100  # MLflow's log_batch limit
# A cell's run carries its cell key (harness.resume) and its result's directory, which is what
# `harness.sync` looks for before uploading a result, so nothing is uploaded twice.
CELL_KEY_TAG = "distbench.cell_key"
OUTPUT_DIR_TAG = "output_dir"
# MLflow's HTTP client retries a failed request 7 times with exponential back-off (minutes in
# all) and waits 120 s for an answer: an unreachable server would hold every cell that long.
# A few seconds is enough to ride out a blip; the result waits in result.json for harness.sync.
# Set in the environment to override.
_HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
                  "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                  "MLFLOW_HTTP_REQUEST_TIMEOUT": "20"}


def tracking_uri(configured_uri: str | None, output_root: str | Path) -> str:
    """`tracking.uri` if set, else $MLFLOW_TRACKING_URI, else a SQLite file in the output root."""
    if configured_uri:
        return configured_uri
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    return f"sqlite:///{Path(output_root).resolve() / DEFAULT_STORE_FILE}"


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


def _client(uri: str):  # noqa: ANN202 - MlflowClient imported lazily (slow import)
    from mlflow.tracking import MlflowClient

    for name, value in _HTTP_DEFAULTS.items():
        os.environ.setdefault(name, value)
    # urllib3 logs every retry as a warning; the caller reports the failure once.
    logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)
    # The SQLite store logs its schema migrations at INFO on first use; they are not news.
    logging.getLogger("alembic").setLevel(logging.WARNING)
    return MlflowClient(tracking_uri=uri)


def experiment_id(client: Any, name: str, uri: str) -> str:
    """Id of experiment `name`, created on first use (artifacts beside a local SQLite store)."""
    from mlflow.exceptions import MlflowException

    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        return experiment.experiment_id
    artifact_location = None
    if uri.startswith("sqlite:///"):
        # MLflow's default artifact root is ./mlruns of whatever the cwd is; keep the
        # artifacts next to the database instead, so a store is one self-contained folder.
        store_dir = Path(uri.removeprefix("sqlite:///")).parent
        artifact_location = (store_dir / "mlartifacts" / name).resolve().as_uri()
    try:
        return client.create_experiment(name, artifact_location=artifact_location)
    except MlflowException:  # created meanwhile by another process
        experiment = client.get_experiment_by_name(name)
        if experiment is None:
            raise
        return experiment.experiment_id


def _metrics(result: CellResult) -> Iterator[tuple[str, float, int]]:
    """(key, value, step) of every metric; per-epoch series use the epoch as step."""
    for key, value in result.metrics.items():
        yield key, float(value), 0
    for epoch, seconds in enumerate(result.epoch_seconds):
        yield "epoch_seconds", seconds, epoch
    for repeat in result.repeats:
        yield "repeat_seconds_per_epoch", repeat.seconds_per_epoch, repeat.repeat
        yield "repeat_seed", float(repeat.seed), repeat.repeat
    for phase, per_epoch in result.phase_seconds.items():
        for epoch, seconds in enumerate(per_epoch):
            yield f"epoch_{phase}_seconds", seconds, epoch


def error_tag(error: str, limit: int = 5000) -> str:
    """`error` within MLflow's tag length limit: its first line (a multi-worker cell's
    headline, e.g. which rank ran out of memory) and as much of its end as fits."""
    if len(error) <= limit:
        return error
    head = error.splitlines()[0][:limit // 5] + "\n[...]\n"
    return head + error[-(limit - len(head)):]


def record_cell(result: CellResult, *, uri: str, experiment: str,
                artifacts: list[Path]) -> str:
    """Log a finished (or failed) cell as one MLflow run; return the run id."""
    tags = {**result.environment, "status": result.status.value,
            OUTPUT_DIR_TAG: result.output_dir}
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
    return log_run(uri=uri, experiment=experiment, run_name=result.run_name, tags=tags,
                   params=params, metrics=list(_metrics(result)), artifacts=artifacts,
                   finished=result.status is RunStatus.ok)


def recorded_run_id(client: Any, experiment_id_: str, output_dir: str) -> str | None:
    """The id of the run that already holds the result in `output_dir`, if any. A run still
    RUNNING is one whose upload broke off half-way: it does not count."""
    quoted = output_dir.replace("'", "\\'")
    runs = client.search_runs([experiment_id_], max_results=1, filter_string=(
        f"tags.{OUTPUT_DIR_TAG} = '{quoted}' and attributes.status != 'RUNNING'"))
    return runs[0].info.run_id if runs else None


def tracking_failure(err: BaseException) -> str:
    """Why MLflow failed, on one line (its messages can span many)."""
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text[:300]}{'...' if len(text) > 300 else ''}"


def log_run(*, uri: str, experiment: str, run_name: str, tags: Mapping[str, str],
            params: Mapping[str, Any],
            metrics: Mapping[str, float] | list[tuple[str, float, int]],
            artifacts: list[Path], finished: bool = True) -> str:
    """One MLflow run with everything at once (nested params flattened; metrics as a mapping
    or as (key, value, step) series); return its id."""
    from mlflow.entities import Metric, Param

    client = _client(uri)
    run = client.create_run(experiment_id(client, experiment, uri), run_name=run_name,
                            tags=dict(tags))
    run_id = run.info.run_id
    timestamp = int(time.time() * 1000)
    flat = [Param(k, v[:6000]) for k, v in flatten(params).items()]
    for start in range(0, len(flat), _MAX_PARAMS_PER_BATCH):
        client.log_batch(run_id, params=flat[start:start + _MAX_PARAMS_PER_BATCH])
    series = [(k, v, 0) for k, v in metrics.items()] if isinstance(metrics, Mapping) \
        else metrics
    client.log_batch(run_id, metrics=[Metric(k, float(v), timestamp, step)
                                      for k, v, step in series])
    for path in artifacts:
        if path.exists():
            client.log_artifact(run_id, str(path))
    client.set_terminated(run_id, status="FINISHED" if finished else "FAILED")
    return run_id


class SweepParentRun(Callback):
    """Hydra callback: open a parent MLflow run for a sweep, so its cells nest under it.

    Runs in the process that launches the sweep. If MLflow cannot be reached the sweep still
    runs (every cell writes result.json); the cells are then simply not nested.
    """

    def __init__(self) -> None:
        self._run_id: str | None = None
        self._uri: str | None = None

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        if not config.tracking.enabled:
            return
        self._uri = tracking_uri(config.tracking.uri, config.run.output_dir)
        try:
            client = _client(self._uri)
            run = client.create_run(
                experiment_id(client, config.tracking.experiment, self._uri),
                run_name=f"sweep-{Path(str(config.hydra.sweep.dir)).name}",
                tags={"sweep_dir": str(Path(str(config.hydra.sweep.dir)).resolve()),
                      "sweep_overrides": " ".join(config.hydra.overrides.task),
                      "distbench.kind": "sweep"},
            )
        except Exception as err:  # noqa: BLE001 - tracking must never stop a sweep
            log.warning("MLflow unreachable at %s (%s); cells will not be nested", self._uri,
                        tracking_failure(err))
            return
        self._run_id = run.info.run_id
        os.environ[PARENT_RUN_ENV] = self._run_id
        log.info("MLflow: sweep parent run %s in experiment %r at %s", self._run_id,
                 config.tracking.experiment, self._uri)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if self._run_id is None or self._uri is None:
            return
        os.environ.pop(PARENT_RUN_ENV, None)
        try:
            _client(self._uri).set_terminated(self._run_id, status="FINISHED")
        except Exception as err:  # noqa: BLE001
            log.warning("could not close the sweep's MLflow run %s: %s", self._run_id, err)
