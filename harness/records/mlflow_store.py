"""An MLflow store, opened one way: where it is (`tracking_uri`), whether it can work
(`check_store`), opened with bounded waits (`open_store`), and its experiments, each created
as a training experiment with distbench's view of its runs (`experiment_id`,
`experiment_link`).

Every part of distbench that writes or reads MLflow opens its store here: cell runs
(`harness.records.tracking`), sweep parent runs (`harness.records.sweep_runs`), the read side
(`harness.records.recorded_runs`, the analysis' grid, the sweeps table, the recommender's
recorded facts). The store defaults to a SQLite file beside the results, so no server is
needed; `MLFLOW_TRACKING_URI` or `tracking.uri` point elsewhere.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.cli.errors import StateError, note_setting
from harness.config.stores import ALLOWED_STORES, known_scheme, store_scheme
from harness.records.empty_store import seed_new_store
from harness.system.filelock import held

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

log = logging.getLogger(__name__)

DEFAULT_STORE_FILE = "mlflow.db"
_SQLITE_URI = "sqlite:///"
# A SQLite store's runs keep their artifacts beside it, in mlartifacts/<experiment>/<run id>/
# (experiment_id; harness.records.artifacts reads them there).
ARTIFACT_FOLDER = "mlartifacts"
# How long a process waits for another to finish creating a new SQLite store (a migration
# takes seconds); after it, it goes on (a hung holder must not stop it).
STORE_LOCK_WAIT_S = 120.0
# The kind of a run (a tag): a cell's, a sweep's parent run (harness.records.sweep_runs).
KIND_TAG = "distbench.kind"
SWEEP_KIND = "sweep"
CELL_KIND = "cell"
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
    "metrics.`seconds_per_epoch`": 150,
    # 0: measured while the machine was unsteady (harness.measure.steadiness), beside the time
    "metrics.`steady`": 80,
    "metrics.`images_per_second`": 150,
    "metrics.`peak_memory_mb`": 140,
    "metrics.`eval_accuracy`": 140,
    "metrics.`world_size`": 110,
    "params.`distribution.name`": 150,
    "params.`distribution.batch_size`": 170,
    "tags.`status`": 80,
}
VIEW_STATE = {
    "searchFilter": f"tags.`{KIND_TAG}` = '{CELL_KIND}'",
    "orderByKey": "metrics.`seconds_per_epoch`",
    "orderByAsc": True,
    "selectedColumns": list(VIEW_COLUMNS),
    # The UI applies widths to the columns listed in columnOrder only.
    "columnOrder": [RUN_NAME_COLUMN, DURATION_COLUMN, *VIEW_COLUMNS],
    "columnWidths": {RUN_NAME_COLUMN: 300, **VIEW_COLUMNS},
}
# Where `mlflow ui` serves by default: the link's base for a store that is not a server.
DEFAULT_UI_URL = "http://127.0.0.1:5000"
# MLflow's HTTP client retries a failed request 7 times with exponential back-off (minutes in
# all) and waits 120 s for an answer: an unreachable server would hold every cell that long.
# A few seconds is enough to ride out a blip; the result waits in result.json for harness.sync.
# Set in the environment to override.
_HTTP_DEFAULTS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "20",
}


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


def store_not_created(uri: str) -> bool:
    """Whether `uri` is a SQLite store whose file does not exist yet: opening it would create
    it, which a command that only reads or tidies must not do."""
    return uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).exists()


# The first bytes of every SQLite database file.
_SQLITE_HEADER = b"SQLite format 3\x00"


def check_store(uri: str) -> None:
    """StateError (one line: which file, how to recover) for a store that cannot work: a
    SQLite store that is a directory or not a database, or a scheme no MLflow store has.
    Checked before MLflow opens it: SQLAlchemy would retry a locked or foreign file for
    minutes, then print a long traceback."""
    scheme = store_scheme(uri)
    if scheme == "sqlite":
        _check_sqlite_file(uri, Path(uri.removeprefix("sqlite:///")))
    elif not known_scheme(scheme):
        raise StateError(
            f"tracking.uri={uri}: unsupported store scheme {scheme!r}; allowed: {ALLOWED_STORES}"
        )


def _check_sqlite_file(uri: str, path: Path) -> None:
    aside = f"mv {path} {path}.broken"
    recover = (
        f"move it aside ({aside}) and run again: a new store is created, and "
        f"harness.sync uploads the results still pending"
    )
    if path.is_dir():
        raise StateError(
            f"tracking.uri={uri}: {path} is a directory, not an SQLite database; {recover}"
        )
    try:
        with path.open("rb") as file:
            head = file.read(len(_SQLITE_HEADER))
    except FileNotFoundError:
        return  # created on first use
    except OSError as err:
        raise StateError(
            f"tracking.uri={uri}: {path} cannot be read ({err.strerror}); "
            f"fix its permissions or {recover}"
        ) from err
    if head and head != _SQLITE_HEADER:
        raise StateError(
            f"tracking.uri={uri}: {path} is not an SQLite database (corrupt or "
            f"another file); {recover}"
        )


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


def sqlite_file(uri: str) -> Path | None:
    """The database file of a SQLite store's URI; None for any other store."""
    return Path(uri.removeprefix(_SQLITE_URI)) if uri.startswith(_SQLITE_URI) else None


