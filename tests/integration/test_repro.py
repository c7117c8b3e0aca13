"""Reproducibility: seeds, repeats and their statistics, environment tags, the MLPerf event log."""

from __future__ import annotations

import random
import socket
from pathlib import Path

import numpy as np
import pytest
import torch
from mlflow.tracking import MlflowClient
from mlperf_logging.compliance_checker.mlp_parser import parse_file

from harness.commands.compose import compose_config
from harness.config.schema import ConfigError, validate
from harness.measure.metrics import RepeatStatistics, student_t_975
from harness.records.cell import check_cell
from harness.records.eventlog import MLLOG_FILE
from harness.records.mlflow_store import DEFAULT_STORE_FILE
from harness.runtime.environment import capture_environment
from harness.runtime.seeding import repeat_seed, seed_everything
from harness.runtime.workload import build_workload
from harness.worker.run import parameter_digest, repeat_metrics, run_cell
from tests.helpers import run_tiny_cell, tiny_overrides
from tests.unit.harness.records.test_eventlog import assert_compliant

MLPERF_RULESET = "6.1.0"  # the newest the installed parser knows; the line format is shared


def read_mllog(path: Path) -> list:
    """The log as MLPerf's own parser reads it; it must parse without an error."""
    lines, errors = parse_file(str(path), ruleset=MLPERF_RULESET)
    assert not errors, errors
    return lines


# --- statistics over repeats, against numbers computed by hand -------------------------------


def test_student_t_quantiles_match_the_table() -> None:
    for degrees, table in ((1, 12.706), (2, 4.303), (4, 2.776), (9, 2.262), (29, 2.045)):
        assert student_t_975(degrees) == pytest.approx(table, abs=1e-3)


def test_five_repeats_give_mean_ci_and_trimmed_mean() -> None:
    stats = RepeatStatistics.of([10.0, 12.0, 11.0, 13.0, 9.0])
    # mean 11; std = sqrt((1 + 1 + 0 + 4 + 4) / 4) = 1.5811; half-width = t(4) * std / sqrt(5)
    # = 2.7764 * 0.70711 = 1.9632; trimmed: drop 9 and 13, mean of 10, 11, 12.
    assert stats.mean == 11.0 and stats.n == 5
    assert stats.std == pytest.approx(1.58114, abs=1e-5)
    assert stats.ci95_low == pytest.approx(11 - 1.96323, abs=1e-4)
    assert stats.ci95_high == pytest.approx(11 + 1.96323, abs=1e-4)
    assert stats.trimmed_mean == 11.0
    assert RepeatStatistics.of([1.0, 1.0, 1.0, 1.0, 10.0]).trimmed_mean == 1.0  # robust


def test_fewer_repeats_give_fewer_statistics() -> None:
    two = RepeatStatistics.of([1.0, 3.0])  # std sqrt(2), half-width t(1) * sqrt(2) / sqrt(2)
    assert (two.ci95_low, two.ci95_high) == pytest.approx((2 - 12.7062, 2 + 12.7062), abs=1e-3)
    assert two.trimmed_mean is None
    one = RepeatStatistics.of([4.0])
    assert (one.mean, one.std, one.ci95_low, one.trimmed_mean) == (4.0, 0.0, None, None)
    assert repeat_metrics([4.0]) == {"repeats": 1.0}
    assert set(repeat_metrics([1.0, 2.0, 3.0])) == {
        "repeats",
        "seconds_per_epoch_repeat_std",
        "seconds_per_epoch_ci95_low",
        "seconds_per_epoch_ci95_high",
    }
    assert "seconds_per_epoch_trimmed_mean" in repeat_metrics([1.0, 2.0, 3.0, 4.0, 5.0])


def test_repeats_must_be_positive(output_root: Path) -> None:
    with pytest.raises(ConfigError, match="run.repeats=0 is invalid: must be 1 or more"):
        validate(compose_config(tiny_overrides(output_root, "run.repeats=0")))


# --- seeds ------------------------------------------------------------------------------------


