"""MLflow records: one run per grid cell, nested under one parent run per sweep.

Only the process that measured a cell writes its run (one writer per run: SQLite stores lock
under many concurrent writers). The tracking store defaults to a SQLite file beside the
results, so no server is needed; `MLFLOW_TRACKING_URI` or `tracking.uri` point elsewhere.

A cell's run is tagged with its result's identity (`distbench.result_id`), so that an upload
that broke off half-way is found and replaced, never duplicated (`harness.sync`). A sweep's
parent run is opened by the launcher once it knows some cell will run, and closed however the
launcher ends; one whose launcher was killed outright is closed as KILLED by the next sweep or
sync that can prove the launcher is gone.

For a person comparing cells in the MLflow UI: a cell's run spans the cell's own training (its
result's started_at to finished_at), the parent run ends with a summary of its cells (ok,
failed, reused, fastest: `harness.records.sweep_summary`, of the same records as the launcher's
table), and every experiment carries a view of its runs table listing the cells with
the columns to compare, which the link the launcher logs at the end of a sweep opens.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import logging
import os
import socket
import tempfile
import time
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig

from harness.cli import StateError, note_setting
from harness.filelock import held
from harness.processes import start_time
from harness.records.empty_store import seed_new_store
from harness.records.results import RESULT_FILE, CellResult, RunStatus
from harness.records.sweep_summary import SweepSummary

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

log = logging.getLogger(__name__)

# The sweep's parent run id reaches every cell through the environment, which submitit's local
# and SLURM executors pass on to the jobs they start.
PARENT_RUN_ENV = "DISTBENCH_PARENT_RUN_ID"
DEFAULT_STORE_FILE = "mlflow.db"
# How long a process waits for another to finish creating a new SQLite store (a migration
# takes seconds); after it, it goes on (a hung holder must not stop it).
STORE_LOCK_WAIT_S = 120.0
_MAX_PARAMS_PER_BATCH = 100  # MLflow's log_batch limit
# A cell's run carries its cell key (harness.records.resume), its result's directory and its
# result's identity, which is what `harness.sync` looks for before uploading a result, so nothing is
# uploaded twice. The identity is a hex digest: a filter on it needs no quoting.
CELL_KEY_TAG = "distbench.cell_key"
OUTPUT_DIR_TAG = "output_dir"
RESULT_ID_TAG = "distbench.result_id"
# A sweep's parent run: its kind (a cell's run is of kind "cell"), and who launched it (host,
# pid, the pid's start time and the host's boot), so that a later process can tell that the
# launcher is gone.
KIND_TAG = "distbench.kind"
SWEEP_KIND = "sweep"
CELL_KIND = "cell"
LAUNCHER_HOST_TAG = "distbench.launcher_host"
LAUNCHER_PID_TAG = "distbench.launcher_pid"
LAUNCHER_START_TAG = "distbench.launcher_start"
LAUNCHER_BOOT_TAG = "distbench.launcher_boot"
_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
# MLflow 3 opens an experiment on its GenAI overview unless it is a training ("Machine
# learning") experiment: versions that read this tag open the runs table instead; 3.17 reads
# the workflow type the UI keeps per browser, which the `workflowType` URL parameter sets
# (experiment_link).
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
TRAINING_EXPERIMENT = "custom_model_development"
# A view of the runs table kept in the experiment, as the UI's "Share" button keeps one (a tag
# `mlflow.sharedViewState.<key>` holding the view as JSON, opened by `?viewStateShareKey=<key>`):
# the cells of every sweep, fastest first, with the columns a user compares. The UI offers no
# way to make a view the default; experiment_link opens this one.
VIEW_KEY = "distbench"
VIEW_TAG = f"mlflow.sharedViewState.{VIEW_KEY}"
RUN_NAME_COLUMN = "attributes.`Run Name`"
DURATION_COLUMN = "duration"  # always shown; its place follows the run name's
VIEW_COLUMNS = {  # column -> width in px, wide enough for its header
    "metrics.`seconds_per_epoch`": 150, "metrics.`images_per_second`": 150,
    "metrics.`peak_memory_mb`": 140, "metrics.`eval_accuracy`": 140,
    "metrics.`world_size`": 110,
    "params.`distribution.name`": 150, "params.`distribution.batch_size`": 170,
    "tags.`status`": 80}
VIEW_STATE = {
    "searchFilter": f"tags.`{KIND_TAG}` = '{CELL_KIND}'",
    "orderByKey": "metrics.`seconds_per_epoch`", "orderByAsc": True,
    "selectedColumns": list(VIEW_COLUMNS),
    # The UI applies widths to the columns listed in columnOrder only.
    "columnOrder": [RUN_NAME_COLUMN, DURATION_COLUMN, *VIEW_COLUMNS],
    "columnWidths": {RUN_NAME_COLUMN: 300, **VIEW_COLUMNS}}
# Where `mlflow ui` serves by default: the link's base for a store that is not a server.
DEFAULT_UI_URL = "http://127.0.0.1:5000"
# A sweep's parent run, once its cells have run: how many ended ok (reused ones included) and
# how many did not, how many were reused from earlier runs, and the fastest (its run name as a
# tag, its seconds per epoch as a metric).
CELLS_OK_METRIC = "cells_ok"
CELLS_FAILED_METRIC = "cells_failed"
CELLS_REUSED_METRIC = "cells_reused"
FASTEST_CELL_TAG = "fastest_cell"
FASTEST_SECONDS_METRIC = "fastest_seconds_per_epoch"
# MLflow's HTTP client retries a failed request 7 times with exponential back-off (minutes in
# all) and waits 120 s for an answer: an unreachable server would hold every cell that long.
# A few seconds is enough to ride out a blip; the result waits in result.json for harness.sync.
# Set in the environment to override.
_HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
                  "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                  "MLFLOW_HTTP_REQUEST_TIMEOUT": "20"}


def tracking_uri(configured_uri: str | None, output_root: str | Path) -> str:
    """`tracking.uri` if set, else $MLFLOW_TRACKING_URI, else a SQLite file in the output root
    (noted as the setting in use, so that a store's error names it: harness.cli)."""
    if configured_uri:
        uri = configured_uri
    elif os.environ.get("MLFLOW_TRACKING_URI"):
        uri = os.environ["MLFLOW_TRACKING_URI"]
    else:
        uri = f"sqlite:///{Path(output_root).resolve() / DEFAULT_STORE_FILE}"
    note_setting("tracking.uri", uri)
    return uri


# The first bytes of every SQLite database file.
_SQLITE_HEADER = b"SQLite format 3\x00"
# Schemes MLflow's tracking client can open (its registry; plugins may add more, which a user
# of a plugin names in tracking.uri and this check lets through when the plugin is installed).
_BUILTIN_SCHEMES = ("sqlite", "mysql", "postgresql", "mssql", "http", "https", "file",
                    "databricks", "databricks-uc", "uc")


def check_store(uri: str) -> None:
    """StateError (one line: which file, how to recover) for a store that cannot work: a
    SQLite store that is a directory or not a database, or a scheme no MLflow store has.
    Checked before MLflow opens it: SQLAlchemy would retry a locked or foreign file for
    minutes, then print a long traceback."""
    scheme = uri.partition("://")[0] if "://" in uri else "file"
    if scheme == "sqlite":
        _check_sqlite_file(uri, Path(uri.removeprefix("sqlite:///")))
    elif scheme not in _BUILTIN_SCHEMES and not _plugin_scheme(scheme):
        raise StateError(f"tracking.uri={uri}: unsupported store scheme {scheme!r}; allowed: "
                         f"http(s)://host:port, sqlite:///path/mlflow.db, a directory path, "
                         f"or a database URI (postgresql://, mysql://)")


def _check_sqlite_file(uri: str, path: Path) -> None:
    aside = f"mv {path} {path}.broken"
    recover = (f"move it aside ({aside}) and run again: a new store is created, and "
               f"harness.sync uploads the results still pending")
    if path.is_dir():
        raise StateError(f"tracking.uri={uri}: {path} is a directory, not an SQLite "
                         f"database; {recover}")
    try:
        with path.open("rb") as file:
            head = file.read(len(_SQLITE_HEADER))
    except FileNotFoundError:
        return  # created on first use
    except OSError as err:
        raise StateError(f"tracking.uri={uri}: {path} cannot be read ({err.strerror}); "
                         f"fix its permissions or {recover}") from err
    if head and head != _SQLITE_HEADER:
        raise StateError(f"tracking.uri={uri}: {path} is not an SQLite database (corrupt or "
                         f"another file); {recover}")


def _plugin_scheme(scheme: str) -> bool:
    """Whether an installed MLflow plugin registers a tracking store for `scheme`."""
    from importlib.metadata import entry_points

    return any(entry.name == scheme
               for entry in entry_points(group="mlflow.tracking_store"))


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


# Loggers of the libraries under MLflow's SQLite store that log at INFO when a store is opened
# or created ("Creating initial MLflow database tables...", alembic's migrations): not news to
# a distbench user, and lines in every cell's log. Their warnings and errors still show.
_STORE_CHATTER = ("alembic", "mlflow.store.db.utils")


def quiet_store_logs() -> None:
    """Raise the store's chatty loggers to WARNING; call it after importing MLflow (whose
    import configures its loggers afresh)."""
    for name in _STORE_CHATTER:
        logging.getLogger(name).setLevel(logging.WARNING)


def open_store(uri: str) -> MlflowClient:
    """The one way distbench opens a store: checked (check_store), and bounded in its waits
    (_HTTP_DEFAULTS), for cells, sync, analysis and the sweeps command alike."""
    from mlflow.tracking import MlflowClient  # here: a slow import, for the commands that store

    check_store(uri)
    for name, value in _HTTP_DEFAULTS.items():
        os.environ.setdefault(name, value)
    # urllib3 logs every retry as a warning; the caller reports the failure once.
    logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)
    quiet_store_logs()
    if not uri.startswith("sqlite:///"):
        return MlflowClient(tracking_uri=uri)
    # The client creates (and migrates) a new SQLite store on first use: two processes doing
    # so at once fail ("duplicate column name"). One at a time, through a lock beside it.
    store = Path(uri.removeprefix("sqlite:///"))
    with held(store.with_name(store.name + ".lock"), wait_s=STORE_LOCK_WAIT_S):
        seed_new_store(store)  # a copy of an empty store: no migrations to run
        return MlflowClient(tracking_uri=uri)


