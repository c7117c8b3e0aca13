"""The commands as a user types them: `python -m harness[.describe]`, sweeps included."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from harness.cli.cell_results import failure_reason
from harness.records.mlflow_store import DEFAULT_STORE_FILE
from tests.helpers import cell_worker_pids, run_module
from tests.in_process import in_process_command

TINY_SWEEP = [
    "+sweep=smoke",
    "network=mobilenetv2",
    "distribution.batch_size=8",
    "dataset.num_samples=16",
    "run.epochs=1",
    "run.warmup_batches=0",
    "run.progress=false",
]


def _results(output_root: Path) -> list[dict]:
    """The result.json of every cell (MLflow keeps copies under mlartifacts/, not counted)."""
    return [
        json.loads(p.read_text()) for p in sorted((output_root / "sweeps").rglob("result.json"))
    ]


def _experiment_runs(output_root: Path, experiment: str) -> list:  # mlflow Run objects
    client = MlflowClient(f"sqlite:///{output_root / DEFAULT_STORE_FILE}")
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None, f"no MLflow experiment {experiment!r}"
    return client.search_runs([exp.experiment_id])


def test_describe_prints_workload_facts_as_json(tmp_path: Path) -> None:
    # What it prints is under test, not its process (the tests below start that): its real
    # entry point, in this process.
    done = in_process_command(
        "harness.describe", ["dataset=imagenet", "network=resnet50"], cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    facts = json.loads(done.stdout)
    assert facts["parameters"] == 25_557_032
    assert facts["gradient_mb"] == pytest.approx(25_557_032 * 4 / 1e6)
    assert facts["input_shape"] == [3, 224, 224]
    assert facts["num_layers"] == len(facts["layers"]) > 10
    assert facts["layers"][0]["output_shape"] == [64, 112, 112]
    assert facts["layers"][-1]["output_shape"] == [1000]
    assert sum(layer["parameters"] for layer in facts["layers"]) == facts["parameters"]
    assert facts["batch_size"] == 32


def test_describe_rejects_an_unknown_network_with_exit_2(tmp_path: Path) -> None:
    done = run_module("harness.describe", ["network=resnet19"], cwd=tmp_path)
    assert done.returncode == 2
    assert "resnet18" in done.stderr and "Traceback" not in done.stderr


def test_a_command_whose_reader_has_gone_ends_quietly(tmp_path: Path) -> None:
    # `python -m harness.describe ... | head -2`: head closes the pipe once it has its lines.
    # Here the reader is gone before the command writes, so its first write fails for sure.
    read_end, write_end = os.pipe()
    described = subprocess.Popen(
        [sys.executable, "-m", "harness.describe", "network=mobilenetv2", "dataset=mnist"],
        cwd=tmp_path,
        stdout=write_end,
        stderr=subprocess.PIPE,
        text=True,
    )
    os.close(write_end)
    os.close(read_end)
    _, stderr = described.communicate(timeout=120)
    assert stderr == ""  # not "error (a bug?): BrokenPipeError", not "Exception ignored"
    assert described.returncode == 128 + signal.SIGPIPE  # as a command SIGPIPE ended


def test_help_names_the_commands_and_dry_run_and_no_internal_schema(tmp_path: Path) -> None:
    """`python -m harness --help`: what to type besides overrides (--dry-run, per-model
    settings, the other commands, each of which exists), still Hydra's lists of the config
    groups with their options and the config; no model's internal `<name>_schema`."""
    done = run_module("harness", ["--help"], cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    text = done.stdout
    assert "--dry-run" in text and "+per_model.<model>.<key>=value" in text
    commands = [
        "describe",
        "plan",
        "probe",
        "analysis",
        "recommend",
        "sweeps",
        "compliance",
        "sync",
    ]
    for command in commands:
        assert f"python -m harness.{command} " in text, command
        assert importlib.util.find_spec(f"harness.{command}") is not None, command
    listed = text.split("== Configuration groups ==")[1].split("== Config ==")[0]
    groups = dict(line.split(": ", 1) for line in listed.splitlines() if ": " in line)
    assert {"dataset", "distribution", "hardware", "network", "sweep"} <= set(groups)
    assert groups["distribution"].split(", ")[:3] == ["ddp", "fsdp", "gpipe"]
    assert "resnet18" in groups["network"].split(", ")
    assert "per_model: {}" in text  # the config
    assert "_schema" not in text and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "args", [["--help"], ["-h", "dataset=cifar10", "distribution=gpipe"], ["--hydra-help"]]
)
def test_the_help_is_hydras_own_text(tmp_path: Path, args: list[str]) -> None:
    # distbench answers --help with one config repository for Hydra's many questions
    # (launchers.hydra_main); HYDRA_FULL_ERROR=1 runs Hydra untouched: the same text.
    fast = run_module("harness", args, cwd=tmp_path)
    untouched = subprocess.run(
        [sys.executable, "-m", "harness", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, HYDRA_FULL_ERROR="1"),
    )
    assert fast.returncode == untouched.returncode == 0, fast.stderr + untouched.stderr
    assert fast.stdout == untouched.stdout
    assert fast.stdout.count("\n") > 20  # a whole help, not an empty one


