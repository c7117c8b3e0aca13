"""A disk that fills up or turns read-only in the middle of a cell: the measurement still
reaches a store that takes it (MLflow, else a rescue directory), the command says so in one
line and exits 1, and no empty or partial file is left (harness.records.record).

The disk is real: a small tmpfs mounted for the test, filled, or covered by a read-only bind
mount of itself, from inside the cell's own process after its third training step (the test's
process, which runs a one-worker cell's command by its entry point; a sweep's worker loads it
from a sitecustomize hook, as in tests/integration/test_distributed.py). Mounting needs root or
CAP_SYS_ADMIN; where the test may not mount, it is skipped and says why (no other way to make a real
full or read-only file system).
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import tiny_overrides
from tests.in_process import in_process_command


# The fault: at the cell's third training step, its disk fills up or turns read-only. In the
# cell's own process: a one-worker cell trains in the process of `python -m harness`, run in
# the test's process (_fail_disk_here); a sweep's cell trains in a worker process of its own,
# which loads the same function's source at start-up (_DISK_FAULT_HOOK, a sitecustomize).
def fail_disk_at_third_step(fault: str, disk: str, patch: Callable = setattr) -> None:
    import os
    import subprocess

    import torch

    real_step = torch.optim.SGD.step
    steps = [0]

    def step(self: Any, *args: Any, **kwargs: Any) -> Any:
        steps[0] += 1
        if steps[0] == 3:
            if fault == "full":
                with open(os.path.join(disk, "filler"), "wb") as filler:
                    try:
                        while True:
                            filler.write(b"x" * 65536)
                            filler.flush()
                    except OSError:
                        pass
            else:  # a read-only mount over it: files already open stay writable, as on NFS
                subprocess.run(["mount", "--bind", "-o", "ro", disk, disk], check=True)
        return real_step(self, *args, **kwargs)

    patch(torch.optim.SGD, "step", step)


_DISK_FAULT_HOOK = f"""
import os
from typing import Any, Callable

{inspect.getsource(fail_disk_at_third_step)}

if os.environ.get("DISTBENCH_TEST_DISK_FAULT"):
    fail_disk_at_third_step(
        os.environ["DISTBENCH_TEST_DISK_FAULT"], os.environ["DISTBENCH_TEST_DISK"]
    )
"""


def _fail_disk_here(monkeypatch: pytest.MonkeyPatch, disk: Path, fault: str) -> None:
    """The fault in this process, undone after the test."""
    fail_disk_at_third_step(fault, str(disk), monkeypatch.setattr)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 4 MB file system of its own (tmpfs), unmounted afterwards."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(
            f"cannot mount a tmpfs here ({mounted.stderr.strip()}): a real full or "
            f"read-only disk needs root or CAP_SYS_ADMIN"
        )
    try:
        yield disk
    finally:  # the tmpfs, and the read-only mount over it if the test made one
        while subprocess.run(["umount", "-l", str(disk)], capture_output=True).returncode == 0:
            pass


_CELL = ("dataset.num_samples=64", "run.epochs=2")


def _run_faulty_cell(
    tmp_path: Path, disk: Path, fault: str, monkeypatch: pytest.MonkeyPatch, *extra: str
) -> subprocess.CompletedProcess[str]:
    """`python -m harness` on a one-worker cell whose disk fails mid-cell: its real entry point
    in this process (what it records and answers is under test, not its process; the cell
    trains here), with the system's temporary directory (where a rescued record goes) in the
    test's own folder, as TMPDIR sets it for a new process."""
    rescue_tmp = tmp_path / "tmp"
    rescue_tmp.mkdir(exist_ok=True)
    monkeypatch.setenv("TMPDIR", str(rescue_tmp))
    monkeypatch.setattr(tempfile, "tempdir", str(rescue_tmp))  # read once per process
    _fail_disk_here(monkeypatch, disk, fault)
    return in_process_command(
        "harness", [*tiny_overrides(disk / "outputs", *_CELL), *extra], cwd=tmp_path
    )