def experiment_id(client: Any, name: str, uri: str) -> str:
    """Id of experiment `name`, created on first use (artifacts beside a local SQLite store)
    as a training experiment with distbench's view of its runs (experiment_tags); an existing
    one gets the tags it lacks."""
    from mlflow.exceptions import MlflowException

    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        _tag_experiment(client, experiment)
        return experiment.experiment_id
    artifact_location = None
    if uri.startswith("sqlite:///"):
        # MLflow's default artifact root is ./mlruns of whatever the cwd is; keep the
        # artifacts next to the database instead, so a store is one self-contained folder.
        store_dir = Path(uri.removeprefix("sqlite:///")).parent
        artifact_location = (store_dir / "mlartifacts" / name).resolve().as_uri()
    try:
        return client.create_experiment(name, artifact_location=artifact_location,
                                        tags=experiment_tags())
    except MlflowException:  # created meanwhile by another process
        experiment = client.get_experiment_by_name(name)
        if experiment is None:
            raise
        return experiment.experiment_id


def experiment_tags() -> dict[str, str]:
    """What makes the MLflow UI open an experiment on its training runs, with distbench's view
    of them (VIEW_STATE)."""
    return {EXPERIMENT_KIND_TAG: TRAINING_EXPERIMENT, VIEW_TAG: json.dumps(VIEW_STATE)}


