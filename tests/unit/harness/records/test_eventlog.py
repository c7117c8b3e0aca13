"""The cell's MLPerf logs pass MLPerf's compliance checker (harness.records.eventlog,
harness.compliance).

Unit level: an EventLog driven as harness/worker/run.py drives it, for the config of every
distribution model, written to real files and read by the real checker (mlperf-logging's newest
training ruleset, with distbench's benchmark names admitted; the stock ruleset objects to nothing
else). Cells' own logs are checked where tests already run cells of each model (test_quality,
test_repro, test_distributed, test_pipeline_*): `assert_compliant` below.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from harness.commands.compose import compose_config
from harness.compliance import log_files, main
from harness.config.schema import DistbenchConfig, validate
from harness.records.compliance import RULESET, check, mlperf_command, write_rules
from harness.records.eventlog import (
    MLLOG_FILE,
    EventLog,
    Parallelism,
    RunFacts,
    benchmark_name,
    precision_name,
)
from harness.records.record import staged_artifacts, write_record_files

# Every distribution model, with the parallelism its log must state.
MODELS = {  # name: (overrides, resolved plan, (data, pipeline, micro_batch_size))
    "sequential": ([], {}, (1, 1, 8)),
    "ddp": (["distribution=ddp", "hardware=local_2cpu"], {}, (2, 1, 8)),
    "horovod": (["distribution=horovod", "hardware=local_2cpu"], {}, (2, 1, 8)),
    "gpipe": (
        ["distribution=gpipe", "hardware=local_2cpu", "distribution.micro_batches=4"],
        {"balance": [10, 10], "micro_batches": 4},
        (1, 2, 2),
    ),
    "pipedream": (
        ["distribution=pipedream", "hardware=local_4cpu"],
        {"stages": "2-1-1", "balance": [4, 8, 8]},
        ([2, 1, 1], 3, 8),
    ),
    "pipedream_straight": (
        ["distribution=pipedream_straight", "hardware=local_2cpu"],
        {"stages": "1-1", "balance": [10, 10]},
        (1, 2, 8),
    ),
}


def _config(*overrides: str) -> DistbenchConfig:
    return validate(
        compose_config(
            [
                "dataset=mnist",
                "network=mobilenetv2",
                "distribution.batch_size=8",
                "dataset.num_samples=64",
                *overrides,
            ]
        )
    )


def _mllog(path: Path) -> list[dict]:
    return [
        json.loads(line.split(":::MLLOG", 1)[1])
        for line in path.read_text().splitlines()
        if ":::MLLOG" in line
    ]


def write_cell_log(
    folder: Path,
    config: DistbenchConfig,
    resolved: dict,
    *,
    repeats: int = 1,
    evaluate: bool = True,
    targets: tuple[bool, ...] = (),
) -> EventLog:
    """What harness/worker/run.py logs for a cell: initialisation, then per repeat its epochs, each
    evaluated (unless not `evaluate`)."""
    with EventLog.for_worker(folder, is_main=True) as events:
        events.init_start()
        events.init_stop(
            config,
            RunFacts(
                train_samples=64,
                eval_samples=16 if evaluate else 0,
                resolved=resolved,
                precision=precision_name("torch.float32"),
                config_file="config.yaml",
            ),
        )
        for repeat in range(repeats):
            events.run_start(repeat, seed=repeat)
            for epoch in range(2):
                events.epoch_start(repeat, epoch)
                events.epoch_stop(repeat, epoch)
                if evaluate:
                    events.eval_start(repeat, epoch)
                    events.eval_stop(repeat, epoch, accuracy=0.25 * (epoch + 1), loss=1.5)
            events.run_stop(repeat, success=targets[repeat] if targets else True)
    return events


def assert_compliant(cell_dir: Path, repeats: int = 1) -> None:
    """Every log of the cell in `cell_dir` (one per repeat) passes MLPerf's checker, and the
    stock ruleset objects to nothing but the benchmark name."""
    logs = log_files([cell_dir])
    assert len(logs) == repeats, logs
    for log in logs:
        verdict = check(log)
        assert verdict.ok, "\n".join(verdict.problems)
        # The stock ruleset: MLPerf's benchmark names only, then the named benchmark's rules.
        stock = check(log, stock=True)
        benchmark = {event["key"]: event["value"] for event in _mllog(log)}["submission_benchmark"]
        assert not stock.ok and len(stock.problems) == 2, stock.problems
        assert stock.problems[0].startswith("CHECK for 'submission_benchmark' failed")
        assert stock.problems[1].startswith("Could not find config file") and stock.problems[
            1
        ].endswith(f"training_{RULESET}/open_{benchmark}.yaml")


@pytest.mark.parametrize("model", list(MODELS))
def test_every_models_log_passes_the_checker_with_its_true_facts(
    model: str, tmp_path: Path
) -> None:
    overrides, resolved, (data, stages, micro) = MODELS[model]
    config = _config(*overrides)
    write_cell_log(tmp_path, config, resolved)
    assert_compliant(tmp_path)
    facts = {event["key"]: event["value"] for event in _mllog(tmp_path / MLLOG_FILE)}
    assert facts["pipeline_parallelism"] == stages and facts["micro_batch_size"] == micro
    assert facts["data_parallelism"] == data
    assert (
        facts["tensor_parallelism"]
        == facts["context_parallelism"]
        == facts["expert_parallelism"]
        == 1
    )
    assert facts["global_batch_size"] == config.global_batch_size
    assert facts["world_size"] == config.world_size
    assert facts["submission_benchmark"] == "mobilenetv2_mnist_synthetic"
    assert facts["submission_division"] == "open" and facts["submission_org"] == "distbench"
    assert facts["submission_platform"] == config.hardware.name
    assert facts["cache_clear"] is False  # distbench does not drop the page cache
    assert facts["train_samples"] == 64 and facts["eval_samples"] == 16
    assert {
        facts[f"lowest_numerical_precision_in_{part}"] for part in ("linear", "attn", "comm")
    } == {"fp32"}
    assert facts["config_filename"] == "config.yaml"


def test_each_repeat_is_a_whole_mlperf_run_in_its_own_file(tmp_path: Path) -> None:
    """Repeat k > 1 writes mllog-<k>.txt: the initialisation's lines verbatim (timestamps
    too), then its own run; `text()` has every file, as the cell's record uploads them."""
    events = write_cell_log(
        tmp_path, _config("run.submission_org=acme"), {}, repeats=3, targets=(True, False, True)
    )
    assert_compliant(tmp_path, repeats=3)
    assert sorted(events.text()) == ["mllog-2.txt", "mllog-3.txt", MLLOG_FILE]
    for name, text in events.text().items():
        assert (tmp_path / name).read_text() == text
    first, second = (_mllog(tmp_path / name) for name in (MLLOG_FILE, "mllog-2.txt"))
    init = first[: [event["key"] for event in first].index("init_stop") + 1]
    assert second[: len(init)] == init
    assert {e["value"] for e in second if e["key"] == "submission_org"} == {"acme"}
    assert [e["metadata"]["status"] for e in second if e["key"] == "run_stop"] == ["aborted"]
    assert {e["metadata"]["repeat"] for e in second[len(init) :]} == {1}
    # MLPerf's blocks around the epochs, evaluations after them with the samples seen so far.
    run = [
        (
            e["key"],
            e["metadata"].get("epoch_num", e["metadata"].get("first_epoch_num")),
            e["metadata"].get("samples_count"),
        )
        for e in second[len(init) + 2 : -1]
    ]
    assert run == [
        ("block_start", 1, 0),
        ("epoch_start", 1, 0),
        ("epoch_stop", 1, 64),
        ("block_stop", 1, 64),
        ("eval_start", 1, 64),
        ("eval_accuracy", 1, 64),
        ("eval_loss", 1, 64),
        ("eval_stop", 1, 64),
        ("block_start", 2, 64),
        ("epoch_start", 2, 64),
        ("epoch_stop", 2, 128),
        ("block_stop", 2, 128),
        ("eval_start", 2, 128),
        ("eval_accuracy", 2, 128),
        ("eval_loss", 2, 128),
        ("eval_stop", 2, 128),
    ]