def test_a_sweep_records_every_cell_nested_under_a_parent_run(output_root: Path) -> None:
    # What the sweep records is under test, not its process: its launcher runs in this process
    # (its cells' workers are processes of their own, as always).
    done = in_process_command(
        "harness",
        [*TINY_SWEEP, "dataset=mnist,cifar10", f"run.output_dir={output_root}"],
        cwd=output_root.parent,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = _results(output_root)
    assert sorted(r["config"]["dataset"]["name"] for r in results) == ["cifar10", "mnist"]
    assert all(r["status"] == "ok" for r in results), [r["error"] for r in results]

    runs = _experiment_runs(output_root, "smoke")
    parents = [r for r in runs if r.data.tags.get("distbench.kind") == "sweep"]
    cells = [r for r in runs if "status" in r.data.tags]
    assert len(parents) == 1 and len(cells) == 2
    assert {c.data.tags["mlflow.parentRunId"] for c in cells} == {parents[0].info.run_id}
    assert all(c.data.metrics["seconds_per_epoch"] > 0 for c in cells)
    # The launcher recorded them (it holds the store open), with what rank 0 would have
    # uploaded: the same files, MLflow's result.json the cell's as it reads once synced.
    client = MlflowClient(f"sqlite:///{output_root / DEFAULT_STORE_FILE}")
    for result in results:
        folder = Path(result["output_dir"])
        assert "its launcher uploads it to MLflow" in (folder / "__main__.log").read_text()
        assert not result["pending_sync"] and result["tracking_error"] is None
        run_id = result["mlflow_run_id"]
        assert {a.path for a in client.list_artifacts(run_id)} == {
            "config.yaml",
            "mllog.txt",
            "result.json",
        }
        copy = json.loads(
            Path(client.download_artifacts(run_id, "result.json", str(folder.parent))).read_text()
        )
        assert copy == {**result, "mlflow_run_id": None}


def test_a_failing_cell_does_not_stop_the_sweep_and_the_sweep_exits_1(
    output_root: Path, tmp_path: Path
) -> None:
    """A cell that fails while it runs (its dataset.root exists but holds no MNIST: found only
    when torchvision reads it) is recorded, the next cell runs, the summary table says why
    the failed one failed, and the sweep's exit status says that not every cell ended ok."""
    empty = tmp_path / "empty"
    empty.mkdir()
    # Its launcher in this process, as above: its exit status, stdout and stderr are a
    # process's (tests.in_process), its cells run in processes of their own.
    done = in_process_command(
        "harness",
        [
            *TINY_SWEEP,
            "dataset=mnist",
            "dataset.source=real,synthetic",
            f"dataset.root={empty}",
            f"run.output_dir={output_root}",
        ],
        cwd=output_root.parent,
    )
    assert done.returncode == 1, done.stderr[-3000:]
    statuses = sorted(
        (r["config"]["dataset"]["source"], r["status"]) for r in _results(output_root)
    )
    assert statuses == [("real", "failed"), ("synthetic", "ok")]
    (failed,) = [r for r in _results(output_root) if r["status"] == "failed"]
    reason = failure_reason(failed["error"], width=90)
    table = done.stdout[done.stdout.index("  #  cell") :].splitlines()
    row = next(i for i, line in enumerate(table) if " failed " in line)
    assert table[row + 1].strip() == f"why: {reason}", table
    assert "Traceback" not in reason and len(reason) <= 90
    assert "1 of 2 cell(s) did not end ok" in done.stderr.strip().splitlines()[-1]
    tags = sorted(
        r.data.tags["status"]
        for r in _experiment_runs(output_root, "smoke")
        if "status" in r.data.tags
    )
    assert tags == ["failed", "ok"]


def test_an_invalid_cell_stops_the_sweep_before_any_cell_runs(output_root: Path) -> None:
    done = run_module(
        "harness",
        [*TINY_SWEEP, "dataset=mnist", "run.epochs=1,0", f"run.output_dir={output_root}"],
        cwd=output_root.parent,
    )
    assert done.returncode == 2
    assert "run.epochs=0 is invalid: must be 1 or more" in done.stderr
    assert _results(output_root) == []


@pytest.mark.skipif(shutil.which("prlimit") is None, reason="needs util-linux prlimit")
def test_a_cell_that_does_not_fit_in_memory_is_recorded_as_oom(output_root: Path) -> None:
    """A real out-of-memory: the process's address space is capped at 6 GB (prlimit), and
    VGG-16 on 512x512 images at batch 32 needs 2 GB for each early activation."""
    done = subprocess.run(
        [
            "prlimit",
            f"--as={6 * 1024**3}",
            sys.executable,
            "-m",
            "harness",
            "dataset=highres",
            "network=vgg16",
            "dataset.num_samples=32",
            "run.epochs=1",
            "run.warmup_batches=1",
            "run.progress=false",
            f"run.output_dir={output_root}",
        ],
        cwd=output_root.parent,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 1, done.stderr[-3000:]  # the cell did not end ok
    (result_path,) = (output_root / "runs").rglob("result.json")
    result = json.loads(result_path.read_text())
    assert result["status"] == "oom"
    assert "can't allocate memory" in result["error"]
    run = MlflowClient(f"sqlite:///{output_root / DEFAULT_STORE_FILE}").get_run(
        result["mlflow_run_id"]
    )
    assert run.data.tags["status"] == "oom" and run.info.status == "FAILED"


def test_a_killed_cell_is_recorded_and_the_sweep_goes_on(output_root: Path) -> None:
    """SIGKILL the first cell's process, as the kernel's OOM killer would: the launcher
    records the cell as failed and runs the next one."""
    sweep = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "harness",
            *TINY_SWEEP,
            "dataset=mnist,cifar10",
            "run.epochs=3",
            f"run.output_dir={output_root}",
        ],
        cwd=output_root.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    os.kill(_wait_for_cell_process(output_root, timeout=120), signal.SIGKILL)
    out, _ = sweep.communicate(timeout=600)
    assert sweep.returncode == 1, out[-3000:]  # one of its cells did not end ok
    by_dataset = {r["config"]["dataset"]["name"]: r for r in _results(output_root)}
    assert by_dataset["mnist"]["status"] == "failed"
    assert "killed by a signal" in by_dataset["mnist"]["error"]
    assert by_dataset["cifar10"]["status"] == "ok"


# The end of a worker's stderr where it raised while submitit unpickled its job (a launcher
# module that failed to import, seen in a calibration sweep), and of one killed mid-epoch.
_RAISED_LOG = """submitit ERROR (2026-11-30 17:57:06,886) - Submitted job triggered an exception
Traceback (most recent call last):
  File ".venv/lib/python3.11/site-packages/submitit/core/utils.py", line 232, in pickle_load
    return pickle.load(ifile)
           ^^^^^^^^^^^^^^^^^^
  File "/work/main/hydra_plugins/distbench_launcher/slurm_cells.py", line 170, in SlurmCellsLauncher
    job_ids: dict[int, str], bar: Any) -> None:
                                  ^^^
NameError: name 'Any' is not defined. Did you mean: 'any'?
"""
_KILLED_LOG = """[2026-11-30 17:55:43,654][harness.worker.run][INFO] - epoch 1/2: 9.041 s
"""


def test_a_worker_that_raised_before_it_could_report_is_named_first() -> None:
    """A cell whose workers raised before distbench's code ran records the exception in its
    first line, not the guess a killed worker gets; a log that ends anywhere else (a kill
    finds it mid-line) says nothing."""
    from launchers.cells import raised_before_reporting

    logs = f"--- worker 0 stderr (end):\n{_KILLED_LOG}--- worker 1 stderr (end):\n{_RAISED_LOG}"
    assert (
        raised_before_reporting(logs)
        == "worker 1 raised NameError: name 'Any' is not defined. Did you mean: 'any'?"
    )
    assert raised_before_reporting(f"--- worker 0 stderr (end):\n{_KILLED_LOG}") is None
    # a traceback logged earlier (a warning's, a retried step's) and the worker went on
    assert (
        raised_before_reporting(f"--- worker 0 stderr (end):\n{_RAISED_LOG}{_KILLED_LOG}") is None
    )


def _wait_for_cell_process(output_root: Path, timeout: float) -> int:
    """The pid of the first cell's worker process, as soon as it exists."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        workers = cell_worker_pids(output_root)
        if workers:
            return workers[0]
        time.sleep(0.2)
    raise AssertionError("the sweep never started a cell process")


def test_the_reason_of_a_failed_cell_is_one_line() -> None:
    """The summary table's `why:` line: a traceback's exception line, a record's first line
    (the launcher's cause sentence), cut to the width."""
    traceback = (
        'Traceback (most recent call last):\n  File "x.py", line 1, in f\n    g()\n'
        "RuntimeError: Dataset not found. You can use download=True to download it\n"
    )
    assert failure_reason(traceback) == (
        "RuntimeError: Dataset not found. You can use download=True to download it"
    )
    assert (
        failure_reason("the cell ended without a result: a worker was killed\n--- rank 0")
        == "the cell ended without a result: a worker was killed"
    )
    assert failure_reason("x" * 200, width=40) == "x" * 37 + "..."
    assert failure_reason(None) == "no error recorded"
