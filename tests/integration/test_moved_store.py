"""A sweep's output folder moved as a whole resumes where it stands, and its MLflow store with
it: a SQLite store moved or copied with its `mlartifacts/` (a cluster's results analysed on a
laptop) reads its runs' artifacts from beside itself, not from the absolute folder MLflow
recorded when the runs were written (`harness.records.artifacts`), and writes new runs' there
too (`harness.records.mlflow_store.follow_moved_store`). A real store, real files."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from urllib.parse import unquote, urlparse

from omegaconf import OmegaConf

from harness.commands.compose import compose_config
from harness.config.schema import without_hydra
from harness.records.artifacts import artifact_file, artifact_names
from harness.records.mlflow_store import (
    CELL_KIND,
    DEFAULT_STORE_FILE,
    KIND_TAG,
    experiment_id,
    open_store,
)
from harness.records.recorded_runs import recorded_config
from harness.records.results import RESULT_FILE
from harness.records.tracking import _complete
from tests.in_process import in_process_command
from tests.integration.test_resume import SWEEP


def _store_with_one_cell(folder: Path) -> tuple[str, str]:
    """A store in `folder` with one finished cell run holding config.yaml and result.json;
    returns the store's URI and the run's id."""
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    client = open_store(uri)
    run = client.create_run(experiment_id(client, "moved", uri))
    files = folder / "cell"
    files.mkdir()
    config = without_hydra(compose_config(["network=vgg11", "distribution=ddp"]))
    (files / "config.yaml").write_text(OmegaConf.to_yaml(config))
    (files / RESULT_FILE).write_text(json.dumps({"status": "ok"}))
    for name in ("config.yaml", RESULT_FILE):
        client.log_artifact(run.info.run_id, str(files / name))
    client.set_terminated(run.info.run_id)
    return uri, run.info.run_id


def test_a_moved_store_reads_its_runs_artifacts_from_beside_itself(tmp_path: Path) -> None:
    written, moved = tmp_path / "cluster", tmp_path / "laptop"
    written.mkdir()
    _, run_id = _store_with_one_cell(written)
    shutil.copytree(written, moved)
    shutil.rmtree(written)  # the folder the store recorded is gone

    client = open_store(f"sqlite:///{moved / 'mlflow.db'}")
    run = client.get_run(run_id)
    assert str(written) in run.info.artifact_uri  # MLflow still names where it was written
    assert client.list_artifacts(run_id) == []  # ... and finds nothing there
    assert artifact_names(client, run) == {"config.yaml", RESULT_FILE}
    config = recorded_config(client, run, tmp_path / "scratch")
    assert (config.network.key, config.distribution.name) == ("vgg11", "ddp")
    assert json.loads(artifact_file(client, run, RESULT_FILE, tmp_path).read_text()) == {
        "status": "ok"
    }
    # complete: `harness.sync` would otherwise delete it as an upload that broke off
    assert _complete(client, run)


def test_a_copy_reads_its_own_artifacts_and_a_store_in_place_is_read_as_before(
    tmp_path: Path,
) -> None:
    written, copied = tmp_path / "original", tmp_path / "copy"
    written.mkdir()
    _, run_id = _store_with_one_cell(written)
    shutil.copytree(written, copied)
    (written / "mlartifacts").rename(written / "elsewhere")  # the original's are not read

    in_place = open_store(f"sqlite:///{copied / 'mlflow.db'}")
    run = in_place.get_run(run_id)
    assert artifact_file(in_place, run, "config.yaml", tmp_path).is_relative_to(copied)
    # the original store, its artifacts gone from beside it and from where it recorded them
    original = open_store(f"sqlite:///{written / 'mlflow.db'}")
    assert artifact_names(original, original.get_run(run_id)) == set()
    assert not _complete(original, original.get_run(run_id))


# The resumed sweep's quick cells, in an experiment of their own: run with one cell, then
# again with a second one (more epochs) after its folder moved.
MOVED_SWEEP = [
    *(arg for arg in SWEEP if not arg.startswith("tracking.")),
    "tracking.experiment=moved",
]


def test_a_sweeps_folder_moved_as_a_whole_resumes_where_it_stands(tmp_path: Path) -> None:
    written = tmp_path / "out1"
    first = in_process_command(
        "harness", [*MOVED_SWEEP, "run.epochs=1", f"run.output_dir={written}"], cwd=tmp_path
    )
    assert first.returncode == 0, first.stderr[-3000:]
    moved = tmp_path / "moved" / "out2"
    moved.parent.mkdir()
    written.rename(moved)  # `mv out1 moved/out2`

    time.sleep(1.1)  # Hydra names sweep directories by the second
    again = in_process_command(
        "harness", [*MOVED_SWEEP, "run.epochs=1,2", f"run.output_dir={moved}"], cwd=tmp_path
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert "1 of 2 cells already finished" in again.stdout  # the moved cell is not measured again
    assert not written.exists()  # nothing is written back where the folder was
    client = open_store(f"sqlite:///{moved / DEFAULT_STORE_FILE}")
    experiment = client.get_experiment_by_name("moved")
    assert Path(unquote(urlparse(experiment.artifact_location).path)).is_relative_to(moved)
    runs = client.search_runs([experiment.experiment_id])
    cells = [run for run in runs if run.data.tags.get(KIND_TAG) == CELL_KIND]
    assert len(cells) == 2
    for run in runs:  # every run's files, old and new, are beside the store ...
        assert unquote(urlparse(run.info.artifact_uri).path).startswith(str(moved)), run.info
    for run in cells:  # ... where MLflow (and its UI) finds them
        assert client.list_artifacts(run.info.run_id), run.info.run_name
