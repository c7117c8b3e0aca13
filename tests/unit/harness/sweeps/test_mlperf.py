"""An MLPerf results folder and MLPerf's result summarizer on it (harness.sweeps.mlperf).

Unit level: cells' logs written by the EventLog as harness/worker/run.py drives it
(tests.unit.harness.records.test_eventlog.write_cell_log), laid out as the folder, scored by the
installed summarizer's own code. The command on a real sweep's cells (MLflow store, artifacts) is
tested where a sweep already runs:
tests/integration/test_sweeps.py::test_mlperf_folder_is_scored_by_mlperfs_summarizer.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from mlperf_logging.benchmark_meta import get_allowed_benchmarks
from mlperf_logging.system_desc_checker.system_desc_checker import check_system_desc
from omegaconf import OmegaConf

from harness.commands.compose import compose_config
from harness.config.schema import validate
from harness.records.compliance import RULESET, USAGE
from harness.records.eventlog import log_file_name
from harness.runtime.environment import capture_environment
from harness.sweeps.cli import main
from harness.sweeps.mlperf import (
    Cell,
    log_facts,
    summarize,
    system_description,
    system_names,
    write_cell,
)
from harness.sweeps.table import axes
from tests.unit.harness.records.test_eventlog import write_cell_log

BENCHMARK = "mobilenetv2_mnist_synthetic"


def _cell(folder: Path, model: str, targets: tuple[bool, ...], *overrides: str) -> Cell:
    """A cell of `model` whose repeats reached their target or not (`targets`), as the folder
    reads it: its row of the cells table, its result.json's environment and config, its logs."""
    composed = compose_config(
        [
            "dataset=mnist",
            "network=mobilenetv2",
            "hardware=local_2cpu",
            f"distribution={model}",
            "distribution.batch_size=8",
            "dataset.num_samples=64",
            *overrides,
        ]
    )
    config = validate(composed)
    write_cell_log(folder, config, {}, repeats=len(targets), targets=targets)
    row = pd.Series(
        {
            **axes(config),
            "run_name": f"{model} cell",
            "run_id": f"run-{model}",
            "cell_key": f"key-{model}",
            "status": "ok",
        }
    )
    result = {
        "environment": capture_environment(torch.device("cpu")),
        "config": OmegaConf.to_container(composed, resolve=True),
    }
    logs = [folder / log_file_name(repeat) for repeat in range(len(targets))]
    return Cell(row=row, result=result, logs=logs, facts=log_facts(logs[0]))


def test_a_systems_framework_names_the_libraries_its_model_trains_with(tmp_path: Path) -> None:
    # what each model's spec declares (`frameworks`), with the versions its record holds
    horovod = system_description("h", _cell(tmp_path / "hvd", "horovod", (True,)))
    version = capture_environment(torch.device("cpu"))["horovod_version"]
    assert horovod["framework"] == f"PyTorch {torch.__version__}, Horovod {version}"
    ddp = system_description("d", _cell(tmp_path / "ddp", "ddp", (True,)))
    assert ddp["framework"] == f"PyTorch {torch.__version__}"


def run_minutes(log: Path) -> float:
    """run_stop - run_start of an MLPerf log, in minutes, read from its JSON lines."""
    events = {
        e["key"]: e["time_ms"]
        for e in (json.loads(line.split(":::MLLOG", 1)[1]) for line in log.read_text().splitlines())
    }
    return (events["run_stop"] - events["run_start"]) / 60_000