def _tag_experiment(client: Any, experiment: Any) -> None:
    """Give an experiment made before distbench tagged its experiments (or made by hand) the
    tags of experiment_tags; a kind already set is the user's choice and stays, the view is
    distbench's own and is brought up to date. A store that refuses them (e.g. a server that
    lets this user log runs but not edit experiments) still gets the cell: it is logged."""
    from mlflow.exceptions import MlflowException

    for key, value in experiment_tags().items():
        current = experiment.tags.get(key)
        if current is None or (key == VIEW_TAG and current != value):
            try:
                client.set_experiment_tag(experiment.experiment_id, key, value)
            except MlflowException as err:
                log.warning("could not tag MLflow experiment %r with %s (%s)", experiment.name,
                            key, tracking_failure(err))


def experiment_link(uri: str, experiment_id_: str) -> str:
    """The address of the experiment's cells in the MLflow UI, in distbench's view: a server's
    own address, else that of `mlflow ui` started on the store (DEFAULT_UI_URL)."""
    base = uri.rstrip("/") if uri.startswith(("http://", "https://")) else DEFAULT_UI_URL
    return (f"{base}/#/experiments/{experiment_id_}/runs?viewStateShareKey={VIEW_KEY}"
            f"&workflowType=machine_learning")


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
    head = error.splitlines()[0][:limit // 5] + "\n[...]\n"
    return head + error[-(limit - len(head)):]


def result_id(result: CellResult) -> str:
    """The identity of one result (one measurement of one cell): the same whichever process
    uploads it and however often; a re-run of the cell is another result."""
    identity = json.dumps([result.output_dir, result.started_at, result.cell_key])
    return hashlib.sha256(identity.encode()).hexdigest()


def record_cell(result: CellResult, *, uri: str, experiment: str,
                artifacts: list[Path]) -> str:
    """Log a finished (or failed) cell as one MLflow run; return the run id."""
    tags = {**result.environment, "status": result.status.value, KIND_TAG: CELL_KIND,
            OUTPUT_DIR_TAG: result.output_dir, RESULT_ID_TAG: result_id(result)}
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
                   finished=result.status is RunStatus.ok,
                   # The cell's own times, not the upload's (which may be a later sync's):
                   # the runs table's Duration is then the time the cell took.
                   start_time=_epoch_ms(result.started_at), end_time=_epoch_ms(result.finished_at))


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

    runs = client.search_runs([experiment_id_], run_view_type=ViewType.ACTIVE_ONLY,
                              max_results=100, order_by=["attributes.start_time ASC"],
                              filter_string=f"tags.`{RESULT_ID_TAG}` = '{result_id(result)}'")
    complete = None
    for run in runs:
        whole = _complete(client, run)
        if whole and complete is None:
            complete = run.info.run_id
        elif not whole:
            log.info("deleting MLflow run %s: an upload of %s that broke off", run.info.run_id,
                     result.output_dir)
            client.delete_run(run.info.run_id)
    return complete