def test_seed_everything_seeds_python_numpy_and_torch() -> None:
    def draws() -> tuple:
        return random.random(), float(np.random.rand()), float(torch.rand(1))

    seed_everything(7)
    first = draws()
    seed_everything(7)
    assert draws() == first
    seed_everything(8)
    assert draws() != first
    assert [repeat_seed(7, k) for k in range(3)] == [7, 8, 9]


def test_the_same_seed_builds_the_same_parameters_and_data_order(output_root: Path) -> None:
    def built(seed: int) -> tuple[str, np.ndarray]:
        config = validate(compose_config(tiny_overrides(output_root, f"run.seed={seed}")))
        workload = build_workload(config)
        return parameter_digest(workload.model), workload.loader.batch_indices()

    params, order = built(3)
    again_params, again_order = built(3)
    assert again_params == params and np.array_equal(again_order, order)
    other_params, other_order = built(4)
    assert other_params != params and not np.array_equal(other_order, order)


def test_reseeding_the_loader_gives_the_order_of_that_seed(output_root: Path) -> None:
    loader = build_workload(validate(compose_config(tiny_overrides(output_root)))).loader
    fresh = build_workload(
        validate(compose_config(tiny_overrides(output_root, "run.seed=1")))
    ).loader
    loader.reseed(1)
    for epoch in (0, 1):
        loader.set_epoch(epoch)
        fresh.set_epoch(epoch)
        assert np.array_equal(loader.batch_indices(), fresh.batch_indices())


# --- environment tags -------------------------------------------------------------------------

ENVIRONMENT_TAGS = (
    "distbench_version",
    "git_commit",
    "git_dirty",
    "python_version",
    "torch_version",
    "cuda_version",
    "cudnn_version",
    "nccl_version",
    "horovod_version",
    "device_name",
    "cuda_device_count",
    "cuda_device_names",
    "gpu_driver_version",
    "cpu_model",
    "cpu_capability",
    "host",
    "slurm_job_id",
    "slurm_nodelist",
    "deterministic_algorithms",
    "cublas_workspace_config",
)


def test_slurm_facts_come_from_the_job_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.delenv("SLURM_JOB_NODELIST", raising=False)
    outside = capture_environment(torch.device("cpu"))
    assert set(ENVIRONMENT_TAGS) <= set(outside)
    assert outside["slurm_job_id"] == "none"
    assert outside["slurm_nodelist"] == socket.gethostname()
    assert outside["git_dirty"] in ("true", "false") and len(outside["git_commit"]) == 40
    if not torch.cuda.is_available():
        assert outside["cuda_device_names"] == "none" and outside["cuda_device_count"] == "0"
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "node[1-2]")
    inside = capture_environment(torch.device("cpu"))
    assert (inside["slurm_job_id"], inside["slurm_nodelist"]) == ("4242", "node[1-2]")


# --- a real cell with repeats -----------------------------------------------------------------


