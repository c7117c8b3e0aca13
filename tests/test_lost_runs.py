"""Runs that must not be lost or mis-recorded (issue 24, item 3): a diverged loss, an
interrupted cell, runs and sweeps that start at the same time. Through real processes and
signals, as tests/test_faults.py does."""

from __future__ import annotations

import json
from pathlib import Path

from mlflow.tracking import MlflowClient

from harness.resume import finished_result
from harness.tracking import DEFAULT_STORE_FILE
from tests.helpers import run_module, tiny_overrides


def _only_result(output_root: Path) -> dict:
    (path,) = (output_root / "runs").glob("*/result.json")
    return json.loads(path.read_text())


def test_a_diverged_loss_is_recorded_diverged_and_run_again(output_root: Path) -> None:
    """A learning rate that makes the loss NaN stops the cell at the first epoch that shows it:
    recorded `diverged` (where, and the value), exit status 1, and not skipped on resume."""
    done = run_module("harness", tiny_overrides(output_root, "optimizer.lr=1e30"),
                      cwd=output_root.parent)
    assert done.returncode == 1, done.stderr[-3000:]
    assert "diverged" in done.stderr and "Traceback" not in done.stderr
    result = _only_result(output_root)
    assert result["status"] == "diverged"
    assert "epoch 1/2" in result["error"] and "not finite" in result["error"]
    run = MlflowClient(f"sqlite:///{output_root / DEFAULT_STORE_FILE}").get_run(
        result["mlflow_run_id"])
    assert run.data.tags["status"] == "diverged"
    assert finished_result(output_root, result["cell_key"]) is None