def experiment_id(client: Any, name: str, uri: str) -> str:
    """Id of experiment `name`, created on first use (artifacts beside a local SQLite store)
    as a training experiment with distbench's view of its runs (experiment_tags); an existing
    one gets the tags it lacks."""
    from mlflow.exceptions import MlflowException

    experiment = client.get_experiment_by_name(name)
    database = sqlite_file(uri)
    if experiment is not None:
        _tag_experiment(client, experiment)
        if database is not None:
            follow_moved_store(database, experiment)
        return experiment.experiment_id
    artifact_location = None
    if database is not None:
        # MLflow's default artifact root is ./mlruns of whatever the cwd is; keep the
        # artifacts next to the database instead, so a store is one self-contained folder.
        artifact_location = _artifacts_beside(database, name)
    try:
        return client.create_experiment(
            name, artifact_location=artifact_location, tags=experiment_tags()
        )
    except MlflowException:  # created meanwhile by another process
        experiment = client.get_experiment_by_name(name)
        if experiment is None:
            raise
        return experiment.experiment_id


def _artifacts_beside(database: Path, experiment: str) -> str:
    """The artifact location of `experiment`'s runs in a SQLite store: beside the database."""
    return (database.parent / ARTIFACT_FOLDER / experiment).resolve().as_uri()


def follow_moved_store(database: Path, experiment: Any) -> None:
    """Re-point an experiment of a SQLite store that was moved or copied as a whole (with its
    `mlartifacts/`) at the artifacts beside it, and its runs with it. MLflow records artifact
    locations as absolute URIs: without this, every run logged after the move writes its
    artifacts back into the folder the store was created in, re-creating it there, and the
    MLflow UI finds none of the moved runs' files. Only a location in distbench's layout (an
    `mlartifacts/<experiment>` folder) is moved; one a user chose stays. MLflow has no call
    that changes an experiment's location, so its two columns are updated in the database, in
    one transaction (SQLite's lock orders it against any process logging meanwhile)."""
    import sqlite3
    from urllib.parse import unquote, urlparse

    recorded, wanted = (
        str(experiment.artifact_location),
        _artifacts_beside(database, experiment.name),
    )
    layout = f"/{ARTIFACT_FOLDER}/{experiment.name}"
    if recorded == wanted or not unquote(urlparse(recorded).path).endswith(layout):
        return
    with contextlib.closing(sqlite3.connect(database, timeout=STORE_LOCK_WAIT_S)) as db, db:
        db.execute(
            "UPDATE experiments SET artifact_location = ? WHERE experiment_id = ?",
            (wanted, int(experiment.experiment_id)),
        )
        db.execute(
            "UPDATE runs SET artifact_uri = ? || substr(artifact_uri, ?) "
            "WHERE experiment_id = ? AND substr(artifact_uri, 1, ?) = ?",
            (wanted, len(recorded) + 1, int(experiment.experiment_id), len(recorded), recorded),
        )
    log.info(
        "the store moved: experiment %s's artifacts are now read and written at %s",
        experiment.name,
        wanted,
    )


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
                log.warning(
                    "could not tag MLflow experiment %r with %s (%s)",
                    experiment.name,
                    key,
                    tracking_failure(err),
                )


def experiment_link(uri: str, experiment_id_: str) -> str:
    """The address of the experiment's cells in the MLflow UI, in distbench's view: a server's
    own address, else that of `mlflow ui` started on the store (DEFAULT_UI_URL)."""
    base = uri.rstrip("/") if uri.startswith(("http://", "https://")) else DEFAULT_UI_URL
    return (
        f"{base}/#/experiments/{experiment_id_}/runs?viewStateShareKey={VIEW_KEY}"
        f"&workflowType=machine_learning"
    )


def tracking_failure(err: BaseException) -> str:
    """Why MLflow failed, on one line (its messages can span many)."""
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text[:300]}{'...' if len(text) > 300 else ''}"