def result_recorded_for(uri: str, experiment: str, key: str,
                        output_dir: Path) -> dict[str, Any] | None:
    """The result.json that MLflow holds for the cell `key` measured in `output_dir`, if its
    run is there and complete: the record of a cell whose own directory refused it (a full or
    read-only disk, harness.records.record). None if there is none, or no store to ask (a SQLite
    store that does not exist is not created)."""
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).exists():
        return None
    try:
        client = open_store(uri)
        experiment_ = client.get_experiment_by_name(experiment)
        if experiment_ is None:
            return None
        # By the cell key (hex: no quoting in the filter), then by directory.
        runs = client.search_runs([experiment_.experiment_id], max_results=100,
                                  filter_string=f"tags.`{CELL_KEY_TAG}` = '{key}'",
                                  order_by=["attributes.start_time DESC"])
        for run in runs:
            if run.data.tags.get(OUTPUT_DIR_TAG) == str(output_dir.resolve()) \
                    and _complete(client, run):
                with tempfile.TemporaryDirectory(prefix="distbench-lookup-") as folder:
                    path = client.download_artifacts(run.info.run_id, RESULT_FILE, folder)
                    result = json.loads(Path(path).read_text())
                return {**result, "mlflow_run_id": run.info.run_id}
    except Exception as err:  # noqa: BLE001 - without it, the cell is recorded as failed
        log.warning("could not look up the record of %s in MLflow (%s)", output_dir,
                    tracking_failure(err))
    return None


def _complete(client: Any, run: Any) -> bool:
    """A cell's run is complete once its uploader closed it (the last step of `log_run`) and
    its copy of result.json is there."""
    if run.info.status not in ("FINISHED", "FAILED"):
        return False
    return any(entry.path == RESULT_FILE for entry in client.list_artifacts(run.info.run_id))


def tracking_failure(err: BaseException) -> str:
    """Why MLflow failed, on one line (its messages can span many)."""
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text[:300]}{'...' if len(text) > 300 else ''}"