def _run_faulty_sweep(
    tmp_path: Path, disk: Path, fault: str, *extra: str
) -> subprocess.CompletedProcess[str]:
    """`python -m harness -m` on that cell, as a user runs it: its cell's worker, a process of
    its own, loads the fault at start-up."""
    hooks = tmp_path / "hooks"
    hooks.mkdir(exist_ok=True)
    (hooks / "sitecustomize.py").write_text(_DISK_FAULT_HOOK)
    rescue_tmp = tmp_path / "tmp"
    rescue_tmp.mkdir(exist_ok=True)
    env = dict(
        os.environ,
        PYTHONUNBUFFERED="1",
        DISTBENCH_TEST_DISK_FAULT=fault,
        DISTBENCH_TEST_DISK=str(disk),
        TMPDIR=str(rescue_tmp),
        PYTHONPATH=os.pathsep.join([str(hooks), *filter(None, [os.environ.get("PYTHONPATH")])]),
    )
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "harness",
            "-m",
            *tiny_overrides(disk / "outputs", *_CELL),
            *extra,
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("distbench:")]
    assert len(errors) == 1, done.stderr[-3000:]
    return errors[0]


def _no_empty_files(disk: Path) -> None:
    for path in disk.rglob("*"):
        if path.is_file() and path.name in ("config.yaml", "result.json"):
            assert path.stat().st_size > 0, path


def _mlflow_runs(store: Path) -> list:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{store}")
    experiments = client.search_experiments()
    return client.search_runs([e.experiment_id for e in experiments])


@pytest.mark.parametrize("fault", ["full", "read-only"])
def test_a_disk_failing_mid_cell_loses_nothing(
    tmp_path: Path, small_disk: Path, fault: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = tmp_path / "store" / "mlflow.db"  # on another file system than the outputs
    done = _run_faulty_cell(
        tmp_path, small_disk, fault, monkeypatch, f"tracking.uri=sqlite:///{store}"
    )
    assert done.returncode == 1, done.stderr[-3000:]
    line = _one_error_line(done)
    assert "could not write" in line and "the result is in MLflow run" in line, line
    (run,) = _mlflow_runs(store)
    assert run.data.tags["status"] == "ok" and run.data.metrics["seconds_per_epoch"] > 0
    assert run.info.run_id in line
    from mlflow.tracking import MlflowClient

    artifacts = {a.path for a in MlflowClient(f"sqlite:///{store}").list_artifacts(run.info.run_id)}
    assert {"result.json", "config.yaml", "mllog.txt"} <= artifacts
    _no_empty_files(small_disk)


def test_a_full_disk_and_no_mlflow_leave_the_result_in_a_rescue_directory(
    tmp_path: Path, small_disk: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    done = _run_faulty_cell(
        tmp_path, small_disk, "full", monkeypatch, "tracking.uri=http://127.0.0.1:9"
    )
    assert done.returncode == 1, done.stderr[-3000:]
    line = _one_error_line(done)
    rescued = Path(line.split("the result is in ")[1].split(";")[0])
    assert rescued.is_relative_to(tmp_path / "tmp"), line
    result = json.loads(rescued.read_text())
    assert result["status"] == "ok" and result["pending_sync"] and result["storage_error"]
    assert (rescued.parent / "mllog.txt").read_text().count(":::MLLOG") > 5
    # What the line says to run uploads it (its real entry point, in this process).
    store = tmp_path / "store" / "mlflow.db"
    synced = in_process_command(
        "harness.sync",
        [f"run.output_dir={rescued.parents[1]}", f"tracking.uri=sqlite:///{store}"],
        cwd=tmp_path,
    )
    assert synced.returncode == 0, synced.stderr[-3000:]
    (run,) = _mlflow_runs(store)
    assert run.data.tags["status"] == "ok"
    _no_empty_files(small_disk)


def test_a_sweep_whose_disk_fills_mid_cell_finds_the_record_in_mlflow(
    tmp_path: Path, small_disk: Path
) -> None:
    """In a sweep, rank 0 runs in a worker whose own log is on the full disk; the launcher
    cannot read the record from the cell's directory and finds it in MLflow instead of
    recording the cell again as failed."""
    store = tmp_path / "store" / "mlflow.db"
    done = _run_faulty_sweep(tmp_path, small_disk, "full", f"tracking.uri=sqlite:///{store}")
    assert done.returncode == 1, done.stderr[-3000:]
    line = _one_error_line(done)
    cells = [run for run in _mlflow_runs(store) if "status" in run.data.tags]
    (cell,) = cells  # no second, failed record beside it
    assert cell.data.tags["status"] == "ok" and cell.data.metrics["seconds_per_epoch"] > 0
    assert f"ok, recorded only in MLflow run {cell.info.run_id}" in line, line
    assert "No space left on device" in line, line
    assert " ok " in done.stdout  # the sweep's table shows the cell as measured
    _no_empty_files(small_disk)
