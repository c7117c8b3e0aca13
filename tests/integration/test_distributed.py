"""Cells on several worker processes (gloo on the CPU): DDP, and workers that crash or hang."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

import pytest
from mlflow.tracking import MlflowClient

from harness.records.eventlog import MLLOG_FILE
from harness.records.mlflow_store import DEFAULT_STORE_FILE
from tests.helpers import cell_worker_pids
from tests.integration.test_repro import read_mllog
from tests.unit.harness.records.test_eventlog import assert_compliant

TWO_WORKER_CELL = [
    "hardware=local_2cpu",
    "network=mobilenetv2",
    "dataset=mnist",
    "distribution.batch_size=8",
    "run.progress=false",
]


def _start(
    output_root: Path, *overrides: str, stdout: IO[str] | int = subprocess.PIPE
) -> subprocess.Popen[str]:
    """A 2-worker DDP cell, started as a user would (`python -m harness ...`)."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "harness",
            *TWO_WORKER_CELL,
            "distribution=ddp",
            *overrides,
            f"run.output_dir={output_root}",
        ],
        cwd=output_root.parent,
        stdout=stdout,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _result(output_root: Path) -> dict:
    (path,) = (output_root / "runs").glob("*/result.json")
    return json.loads(path.read_text())


# A cell that trains until the test ends it: short epochs (2 batches per worker), so that the
# first "epoch 1/" line, which _wait_for_training waits for, comes soon, and many of them.
LONG_RUNNING = ["dataset.num_samples=32", "run.epochs=800"]


