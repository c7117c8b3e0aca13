"""One grid cell end to end: real training, result.json, a real SQLite MLflow store."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from harness.commands.compose import compose_config
from harness.records.cell import check_cell
from harness.records.mlflow_store import DEFAULT_STORE_FILE
from harness.worker.run import run_cell
from tests.helpers import tiny_overrides


def _store(output_root: Path) -> MlflowClient:
    return MlflowClient(tracking_uri=f"sqlite:///{output_root / DEFAULT_STORE_FILE}")


def test_a_cell_trains_measures_and_lands_in_mlflow(output_root: Path, tmp_path: Path) -> None:
    cell_dir = tmp_path / "cell"
    result = run_cell(check_cell(compose_config(tiny_overrides(output_root))), output_dir=cell_dir)

    assert result["status"] == "ok", result["error"]
    on_disk = json.loads((cell_dir / "result.json").read_text())
    assert on_disk == result  # result.json is the source of truth, and it is complete
    metrics = result["metrics"]
    assert len(result["epoch_seconds"]) == 2 and all(s > 0 for s in result["epoch_seconds"])
    assert metrics["seconds_per_epoch"] == pytest.approx(sum(result["epoch_seconds"]) / 2)
    assert metrics["samples_per_epoch"] == 16 and metrics["batches_per_epoch"] == 2
    assert metrics["images_per_second"] == pytest.approx(16 / metrics["seconds_per_epoch"])
    assert metrics["peak_memory_mb"] > 50  # a process that imported torch holds far more
    phases = {k: v for k, v in metrics.items() if k.endswith("_seconds_per_epoch")}
    assert set(phases) == {
        f"{p}_seconds_per_epoch" for p in ("data", "forward", "backward", "comm_wait", "optimizer")
    }
    assert phases["comm_wait_seconds_per_epoch"] == 0  # one worker: nothing to wait for
    assert sum(phases.values()) <= metrics["seconds_per_epoch"] * 1.01
    assert result["config"]["distribution"]["batch_size"] == 8

    run = _store(output_root).get_run(result["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    assert run.data.metrics["seconds_per_epoch"] == pytest.approx(metrics["seconds_per_epoch"])
    assert run.data.metrics["images_per_second"] == pytest.approx(metrics["images_per_second"])
    assert run.data.metrics["peak_memory_mb"] == pytest.approx(metrics["peak_memory_mb"])
    assert run.data.params["network.name"] == "mobilenetv2"
    assert run.data.params["dataset.num_samples"] == "16"
    assert run.data.params["distribution.batch_size"] == "8"
    tags = run.data.tags
    assert tags["status"] == "ok"
    for key in ("torch_version", "device_name", "host", "git_commit", "python_version"):
        assert tags[key]
    # The worker kept freed memory (harness.measure.allocator), and the record says so.
    assert tags["host_allocator"].startswith("glibc malloc: freed memory kept"), tags
    artifacts = {a.path for a in _store(output_root).list_artifacts(run.info.run_id)}
    assert {"result.json", "config.yaml"} <= artifacts
    epochs = _store(output_root).get_metric_history(run.info.run_id, "epoch_seconds")
    assert [m.step for m in epochs] == [0, 1]


def test_a_failing_cell_is_recorded_not_raised(output_root: Path, tmp_path: Path) -> None:
    missing = tmp_path / "no-such-dataset"
    cfg = compose_config(
        tiny_overrides(output_root, "dataset.source=real", f"dataset.root={missing}")
    )
    result = run_cell(check_cell(cfg), output_dir=tmp_path / "cell")

    assert result["status"] == "failed"
    assert str(missing) in result["error"]
    run = _store(output_root).get_run(result["mlflow_run_id"])
    assert run.info.status == "FAILED"
    assert run.data.tags["status"] == "failed"
    assert str(missing) in run.data.tags["error"]


def test_mlflow_tracking_uri_from_the_environment_is_honoured(
    output_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    elsewhere = tmp_path / "elsewhere.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{elsewhere}")
    result = run_cell(
        check_cell(compose_config(tiny_overrides(output_root, "run.epochs=1"))),
        output_dir=tmp_path / "cell",
    )
    assert elsewhere.exists() and not (output_root / DEFAULT_STORE_FILE).exists()
    run = MlflowClient(f"sqlite:///{elsewhere}").get_run(result["mlflow_run_id"])
    assert run.data.tags["status"] == "ok"


def test_unreachable_mlflow_keeps_the_result_json(
    output_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A tracking server on a closed loopback port: MLflow cannot record, result.json must.
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    cfg = compose_config(
        tiny_overrides(output_root, "run.epochs=1", "tracking.uri=http://127.0.0.1:9")
    )
    result = run_cell(check_cell(cfg), output_dir=tmp_path / "cell")
    assert result["status"] == "ok"
    assert result["mlflow_run_id"] is None and result["tracking_error"]
    assert json.loads((tmp_path / "cell" / "result.json").read_text())["status"] == "ok"