def test_repeats_are_seeded_apart_summarised_and_recorded(output_root: Path) -> None:
    # Deterministic mode changes torch's process-wide settings: the cell runs in its own process.
    result = run_tiny_cell(
        output_root, "run.repeats=3", "run.epochs=1", "run.seed=5", "run.deterministic=true"
    )

    repeats = result["repeats"]
    assert [r["seed"] for r in repeats] == [5, 6, 7]  # run.seed + repeat
    assert [len(r["epoch_seconds"]) for r in repeats] == [1, 1, 1]
    per_repeat = [r["seconds_per_epoch"] for r in repeats]
    metrics = result["metrics"]
    assert metrics["repeats"] == 3
    assert result["epoch_seconds"] == [s for r in repeats for s in r["epoch_seconds"]]
    stats = RepeatStatistics.of(per_repeat)
    assert metrics["seconds_per_epoch"] == pytest.approx(stats.mean)  # the headline: the mean
    assert metrics["seconds_per_epoch_repeat_std"] == pytest.approx(stats.std)
    assert metrics["seconds_per_epoch_ci95_low"] == pytest.approx(stats.ci95_low)
    assert metrics["seconds_per_epoch_ci95_high"] == pytest.approx(stats.ci95_high)
    assert "seconds_per_epoch_trimmed_mean" not in metrics  # only from 5 repeats on

    client = MlflowClient(f"sqlite:///{output_root / DEFAULT_STORE_FILE}")
    run = client.get_run(result["mlflow_run_id"])
    assert run.data.metrics["seconds_per_epoch"] == pytest.approx(stats.mean)
    assert run.data.metrics["seconds_per_epoch_ci95_high"] == pytest.approx(stats.ci95_high)
    history = client.get_metric_history(run.info.run_id, "repeat_seconds_per_epoch")
    history = sorted((m.step, m.value) for m in history)
    assert [step for step, _ in history] == [0, 1, 2]
    assert [value for _, value in history] == pytest.approx(per_repeat)
    seeds = client.get_metric_history(run.info.run_id, "repeat_seed")
    assert sorted((m.step, m.value) for m in seeds) == [(0, 5), (1, 6), (2, 7)]
    assert run.data.params["seeds"] == "5 6 7" and run.data.params["run.seed"] == "5"
    assert run.data.params["run.deterministic"] == "True"
    tags = run.data.tags
    for key in ENVIRONMENT_TAGS:
        assert tags[key], key
    assert tags["deterministic_algorithms"] == "true"
    assert tags["cublas_workspace_config"] == ":4096:8"
    # the instruction set torch's kernels used: what tells two hosts of one CPU model apart
    assert tags["cpu_capability"] == str(torch.backends.cpu.get_cpu_capability())
    logs = ["mllog.txt", "mllog-2.txt", "mllog-3.txt"]  # one MLPerf log per repeat
    assert set(logs) <= {a.path for a in client.list_artifacts(run.info.run_id)}

    # The event logs, read by MLPerf's parser and passed by its checker: each one run, from
    # the shared initialisation, epochs numbered from 1.
    assert_compliant(Path(result["output_dir"]), repeats=3)
    for repeat, (seed, name) in enumerate(zip((5, 6, 7), logs)):
        lines = read_mllog(Path(result["output_dir"]) / name)
        keys = [line.key for line in lines]
        assert keys[0] == "init_start" and keys.index("init_stop") < keys.index("run_start")
        run_part = [
            (
                line.key,
                line.value["metadata"].get("repeat"),
                line.value["metadata"].get("epoch_num"),
                line.value["value"],
            )
            for line in lines[keys.index("init_stop") + 1 :]
            if line.key in ("seed", "run_start", "epoch_start", "epoch_stop", "run_stop")
        ]
        assert run_part == [
            ("seed", repeat, None, seed),
            ("run_start", repeat, None, None),
            ("epoch_start", repeat, 1, None),
            ("epoch_stop", repeat, 1, None),
            ("run_stop", repeat, None, None),
        ]
        assert [line.value["metadata"]["status"] for line in lines if line.key == "run_stop"] == [
            "success"
        ]
        facts = {line.key: line.value["value"] for line in lines}
        assert facts["global_batch_size"] == 8 and facts["epoch_count"] == 1
        assert facts["submission_benchmark"] == "mobilenetv2_mnist_synthetic"
        assert all(line.value["metadata"]["file"] == "harness/worker/run.py" for line in lines)


def test_a_failed_cell_ends_its_event_log_as_aborted(output_root: Path, tmp_path: Path) -> None:
    cfg = compose_config(
        tiny_overrides(output_root, "dataset.source=real", f"dataset.root={tmp_path / 'missing'}")
    )
    result = run_cell(check_cell(cfg), output_dir=tmp_path / "cell")
    assert result["status"] == "failed"
    lines = read_mllog(tmp_path / "cell" / MLLOG_FILE)
    assert [line.key for line in lines] == ["init_start", "run_stop"]
    assert lines[-1].value["metadata"]["status"] == "aborted"
