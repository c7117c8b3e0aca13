"""A new SQLite store is a copy of this MLflow's empty store (harness.records.empty_store), made
once per version in distbench's cache: the same schema, and the same store once MLflow has opened
it, as a store MLflow creates by running its migrations."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import pytest

from harness.records.empty_store import CACHE_ENV, seed_new_store
from harness.records.mlflow_store import open_store


def _schema(store: Path) -> dict[tuple[str, str], list[str]]:
    """Every table's and index's definition, as the sorted lines of its CREATE statement:
    SQLAlchemy writes a table's CHECK constraints in an order that changes from process to
    process (a set's), so two stores MLflow creates itself differ in that order."""
    with contextlib.closing(sqlite3.connect(store)) as db:
        rows = db.execute("SELECT type, name, sql FROM sqlite_master").fetchall()
    return {
        (kind, name): sorted(line.strip().rstrip(",") for line in (sql or "").splitlines())
        for kind, name, sql in rows
    }


def _rows(store: Path, query: str) -> list[tuple]:
    with contextlib.closing(sqlite3.connect(store)) as db:
        return db.execute(query).fetchall()


def test_a_new_store_reads_as_one_mlflow_created(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)  # MLflow's Default experiment keeps ./mlruns of the cwd
    copied, created = tmp_path / "copied" / "mlflow.db", tmp_path / "created" / "mlflow.db"
    copied.parent.mkdir()
    created.parent.mkdir()
    seeded = open_store(f"sqlite:///{copied}")
    assert list((tmp_path / "cache" / "mlflow").glob("empty-store-*.db")), "no template made"
    migrated = MlflowClient(tracking_uri=f"sqlite:///{created}")  # MLflow's own, migrations
    assert _schema(copied) == _schema(created)
    for query in (
        "SELECT version_num FROM alembic_version",
        "SELECT * FROM workspaces",
        "SELECT experiment_id, name, artifact_location, lifecycle_stage FROM experiments",
    ):
        assert _rows(copied, query) == _rows(created, query), query
    # The next experiment gets the id it gets in MLflow's own store, and takes runs.
    assert seeded.create_experiment("next") == migrated.create_experiment("next") == "1"
    run = seeded.create_run("1")
    seeded.log_metric(run.info.run_id, "seconds_per_epoch", 1.5)
    assert seeded.get_run(run.info.run_id).data.metrics == {"seconds_per_epoch": 1.5}
    # A second store is a copy of the same template (made once).
    templates = list((tmp_path / "cache" / "mlflow").iterdir())
    open_store(f"sqlite:///{tmp_path / 'second.db'}")
    assert list((tmp_path / "cache" / "mlflow").iterdir()) == templates


def test_an_existing_store_is_never_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    store = tmp_path / "mlflow.db"
    client = open_store(f"sqlite:///{store}")
    client.create_experiment("kept")
    before = store.read_bytes()
    seed_new_store(store)
    assert store.read_bytes() == before
    assert open_store(f"sqlite:///{store}").get_experiment_by_name("kept") is not None


def test_a_cache_that_refuses_leaves_the_store_to_mlflow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    not_a_folder = tmp_path / "a-file"
    not_a_folder.write_text("")
    monkeypatch.setenv(CACHE_ENV, str(not_a_folder))
    client = open_store(f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert client.create_experiment("works") == "1"
    assert not_a_folder.read_text() == ""
    assert not list(tmp_path.glob(".mlflow.db.*.partial"))