def log_run(*, uri: str, experiment: str, run_name: str, tags: Mapping[str, str],
            params: Mapping[str, Any],
            metrics: Mapping[str, float] | list[tuple[str, float, int]],
            artifacts: list[Path], finished: bool = True, start_time: int | None = None,
            end_time: int | None = None) -> str:
    """One MLflow run with everything at once (nested params flattened; metrics as a mapping
    or as (key, value, step) series); return its id. `start_time` and `end_time` (ms since the
    epoch) default to now."""
    from mlflow.entities import Metric, Param

    client = open_store(uri)
    run = client.create_run(experiment_id(client, experiment, uri), run_name=run_name,
                            tags=dict(tags), start_time=start_time)
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
    client.set_terminated(run_id, status="FINISHED" if finished else "FAILED",
                          end_time=end_time)
    return run_id


@contextlib.contextmanager
def sweep_parent_run(config: DictConfig, *, cells_to_run: int,
                     results: Collection[Mapping[str, Any]] = ()) -> Iterator[str | None]:
    """The sweep's parent run, open while its cells run (they nest under it through
    PARENT_RUN_ENV, which submitit's local and SLURM executors pass on to the jobs), closed
    when the block ends: FINISHED, FAILED on an exception, KILLED on Ctrl-C or an exit.

    `results` is the collection of cell records the launcher fills meanwhile, reused cells
    included, and prints its summary table from: the run's summary is made of it when the run
    closes (`SweepSummary`), so the two agree. (The cells nested under the run are only those
    that ran in this launch.)

    Opened by a launcher after every cell was validated and only if `cells_to_run` > 0, so a
    rejected sweep, or a re-run whose every cell finished earlier, leaves no empty run (and no
    store file). Parent runs left RUNNING by a launcher that was killed outright are closed
    first. If MLflow cannot be reached the sweep still runs (every cell writes result.json);
    its cells are then simply not nested.
    """
    if not config.tracking.enabled:
        yield None
        return
    uri = tracking_uri(config.tracking.uri, config.run.output_dir)
    close_stale_parent_runs(uri)
    run_id = _open_parent_run(config, uri) if cells_to_run > 0 else None
    if run_id is None:
        yield None
        return
    previous = os.environ.get(PARENT_RUN_ENV)
    os.environ[PARENT_RUN_ENV] = run_id
    status = "KILLED"  # unless the block ends normally or raises an Exception
    try:
        yield run_id
        status = "FINISHED"
    except Exception:
        status = "FAILED"
        raise
    finally:
        if previous is None:
            os.environ.pop(PARENT_RUN_ENV, None)
        else:
            os.environ[PARENT_RUN_ENV] = previous
        _close_parent_run(uri, run_id, status, SweepSummary.of(results))


def _close_parent_run(uri: str, run_id: str, status: str, summary: SweepSummary) -> None:
    """End the sweep's parent run with its outcome and the summary of its cells, and say
    where to compare them. A summary that fails is logged; the run is closed all the same."""
    experiment = None
    try:
        client = open_store(uri)
        experiment = client.get_run(run_id).info.experiment_id
        _log_summary(client, run_id, summary)
    except Exception as err:  # noqa: BLE001 - the cells' runs hold it all anyway
        log.warning("could not summarize the sweep in its MLflow run %s (%s)", run_id,
                    tracking_failure(err))
    try:
        open_store(uri).set_terminated(run_id, status=status)
    except Exception as err:  # noqa: BLE001 - the next sweep or sync closes it
        log.warning("could not close the sweep's MLflow run %s (%s)", run_id,
                    tracking_failure(err))
        return
    if experiment is not None:
        serve = ("" if uri.startswith(("http://", "https://"))
                 else f"`mlflow ui --backend-store-uri {uri} --host 127.0.0.1`, then ")
        log.info("MLflow: sweep run %s %s: %s. Compare the cells: %s%s", run_id, status,
                 summary.line(), serve, experiment_link(uri, experiment))


