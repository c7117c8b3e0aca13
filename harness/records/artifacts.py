"""A run's artifacts, read from the folder beside its store when the store was moved or copied.

A SQLite store keeps its runs' artifacts beside it, in `mlartifacts/<experiment>/<run id>/
artifacts` (`harness.records.mlflow_store.experiment_id`), but MLflow records each run's
artifact location as an absolute URI: a store moved, or copied to another machine with its
`mlartifacts/` (a cluster's results analysed on a laptop), still names the folder it was
written in. There MLflow finds nothing (`list_artifacts` says "none", `download_artifacts`
fails), and worse, a run without its `result.json` looks like an upload that broke off, which
`harness.sync` deletes. So every read of a run's artifacts goes through here: from the folder
beside the store where it holds the run's, else from wherever MLflow says (a server's store, or
a folder that never moved).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from harness.records.mlflow_store import ARTIFACT_FOLDER, sqlite_file


def beside_the_store(client: Any, run: Any) -> Path | None:
    """The folder of `run`'s artifacts beside its SQLite store, where it is there (whatever
    folder the run's recorded URI names); None for other stores, or where it is not."""
    database, recorded = sqlite_file(str(client.tracking_uri)), str(run.info.artifact_uri or "")
    if database is None or not recorded.startswith("file:"):
        return None
    marker = f"/{ARTIFACT_FOLDER}/"
    path = unquote(urlparse(recorded).path)
    if marker not in path:
        return None
    # the last one: a store written under a folder itself named mlartifacts keeps its own
    folder = database.parent / ARTIFACT_FOLDER / path.rsplit(marker, 1)[1]
    return folder if folder.is_dir() else None


def artifact_names(client: Any, run: Any) -> set[str]:
    """The names of the files at the top of `run`'s artifacts."""
    beside = beside_the_store(client, run)
    if beside is not None:
        return {entry.name for entry in beside.iterdir()}
    return {str(entry.path) for entry in client.list_artifacts(run.info.run_id)}


def artifact_file(client: Any, run: Any, name: str, scratch: Path) -> Path:
    """A local copy of `run`'s artifact `name`: the file beside the store where it is there,
    else MLflow's download into `scratch` (MlflowException where the run has none)."""
    beside = beside_the_store(client, run)
    if beside is not None and (beside / name).is_file():
        return beside / name
    return Path(client.download_artifacts(run.info.run_id, name, str(scratch)))
