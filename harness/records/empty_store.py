"""A new SQLite MLflow store starts as a copy of an empty one, instead of by migrating.

MLflow makes a SQLite store by creating its first tables and running every schema migration
after them (alembic, a hundred-odd steps: about a second here), each time an output directory
records its first cell or sweep. What that produces depends only on the MLflow version, so
distbench lets MLflow make one empty store per version, once, in its cache
(`$DISTBENCH_CACHE_DIR`, else ~/.cache/distbench, as the datasets'), takes MLflow's Default
experiment out of it, and starts every new store as a copy. MLflow, opening the copy, finds
its schema current (it checks, as for any store it opens) and adds the Default experiment as
it does to a store it has just created: with the working directory of the process that opens
it in its artifact location, as before. A store that exists is never touched; anything that
goes wrong here leaves the new store to MLflow, as it was.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sqlite3
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

CACHE_ENV = "DISTBENCH_CACHE_DIR"


def seed_new_store(store: Path) -> None:
    """Put a copy of this MLflow's empty store at `store` if nothing is there yet. Call it
    with the store's lock held (`harness.records.mlflow_store.open_store`), before MLflow
    opens it."""
    if store.exists():
        return
    try:
        template = empty_store()
        _copy_atomically(template, store)
    except (OSError, sqlite3.Error) as err:  # MLflow creates the store itself, as before
        log.debug("no copy of an empty MLflow store for %s (%s)", store, err)


def empty_store() -> Path:
    """This MLflow version's empty store in the cache, made now if it is not there."""
    import mlflow

    template = _cache_dir() / "mlflow" / f"empty-store-{mlflow.__version__}.db"
    if not template.exists():
        template.parent.mkdir(parents=True, exist_ok=True)
        _make_empty_store(template)
    return template


def _make_empty_store(template: Path) -> None:
    """Let MLflow create a store (tables, migrations, its Default experiment) in a scratch
    directory, snapshot it with SQLite's backup, take the Default experiment out of the
    snapshot, and move it into place in one step (two processes doing it at once each leave
    a whole one)."""
    from mlflow.tracking import MlflowClient

    with tempfile.TemporaryDirectory(prefix="distbench-empty-store-") as scratch:
        made = Path(scratch) / "mlflow.db"
        MlflowClient(tracking_uri=f"sqlite:///{made}")  # creates and migrates it
        fd, snapshot_name = tempfile.mkstemp(dir=template.parent, suffix=".db.partial")
        os.close(fd)
        snapshot = Path(snapshot_name)
        try:
            with (
                contextlib.closing(sqlite3.connect(made)) as source,
                contextlib.closing(sqlite3.connect(snapshot)) as copy,
            ):
                source.backup(copy)
                with copy:  # a transaction
                    copy.execute("DELETE FROM experiments")
            os.replace(snapshot, template)
        finally:
            snapshot.unlink(missing_ok=True)


def _copy_atomically(template: Path, store: Path) -> None:
    """`store` appears whole or not at all: a copy beside it (with the permissions the
    process' umask gives a new file, as MLflow's own would have), renamed into place."""
    partial = store.with_name(f".{store.name}.{os.getpid()}.partial")
    try:
        with template.open("rb") as source, partial.open("wb") as copy:
            shutil.copyfileobj(source, copy)
        os.replace(partial, store)
    finally:
        partial.unlink(missing_ok=True)


def _cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "distbench").expanduser()