def _log_summary(client: Any, run_id: str, summary: SweepSummary) -> None:
    """The summary on the parent run: metrics and tags (columns of the runs table), and its
    description (the run's page)."""
    from mlflow.entities import Metric, RunTag

    timestamp = int(time.time() * 1000)
    metrics = [Metric(CELLS_OK_METRIC, summary.cells_ok, timestamp, 0),
               Metric(CELLS_FAILED_METRIC, summary.cells_failed, timestamp, 0),
               Metric(CELLS_REUSED_METRIC, summary.cells_reused, timestamp, 0)]
    tags = [RunTag("mlflow.note.content", f"Sweep: {summary.line()}.")]
    if summary.fastest is not None:
        metrics.append(Metric(FASTEST_SECONDS_METRIC, summary.fastest[1], timestamp, 0))
        tags.append(RunTag(FASTEST_CELL_TAG, summary.fastest[0]))
    client.log_batch(run_id, metrics=metrics, tags=tags)


def _open_parent_run(config: DictConfig, uri: str) -> str | None:
    sweep_dir = Path(str(config.hydra.sweep.dir))
    try:
        client = open_store(uri)
        run = client.create_run(
            experiment_id(client, config.tracking.experiment, uri),
            run_name=f"sweep-{sweep_dir.name}",
            tags={"sweep_dir": str(sweep_dir.resolve()),
                  "sweep_overrides": " ".join(config.hydra.overrides.task),
                  KIND_TAG: SWEEP_KIND, **_launcher_tags()})
    except Exception as err:  # noqa: BLE001 - tracking must never stop a sweep
        log.warning("MLflow unreachable at %s (%s); cells will not be nested", uri,
                    tracking_failure(err))
        return None
    log.info("MLflow: sweep parent run %s in experiment %r at %s", run.info.run_id,
             config.tracking.experiment, uri)
    return run.info.run_id


def _launcher_tags() -> dict[str, str]:
    tags = {LAUNCHER_HOST_TAG: socket.gethostname(), LAUNCHER_PID_TAG: str(os.getpid()),
            LAUNCHER_START_TAG: str(start_time(os.getpid()))}
    boot = _boot_id()
    if boot is not None:
        tags[LAUNCHER_BOOT_TAG] = boot
    return tags


def _boot_id() -> str | None:
    try:
        return _BOOT_ID.read_text().strip()
    except OSError:
        return None


def launcher_gone(tags: Mapping[str, str]) -> bool:
    """True if the process that launched a parent run provably no longer runs: it ran on this
    host and either the host has rebooted since or its pid is free or taken by a process that
    started at another time. A launcher on another host, or one that left no such tags (older
    runs), cannot be proved gone."""
    if tags.get(LAUNCHER_HOST_TAG) != socket.gethostname() or LAUNCHER_PID_TAG not in tags \
            or LAUNCHER_START_TAG not in tags:
        return False
    boot = _boot_id()
    if boot is not None and tags.get(LAUNCHER_BOOT_TAG, boot) != boot:
        return True
    return str(start_time(int(tags[LAUNCHER_PID_TAG]))) != tags[LAUNCHER_START_TAG]


def close_stale_parent_runs(uri: str) -> list[str]:
    """Close, as KILLED, every sweep parent run in the store at `uri` that is still RUNNING
    although its launcher is provably gone (killed with SIGKILL, or its host rebooted: no
    finally-block ran); return their ids. A store that does not exist yet is not created; a
    store that cannot be reached is logged and left alone."""
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).exists():
        return []
    closed = []
    try:
        client = open_store(uri)
        experiments = [e.experiment_id for e in client.search_experiments()]
        for start in range(0, len(experiments), 100):  # search_runs takes up to 100
            for run in client.search_runs(
                    experiments[start:start + 100], max_results=1000, filter_string=(
                        f"tags.`{KIND_TAG}` = '{SWEEP_KIND}' and attributes.status = 'RUNNING'")):
                if launcher_gone(run.data.tags):
                    client.set_terminated(run.info.run_id, status="KILLED")
                    closed.append(run.info.run_id)
                    log.warning("MLflow: closed sweep run %s as KILLED: its launcher (pid %s) "
                                "is gone", run.info.run_id, run.data.tags[LAUNCHER_PID_TAG])
    except Exception as err:  # noqa: BLE001 - tidying must never stop a sweep or a sync
        log.warning("could not check %s for sweep runs left open (%s)", uri,
                    tracking_failure(err))
    return closed