def test_summarizer_scores_each_system_and_drops_a_run_short_of_its_target(tmp_path: Path) -> None:
    """The olympic mean MLPerf's summarizer computes: the sequential cell's 3 runs less the
    best and the worst; the DDP cell's second run stopped aborted (short of its target), so it
    is the non-converged run the summarizer drops as the worst, with the best."""
    out = tmp_path / "mlperf"
    cells = [
        _cell(tmp_path / "seq", "sequential", (True, True, True)),
        _cell(tmp_path / "ddp", "ddp", (True, False, True, True)),
    ]
    names = system_names([c.row for c in cells], [c.benchmark for c in cells])
    assert names == ["local_2cpu-sequential-1w", "local_2cpu-ddp-2w"]
    entries = [write_cell(out, name, cell) for name, cell in zip(names, cells)]
    assert [(e.results, e.aborted) for e in entries] == [(3, 0), (4, 1)]
    for name, cell in zip(names, cells):
        for k, log in enumerate(cell.logs):
            assert (
                out / "results" / name / BENCHMARK / f"result_{k}.txt"
            ).read_text() == log.read_text()
        description = out / "systems" / f"{name}.json"
        assert check_system_desc(str(description), USAGE, RULESET)[0]  # every field MLPerf wants

    summary = summarize(out)
    table = pd.read_csv(summary.csv).set_index("system")
    assert sorted(table.index) == sorted(names)  # a row per system
    sequential = sorted(run_minutes(log) for log in cells[0].logs)
    assert table.at[names[0], BENCHMARK] == pytest.approx(sequential[1], abs=1e-6)
    ddp = sorted(run_minutes(log) for k, log in enumerate(cells[1].logs) if k != 1)
    assert table.at[names[1], BENCHMARK] == pytest.approx((ddp[1] + ddp[2]) / 2, abs=1e-6)
    assert any("Dropping non-converged run(s)" in line for line in summary.messages)
    assert table.loc[names[1], ["division", "submitter", "availability"]].tolist() == [
        "open",
        "distbench",
        "Research, Development, or Internal (RDI)",
    ]
    assert table.at[names[1], "framework"].startswith("PyTorch ")
    assert int(table.at[names[1], "accelerators_count"]) == 0  # a CPU cell: no accelerator
    detailed = pd.read_csv(out / "summary_detailed.csv").set_index("system")
    assert detailed.at[names[0], f"{BENCHMARK}:time_to_train"] == table.at[names[0], BENCHMARK]
    # The package's own list is as it was: the benchmarks were admitted for the summary alone.
    assert BENCHMARK not in get_allowed_benchmarks(USAGE, RULESET)

    # MLPerf's summarizer as its own command cannot read distbench's benchmarks: it checks each
    # log with the stock ruleset, which looks for the benchmark's own rules file.
    stock = subprocess.run(
        [sys.executable, "-m", "mlperf_logging.result_summarizer", str(out), USAGE, RULESET],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert stock.returncode != 0
    assert (
        stock.stderr.rstrip().splitlines()[-1].startswith("FileNotFoundError")
        and f"training_{RULESET}/open_{BENCHMARK}.yaml" in stock.stderr
    )


def test_system_names_split_a_model_only_where_the_selection_varies_its_settings() -> None:
    def row(distribution: str, workers: int, batch_size: int, key: str, **more: object) -> dict:
        return {
            "hardware": "local_2cpu",
            "distribution": distribution,
            "workers": workers,
            "batch_size": batch_size,
            "cell_key": key,
            "run_id": f"run-{key}",
            **more,
        }

    rows = [
        pd.Series(r)
        for r in (
            row("sequential", 1, 8, "a1"),
            row("ddp", 2, 8, "b1"),
            row("ddp", 2, 16, "b2"),
            row("gpipe", 2, 8, "c1", micro_batches=2.0),
            row("gpipe", 2, 8, "c2", micro_batches=4.0),
            # the same system and benchmark, differing in nothing the name shows: the cell key
            row("horovod", 2, 8, "d1aaaaaaaa"),
            row("horovod", 2, 8, "d2bbbbbbbb"),
        )
    ]
    names = system_names(rows, ["resnet18_cifar10"] * len(rows))
    assert names == [
        "local_2cpu-sequential-1w",
        "local_2cpu-ddp-2w-b8",
        "local_2cpu-ddp-2w-b16",
        "local_2cpu-gpipe-2w-mb2",
        "local_2cpu-gpipe-2w-mb4",
        "local_2cpu-horovod-2w-d1aaaaaa",
        "local_2cpu-horovod-2w-d2bbbbbb",
    ]
    # Two benchmarks of one cell setting share their system.
    assert (
        system_names(rows[5:], ["resnet18_cifar10", "vgg16_mnist"]) == ["local_2cpu-horovod-2w"] * 2
    )


def test_out_must_be_new_or_empty(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Checked before any store is read: the summarizer would score an earlier folder's
    systems with this one's."""
    out = tmp_path / "mlperf"
    (out / "systems").mkdir(parents=True)
    with pytest.raises(SystemExit) as ended:
        main(["mlperf", "sweeps_a", "--out", str(out), f"run.output_dir={tmp_path}/nothing"])
    error = capsys.readouterr().err
    assert ended.value.code == 2 and error.count("\n") == 1
    assert error.startswith("distbench: ") and f"--out={out} is invalid: it holds files" in error
    assert [p.name for p in out.iterdir()] == ["systems"]
