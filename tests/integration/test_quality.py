"""What a cell's training reached: evaluation after every epoch, time to a target accuracy.

Real cells (sequential, one process, tiny synthetic MNIST) record eval loss and accuracy per
epoch in result.json and MLflow; `run.target_accuracy` ends a repeat at the first evaluation
that reaches it and records MLPerf's score (run_start to run_stop in the cell's MLPerf log);
a target never reached leaves the cell ok with `reached_target` 0.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from harness.commands.compose import compose_config
from harness.records.cell import check_cell
from harness.records.mlflow_store import DEFAULT_STORE_FILE
from harness.records.results import RepeatResult
from harness.runtime.evaluation import Evaluation, default_eval_samples
from harness.worker.run import quality_metrics, run_cell
from tests.helpers import tiny_overrides


def _cell(output_root: Path, cell_dir: Path, *extra: str) -> dict:
    result = run_cell(
        check_cell(compose_config(tiny_overrides(output_root, *extra))), output_dir=cell_dir
    )
    assert result["status"] == "ok", result["error"]
    assert json.loads((cell_dir / "result.json").read_text()) == result
    return result


def _mllog(path: Path) -> list[dict]:
    return [
        json.loads(line.split(":::MLLOG", 1)[1])
        for line in path.read_text().splitlines()
        if ":::MLLOG" in line
    ]


def test_every_epoch_is_evaluated_outside_its_time_and_recorded(
    output_root: Path, tmp_path: Path
) -> None:
    result = _cell(output_root, tmp_path / "cell", "dataset.eval_samples=24")
    assert len(result["eval_accuracy"]) == len(result["eval_loss"]) == 2  # one per epoch
    assert all(0 <= accuracy <= 1 for accuracy in result["eval_accuracy"])
    assert len(result["train_loss"]) == 2 and all(loss > 0 for loss in result["train_loss"])
    metrics = result["metrics"]
    assert metrics["eval_samples"] == 24  # every sample of the split, the last batch partial
    assert metrics["eval_accuracy"] == result["eval_accuracy"][-1]
    assert metrics["eval_loss"] == result["eval_loss"][-1]
    assert result["repeats"][0]["eval_accuracy"] == result["eval_accuracy"][-1]
    assert "reached_target" not in metrics  # no target
    # The evaluation lies between epoch_stop and the next epoch_start: outside the epoch's time.
    events = [
        (e["key"], e["metadata"].get("epoch_num"))
        for e in _mllog(tmp_path / "cell" / "mllog.txt")
        if e["key"] in ("epoch_start", "epoch_stop", "eval_start", "eval_stop")
    ]
    assert events == [
        ("epoch_start", 1),
        ("epoch_stop", 1),
        ("eval_start", 1),
        ("eval_stop", 1),
        ("epoch_start", 2),
        ("epoch_stop", 2),
        ("eval_start", 2),
        ("eval_stop", 2),
    ]

    client = MlflowClient(tracking_uri=f"sqlite:///{output_root / DEFAULT_STORE_FILE}")
    run_id = result["mlflow_run_id"]
    history = client.get_metric_history(run_id, "epoch_eval_accuracy")
    assert [(m.step, m.value) for m in history] == list(enumerate(result["eval_accuracy"]))
    assert [
        m.value for m in client.get_metric_history(run_id, "epoch_train_loss")
    ] == pytest.approx(result["train_loss"])
    assert client.get_run(run_id).data.metrics["eval_accuracy"] == metrics["eval_accuracy"]


def test_eval_off_records_no_evaluation(output_root: Path, tmp_path: Path) -> None:
    result = _cell(
        output_root, tmp_path / "cell", "run.eval=false", "run.epochs=1", "tracking.enabled=false"
    )
    assert result["eval_accuracy"] == [] and "eval_accuracy" not in result["metrics"]
    keys = {e["key"] for e in _mllog(tmp_path / "cell" / "mllog.txt")}
    assert "eval_start" not in keys and "eval_accuracy" not in keys


def test_a_target_ends_each_repeat_at_its_first_evaluation_that_reaches_it(
    output_root: Path, tmp_path: Path
) -> None:
    """A target of 1e-9 is reached by the first evaluation that gets one of its 64 samples
    right: every repeat trains one epoch of run.epochs=3, and its time to target is its
    run_start..run_stop in the MLPerf log."""
    result = _cell(
        output_root,
        tmp_path / "cell",
        "run.target_accuracy=1e-9",
        "run.epochs=3",
        "run.repeats=2",
        "dataset.eval_samples=64",
        "tracking.enabled=false",
    )
    metrics = result["metrics"]
    assert metrics["reached_target"] == 1.0 and metrics["epochs_to_target"] == 1.0
    assert len(result["epoch_seconds"]) == 2  # one epoch per repeat, not three
    assert [r["epochs_to_target"] for r in result["repeats"]] == [1, 1]
    assert metrics["time_to_target_s"] == pytest.approx(
        statistics.fmean(r["time_to_target_s"] for r in result["repeats"])
    )
    logs = sorted((tmp_path / "cell").glob("mllog*.txt"))
    assert [p.name for p in logs] == ["mllog-2.txt", "mllog.txt"]  # one MLPerf log per repeat
    for path, repeat in zip(reversed(logs), result["repeats"]):
        times = {e["key"]: e["time_ms"] for e in _mllog(path)}
        assert repeat["time_to_target_s"] == pytest.approx(
            (times["run_stop"] - times["run_start"]) / 1000, abs=0.01
        )


def test_a_target_never_reached_leaves_the_cell_ok_and_says_so(
    output_root: Path, tmp_path: Path
) -> None:
    result = _cell(
        output_root,
        tmp_path / "cell",
        "run.target_accuracy=1.0",
        "run.epochs=1",
        "optimizer.lr=1e-9",
        "dataset.eval_samples=64",
        "tracking.enabled=false",
    )
    assert result["status"] == "ok"
    assert result["metrics"]["reached_target"] == 0.0
    assert "time_to_target_s" not in result["metrics"]
    assert result["repeats"][0]["reached_target"] is False
    stop = [e for e in _mllog(tmp_path / "cell" / "mllog.txt") if e["key"] == "run_stop"]
    assert stop[-1]["metadata"]["status"] == "aborted"  # MLPerf: a run that missed its target


def test_the_olympic_mean_drops_the_best_and_the_worst_from_five_repeats() -> None:
    seconds = [10.0, 12.0, 11.0, 30.0, 9.0]
    repeats = [
        RepeatResult(
            repeat=k,
            seed=k,
            seconds_per_epoch=1.0,
            epoch_seconds=[1.0],
            eval_accuracy=0.9,
            reached_target=True,
            time_to_target_s=s,
            epochs_to_target=k + 1,
        )
        for k, s in enumerate(seconds)
    ]
    evaluation = Evaluation(loss=0.3, accuracy=0.9, samples=10, seconds=0.1)
    metrics = quality_metrics(repeats, [evaluation], [0.5])
    assert metrics["time_to_target_s_olympic_mean"] == pytest.approx(11.0)  # (10+12+11)/3
    assert metrics["time_to_target_s"] == pytest.approx(statistics.fmean(seconds))
    assert metrics["epochs_to_target_olympic_mean"] == pytest.approx(3.0)
    four = quality_metrics(repeats[:4], [evaluation], [0.5])
    assert "time_to_target_s_olympic_mean" not in four  # MLPerf trims from 5 runs on
    missed = [
        *repeats[:4],
        RepeatResult(
            repeat=4, seed=4, seconds_per_epoch=1.0, epoch_seconds=[1.0], reached_target=False
        ),
    ]
    assert quality_metrics(missed, [evaluation], [0.5])["reached_target"] == 0.0
    assert "time_to_target_s" not in quality_metrics(missed, [evaluation], [0.5])


def test_the_default_eval_split_is_a_tenth_of_the_epoch_at_most_the_split() -> None:
    assert default_eval_samples(70_000, 10_000) == 7_000
    assert default_eval_samples(256, 10_000) == 26  # not a whole batch of 128: half the epoch
    assert default_eval_samples(5, 10_000) == 1
    assert default_eval_samples(1_281_167, 50_000) == 50_000  # at most the split