def test_a_log_without_evaluation_fails_only_for_want_of_eval_accuracy(tmp_path: Path) -> None:
    """run.eval=false: MLPerf requires an eval_accuracy, and distbench logs none it did not
    measure."""
    write_cell_log(tmp_path, _config("run.eval=false"), {}, evaluate=False)
    verdict = check(tmp_path / MLLOG_FILE)
    assert not verdict.ok
    assert verdict.problems == ["Required AT_LEAST_ONE occurrence of 'eval_accuracy' but found 0"]


def test_the_benchmark_name_says_what_was_trained() -> None:
    assert benchmark_name(_config()) == "mobilenetv2_mnist_synthetic"
    real = _config("dataset.source=real", "dataset.root=/data")
    assert benchmark_name(real) == "mobilenetv2_mnist"
    assert Parallelism.of(real, {}).pipeline == 1
    assert precision_name("torch.bfloat16") == "bfloat16"  # MLPerf's spelling, not torch's
    with pytest.raises(ValueError, match="no MLPerf precision name"):
        precision_name("torch.int8")


def test_mlperfs_own_command_agrees_and_ours_names_each_log(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    write_cell_log(tmp_path / "cell", _config(), {}, repeats=2)
    rules = write_rules(tmp_path / "rules")
    done = subprocess.run(
        mlperf_command(tmp_path / "cell" / "mllog-2.txt", rules),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and "SUCCESS" in done.stderr, done.stderr
    # The stock command has no verdict for a benchmark it does not know: a traceback.
    stock = [
        arg
        for arg in mlperf_command(tmp_path / "cell" / MLLOG_FILE, rules)
        if arg not in ("--config", str(rules))
    ]
    done = subprocess.run(stock, capture_output=True, text=True, timeout=120)
    assert f"training_{RULESET}/open_mobilenetv2_mnist_synthetic.yaml" in done.stderr
    assert "FileNotFoundError" in done.stderr

    assert main(["--write-rules", str(tmp_path / "printed")]) == 0
    assert capsys.readouterr().out.split() == [
        "python",
        *mlperf_command(Path("FILE"), tmp_path / "printed" / "common.yaml")[1:],
    ]
    assert main([str(tmp_path / "cell")]) == 0
    cell = tmp_path / "cell"
    assert capsys.readouterr().out.splitlines() == [
        f"{cell / 'mllog-2.txt'}: SUCCESS",
        f"{cell / MLLOG_FILE}: SUCCESS",
    ]


def test_the_record_carries_every_repeats_log(tmp_path: Path) -> None:
    """The cell's record (its MLflow artifacts, a rescued record, harness.sync's upload) holds
    every repeat's log: those kept in memory when given (a disk that refused them), else the
    cell directory's."""
    cell = tmp_path / "cell"
    events = write_cell_log(cell, _config(), {}, repeats=2)
    data = {"config": {"run": {"epochs": 2}}, "status": "ok"}
    with staged_artifacts(data, cell) as staged:  # harness.sync: from the cell's directory
        assert sorted(path.name for path in staged) == [
            "config.yaml",
            "mllog-2.txt",
            MLLOG_FILE,
            "result.json",
        ]
        assert (staged[0].parent / "mllog-2.txt").read_text() == (cell / "mllog-2.txt").read_text()
    for path in log_files([cell]):
        path.unlink()  # as if the disk had refused them: the copies in memory are recorded
    files = write_record_files(tmp_path / "rescue", data, cell, events.text())
    assert {path.name: path.read_text() for path in files if "mllog" in path.name} == events.text()


def test_a_worker_that_writes_no_log_writes_no_repeat_either(tmp_path: Path) -> None:
    with EventLog.for_worker(tmp_path, is_main=False) as events:  # rank > 0
        events.init_start()
        events.init_stop(_config(), RunFacts(train_samples=64, eval_samples=0))
        for repeat in range(2):
            events.run_start(repeat, seed=repeat)
            events.run_stop(repeat, success=True)
    assert events.text() == {} and not list(tmp_path.iterdir())


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs Linux's /dev/full")
def test_a_full_disk_loses_no_line_and_ends_nothing(tmp_path: Path) -> None:
    """mllog.txt on a device that refuses every write (/dev/full: ENOSPC, as a full disk):
    the lines are kept in memory, and closing the log (which flushes) raises nothing; a cell
    whose log was closed on a full disk ended `failed` before."""
    (tmp_path / MLLOG_FILE).symlink_to("/dev/full")
    events = write_cell_log(tmp_path, _config(), {})
    assert events.text()[MLLOG_FILE].count(":::MLLOG") > 30