def _wait_for_training(output_root: Path, timeout: float = 300) -> dict[int, int]:
    """The workers' pids, once both have trained a batch (their log says an epoch ended)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        logs = list((output_root / "runs").glob("*/.submitit/*/*_0_log.err"))
        if logs and "epoch 1/" in logs[0].read_text():
            workers = cell_worker_pids(output_root)
            if len(workers) == 2:
                return workers
        time.sleep(0.2)
    raise AssertionError("the 2-worker cell never started training")


def test_two_ddp_workers_train_in_sync_and_record_the_cell(output_root: Path) -> None:
    done = _start(output_root, "dataset.num_samples=64", "run.epochs=2", "run.warmup_batches=1")
    out, _ = done.communicate(timeout=600)
    assert done.returncode == 0, out[-3000:]
    result = _result(output_root)
    assert result["status"] == "ok", result["error"]
    metrics = result["metrics"]
    assert metrics["world_size"] == 2
    assert metrics["replicas_in_sync"] == 1.0  # identical weights on both replicas after training
    assert metrics["samples_per_epoch"] == 64  # 2 workers x 4 batches x 8
    assert metrics["batches_per_epoch"] == 4
    assert metrics["peak_memory_mb_rank0"] > 0 and metrics["peak_memory_mb_rank1"] > 0
    assert metrics["peak_memory_mb"] == max(
        metrics["peak_memory_mb_rank0"], metrics["peak_memory_mb_rank1"]
    )
    # Waiting for the allreduces is measured, and is part of the batch, not extra time.
    assert 0 < metrics["comm_wait_seconds_per_epoch"] < metrics["seconds_per_epoch"]
    run = MlflowClient(f"sqlite:///{output_root / DEFAULT_STORE_FILE}").get_run(
        result["mlflow_run_id"]
    )
    assert run.data.params["distribution.name"] == "ddp"
    assert run.data.metrics["world_size"] == 2
    assert not cell_worker_pids(output_root)
    # One event log for the cell, from rank 0 alone: each event once.
    (mllog,) = (output_root / "runs").rglob("mllog*")  # (MLflow keeps a copy elsewhere)
    assert mllog == Path(result["output_dir"]) / MLLOG_FILE
    lines = read_mllog(mllog)
    assert [line.key for line in lines].count("init_start") == 1
    assert [
        (line.key, line.value["metadata"]["epoch_num"])
        for line in lines
        if line.key in ("epoch_start", "epoch_stop")
    ] == [("epoch_start", 1), ("epoch_stop", 1), ("epoch_start", 2), ("epoch_stop", 2)]
    facts = {line.key: line.value["value"] for line in lines}
    assert facts["world_size"] == 2 and facts["global_batch_size"] == 16  # 2 workers x 8
    assert facts["data_parallelism"] == 2 and facts["micro_batch_size"] == 8
    assert_compliant(mllog.parent)  # MLPerf's checker passes it


def test_a_crashing_worker_ends_the_cell_as_failed(output_root: Path) -> None:
    cell = _start(output_root, *LONG_RUNNING, "run.progress_timeout_s=60")
    try:
        workers = _wait_for_training(output_root)
        os.kill(workers[1], signal.SIGKILL)
        out, _ = cell.communicate(timeout=300)
    finally:  # a failing test must not leave its cell training
        cell.kill()
    assert cell.returncode in (0, 1), out[-3000:]  # 1: a cell did not end ok
    result = _result(output_root)
    assert result["status"] == "failed"
    assert "rank 1: no report" in result["error"]
    assert not cell_worker_pids(output_root)


def test_a_hanging_worker_ends_the_cell_as_timeout(output_root: Path, tmp_path: Path) -> None:
    """A worker frozen by SIGSTOP acts on no signal but SIGKILL (its watchdog is frozen too):
    the launcher must end it whatever SIGINT disposition the test runs under (submitit's
    cancel alone, a SIGINT, did nothing when the suite ran with SIGINT ignored, e.g. under
    `nohup ... &`; the frozen worker and submitit's controller then outlived the cell, and the
    controller held this test's stdout pipe open, so communicate() never returned)."""
    log = tmp_path / "cell.log"
    with log.open("w") as out:  # a file: a process left behind cannot block the test
        # The frozen worker is ended 1 s after rank 0 recorded the cell (20 s by default);
        # rank 0 gives up on it after 5 s without progress, as in the test below.
        cell = _start(
            output_root,
            *LONG_RUNNING,
            "run.progress_timeout_s=5",
            "hydra.launcher.grace_after_result_s=1",
            stdout=out,
        )
    try:
        workers = _wait_for_training(output_root)
        os.kill(workers[1], signal.SIGSTOP)  # frozen: alive, holding its sockets, doing nothing
        cell.wait(timeout=300)
        # Exit status 1: the cell did not end ok.
        assert cell.returncode in (0, 1), log.read_text()[-3000:]
        result = _result(output_root)
        assert result["status"] == "timeout", result["error"]
        assert not cell_worker_pids(output_root)  # the frozen worker was ended too: no orphans
    finally:
        cell.kill()
        for pid in cell_worker_pids(output_root).values():
            os.kill(pid, signal.SIGKILL)


def test_a_worker_killed_before_the_process_group_forms_ends_its_cell_at_once(
    output_root: Path, tmp_path: Path
) -> None:
    """A worker killed as it starts would leave its peers waiting for it at the rendezvous
    until their watchdog gives up (run.progress_timeout_s, 10 min here): the launcher says at
    once which worker is gone and how, ends the others (nothing was measured yet) and records
    the cell as failed, naming the worker; no process is left."""
    log = tmp_path / "cell.log"
    with log.open("w") as out:
        cell = _start(
            output_root, "dataset.num_samples=32", "run.progress_timeout_s=600", stdout=out
        )
    try:
        deadline = time.monotonic() + 120
        while 1 not in (workers := cell_worker_pids(output_root)):
            assert time.monotonic() < deadline and cell.poll() is None, log.read_text()[-3000:]
            time.sleep(0.05)
        os.kill(workers[1], signal.SIGKILL)
        killed_at = time.monotonic()
        said = f"[distbench] worker 1 (pid {workers[1]}) was killed by SIGKILL (its log: "
        while said not in log.read_text() and time.monotonic() < killed_at + 60:
            time.sleep(0.1)
        assert said in log.read_text(), log.read_text()[-3000:]
        assert time.monotonic() - killed_at < 10  # a poll of the launcher
        assert "before the cell's process group formed" in log.read_text()
        cell.wait(timeout=120)  # the end of the cell's processes (SIGINT, SIGTERM, SIGKILL)
        assert cell.returncode == 1, log.read_text()[-3000:]
        result = _result(output_root)
        assert result["status"] == "failed"
        first = result["error"].splitlines()[0]
        assert first.startswith(f"worker 1 (pid {workers[1]}) was killed by SIGKILL"), first
        assert first.endswith(
            "before the cell's process group formed, and the other workers were ended: "
            "nothing was measured"
        ), first
        assert not cell_worker_pids(output_root)
    finally:
        cell.kill()
        for pid in cell_worker_pids(output_root).values():
            os.kill(pid, signal.SIGKILL)


def test_two_horovod_workers_train_in_sync_without_horovodrun(output_root: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness",
            *TWO_WORKER_CELL,
            "distribution=horovod",
            "distribution.fusion_threshold_mb=32",
            "dataset.num_samples=64",
            "run.epochs=2",
            "run.warmup_batches=1",
            f"run.output_dir={output_root}",
        ],
        cwd=output_root.parent,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = _result(output_root)
    assert result["status"] == "ok", result["error"]
    metrics = result["metrics"]
    assert metrics["world_size"] == 2 and metrics["replicas_in_sync"] == 1.0
    assert metrics["samples_per_epoch"] == 64
    assert 0 < metrics["comm_wait_seconds_per_epoch"] < metrics["seconds_per_epoch"]
    assert result["config"]["distribution"]["name"] == "horovod"
    assert result["config"]["distribution"]["fusion_threshold_mb"] == 32
    assert not cell_worker_pids(output_root)
    assert_compliant(Path(result["output_dir"]))  # its MLPerf log passes MLPerf's checker


# Loaded at start-up by every Python process that has its folder on PYTHONPATH; it acts only in
# the worker of rank 1 (submitit's local rank variable), whose optimizer step it turns into the
# fault after a few real steps, so the fault strikes mid-training in a real worker process.
_FAULT_HOOK = """
import os
if os.environ.get("SUBMITIT_LOCAL_GLOBALID") == "1" and os.environ.get("DISTBENCH_TEST_FAULT"):
    import time
    import torch
    real_step, steps = torch.optim.SGD.step, []

    def step(self, *args, **kwargs):
        steps.append(1)
        if len(steps) > 3:
            if os.environ["DISTBENCH_TEST_FAULT"] == "raise":
                raise RuntimeError("injected fault: rank 1 raised")
            time.sleep(3600)  # "hang": alive and responsive to signals, making no progress
        return real_step(self, *args, **kwargs)

    torch.optim.SGD.step = step
"""


@pytest.mark.parametrize("fault, status", [("raise", "failed"), ("hang", "timeout")])
def test_a_worker_that_raises_or_hangs_mid_training_ends_its_cell(
    output_root: Path, tmp_path: Path, fault: str, status: str
) -> None:
    """Rank 1 raises (its report names the error; rank 0's allreduce breaks), or sleeps
    inside a step (rank 0's allreduce times out after run.progress_timeout_s; rank 1's own
    watchdog ends it after 1.25x that + 5 s). Either way the cell is recorded and no worker
    process is left."""
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(_FAULT_HOOK)
    path = os.pathsep.join([str(hooks), *filter(None, [os.environ.get("PYTHONPATH")])])
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness",
            *TWO_WORKER_CELL,
            "distribution=ddp",
            "dataset.num_samples=256",
            "run.epochs=5",
            "run.warmup_batches=0",
            "run.progress_timeout_s=5",
            f"run.output_dir={output_root}",
        ],
        cwd=output_root.parent,
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, PYTHONPATH=path, DISTBENCH_TEST_FAULT=fault),
    )
    assert done.returncode in (0, 1), done.stderr[-3000:]  # 1: a cell did not end ok
    result = _result(output_root)
    assert result["status"] == status, result["error"]
    if fault == "raise":
        assert "--- rank 1: failed" in result["error"]
        assert "RuntimeError: injected fault: rank 1 raised" in result["error"]
    else:
        # Rank 1 was ended by its own watchdog, which left its stacks in its report.
        report = json.loads((Path(result["output_dir"]) / "ranks" / "rank1.json").read_text())
        assert report["status"] == "timeout" and "no progress for" in report["error"]
        assert "time.sleep(3600)" in report["error"]
    assert not cell_worker_pids(output_root)
