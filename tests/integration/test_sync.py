"""A cell whose MLflow server is unreachable keeps its result, and `harness.sync` uploads it."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.helpers import run_module, tiny_overrides


def _closed_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _runs_of(store: str, output_dir: str) -> list:
    client = MlflowClient(store)
    experiment = client.get_experiment_by_name("distbench")
    return client.search_runs(
        [experiment.experiment_id], filter_string=f"tags.output_dir = '{output_dir}'"
    )


def _sync(
    output_root: Path, store: str, capsys: pytest.CaptureFixture[str]
) -> subprocess.CompletedProcess[str]:
    """`python -m harness.sync run.output_dir=... tracking.uri=...`, its entry point run in this
    process (an interpreter that imports MLflow anew costs seconds; the command's start-up is
    not what these tests are about): its exit status and what it printed."""
    from harness.sync import main

    capsys.readouterr()  # what the test printed before
    argv = [f"run.output_dir={output_root}", f"tracking.uri={store}"]
    with contextlib.chdir(output_root.parent):  # where the test ran it as a command
        code = main(argv)
    printed = capsys.readouterr()
    return subprocess.CompletedProcess(["harness.sync", *argv], code, printed.out, printed.err)


def test_an_unreachable_mlflow_leaves_a_pending_result_that_sync_uploads_once(
    output_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    unreachable = f"http://127.0.0.1:{_closed_port()}"
    started = time.monotonic()
    done = run_module(
        "harness",
        tiny_overrides(output_root, "run.epochs=1", f"tracking.uri={unreachable}"),
        cwd=output_root.parent,
    )
    took = time.monotonic() - started
    assert done.returncode == 0, done.stderr[-3000:]
    logs = done.stdout + done.stderr  # Hydra's job log goes to stdout
    assert "Traceback" not in logs
    warnings = [line for line in logs.splitlines() if "MLflow could not record" in line]
    assert len(warnings) == 1 and "harness.sync" in warnings[0]
    assert took < 120  # MLflow's own retries (minutes by default) are bounded
    (path,) = (output_root / "runs").glob("*/result.json")
    result = json.loads(path.read_text())
    assert result["status"] == "ok" and result["metrics"]["seconds_per_epoch"] > 0
    assert result["pending_sync"] and result["mlflow_run_id"] is None

    store = f"sqlite:///{output_root / 'synced.db'}"
    synced = _sync(output_root, store, capsys)
    assert synced.returncode == 0, synced.stderr[-3000:]
    assert "uploaded" in synced.stdout
    after = json.loads(path.read_text())
    assert not after["pending_sync"] and after["mlflow_run_id"]
    (run,) = _runs_of(store, result["output_dir"])
    assert run.info.run_id == after["mlflow_run_id"]
    assert run.data.tags["status"] == "ok" and run.data.tags["distbench.cell_key"]
    assert run.data.metrics["seconds_per_epoch"] == result["metrics"]["seconds_per_epoch"]
    # The same artifacts as a cell that reached MLflow itself uploads, its MLPerf log included.
    assert {entry.path for entry in MlflowClient(store).list_artifacts(run.info.run_id)} == {
        "config.yaml",
        "result.json",
        "mllog.txt",
    }

    # As if sync had been killed after its upload but before it marked the result: the next
    # sync finds the run and does not upload it again.
    path.write_text(json.dumps({**after, "pending_sync": True, "mlflow_run_id": None}))
    again = _sync(output_root, store, capsys)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "already recorded" in again.stdout
    assert len(_runs_of(store, result["output_dir"])) == 1
    assert json.loads(path.read_text())["mlflow_run_id"] == run.info.run_id


def test_a_rerun_that_reuses_a_pending_result_records_it_in_mlflow(output_root: Path) -> None:
    """A sweep run again skips the cell it finished, but finishes its record: the result MLflow
    could not get when the cell ended is recorded in the sweep's store, once."""
    unreachable = f"http://127.0.0.1:{_closed_port()}"
    first = run_module(
        "harness",
        ["-m", *tiny_overrides(output_root, "run.epochs=1", f"tracking.uri={unreachable}")],
        cwd=output_root.parent,
    )
    assert first.returncode == 0, first.stderr[-3000:]
    (path,) = output_root.glob("sweeps/*/*/*/result.json")
    assert json.loads(path.read_text())["pending_sync"]
    store = f"sqlite:///{output_root / 'mlflow.db'}"
    again = run_module(
        "harness",
        ["-m", *tiny_overrides(output_root, "run.epochs=1", f"tracking.uri={store}")],
        cwd=output_root.parent,
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert "already measured, nothing to run" in again.stdout, again.stdout
    after = json.loads(path.read_text())
    assert not after["pending_sync"] and after["mlflow_run_id"]
    assert (
        f"its result, reused, recorded in MLflow now (run {after['mlflow_run_id']})" in again.stdout
    )
    (run,) = _runs_of(store, after["output_dir"])
    assert run.info.run_id == after["mlflow_run_id"]
    third = run_module(
        "harness",
        ["-m", *tiny_overrides(output_root, "run.epochs=1", f"tracking.uri={store}")],
        cwd=output_root.parent,
    )
    assert "recorded in MLflow now" not in third.stdout
    assert len(_runs_of(store, after["output_dir"])) == 1
