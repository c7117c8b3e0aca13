"""Runs that must not be lost or mis-recorded: a diverged loss, an interrupted cell, runs and sweeps
that start at the same time. Through real processes and signals, as
tests/faults/test_cells_that_hang_or_crash.py does, where the process is the behaviour."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from mlflow.tracking import MlflowClient

from harness.records.mlflow_store import DEFAULT_STORE_FILE
from harness.records.resume import finished_result
from launchers.sweep_lock import lock_path
from tests.helpers import tiny_overrides
from tests.in_process import in_process_command


def _only_result(output_root: Path) -> dict:
    (path,) = (output_root / "runs").glob("*/result.json")
    return json.loads(path.read_text())


def _nan_from_the_third_loss(monkeypatch: pytest.MonkeyPatch) -> None:
    """From the 3rd training step on, the loss is NaN, as a diverging training's becomes (its
    gradients, then its weights, turn NaN with it): torch's cross entropy, patched in this
    process, where a one-worker cell run by its entry point here trains."""
    import torch.nn.functional as functional

    real_cross_entropy, calls = functional.cross_entropy, []

    def cross_entropy(*args: object, **kwargs: object) -> object:
        calls.append(1)
        loss = real_cross_entropy(*args, **kwargs)
        return loss * float("nan") if len(calls) > 2 else loss

    monkeypatch.setattr(functional, "cross_entropy", cross_entropy)


def test_a_diverged_loss_is_recorded_diverged_and_run_again(
    output_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A loss that turns NaN stops the cell at the first epoch that shows it: recorded
    `diverged` (where, and the value), exit status 1, and not skipped on resume."""
    _nan_from_the_third_loss(monkeypatch)
    # What the command records and answers is under test, not its process: `python -m harness`
    # through its real entry point, in this process (the cell's only worker is this process).
    done = in_process_command("harness", tiny_overrides(output_root), cwd=output_root.parent)
    assert done.returncode == 1, done.stderr[-3000:]
    assert "diverged" in done.stderr and "Traceback" not in done.stderr
    result = _only_result(output_root)
    assert result["status"] == "diverged"
    assert "epoch 1/2" in result["error"] and "not finite" in result["error"]
    run = MlflowClient(f"sqlite:///{output_root / DEFAULT_STORE_FILE}").get_run(
        result["mlflow_run_id"]
    )
    assert run.data.tags["status"] == "diverged"
    assert finished_result(output_root, result["cell_key"]) is None


def test_an_evaluation_that_is_not_finite_after_finite_training_names_the_forward_batch(
    output_root: Path,
) -> None:
    """torchvision's EfficientNet-B0 trained on forward passes of 2 CIFAR-10 samples evaluates
    to NaN (its BatchNorm's running statistics; its training losses are finite): recorded
    `diverged`, and the error names the forward pass's samples and what to change, not only
    the learning rate (found by the open-networks benchmark:
    docs/benchmarks/2026-11-25-transformers-and-open-networks.md, "Run again; EfficientNet-B0's
    GPipe cell had been recorded `diverged` (2026-12-01)")."""
    # Its record is under test, not its process: the command's entry point, in this process.
    # 8 samples (4 training steps) already leave running statistics that evaluate to NaN.
    done = in_process_command(
        "harness",
        [
            "network=torchvision",
            "network.arch=efficientnet_b0",
            "dataset=cifar10",
            "dataset.num_samples=8",
            "distribution.batch_size=2",
            "run.epochs=1",
            "run.warmup_batches=1",
            "run.progress=false",
            f"run.output_dir={output_root}",
        ],
        cwd=output_root.parent,
    )
    assert done.returncode == 1, done.stderr[-3000:]
    result = _only_result(output_root)
    assert result["status"] == "diverged", result["error"]
    assert result["error"].startswith(
        "eval loss nan after epoch 1/1: not finite, though every training loss of the epoch was"
    )
    assert "forward passes of 2 sample(s)" in result["error"]
    assert "distribution.batch_size" in result["error"] and "run.eval=false" in result["error"]


def test_only_a_network_that_keeps_running_statistics_is_told_about_them() -> None:
    """A network without BatchNorm (a transformer's LayerNorm normalises by each sample's own
    statistics in either mode) is not sent to its batch size: the error says what is known."""
    from torch import nn

    from harness.worker.divergence import (
        DivergedError,
        check_finite_eval_loss,
        keeps_running_statistics,
    )

    assert keeps_running_statistics(nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)))
    assert not keeps_running_statistics(nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4)))
    assert not keeps_running_statistics(nn.BatchNorm2d(4, track_running_stats=False))
    layer_normed = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))
    check_finite_eval_loss(0.5, "epoch 1/1", 2, layer_normed)  # finite: passes
    with pytest.raises(DivergedError) as raised:
        check_finite_eval_loss(float("inf"), "epoch 1/1", 2, layer_normed)
    message = str(raised.value)
    assert message.startswith("eval loss inf after epoch 1/1: not finite, though every training")
    assert "BatchNorm" not in message and "run.eval=false" in message


@pytest.mark.parametrize(
    ("signum", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["SIGINT", "SIGTERM"]
)
def test_an_interrupted_single_process_cell_keeps_its_measured_epochs(
    output_root: Path, tmp_path: Path, signum: int, status: int
) -> None:
    """Ctrl-C or `kill` after the first timed epoch: the cell is recorded `interrupted` with
    that epoch (result.json and an MLflow run), one line says so (no traceback), no child
    process is left, and the exit status is the signal's (130, 143)."""
    children, text = _interrupted_after_the_first_epoch(
        ["harness", *tiny_overrides(output_root, "run.epochs=40", "run.warmup_batches=0")],
        output_root,
        tmp_path / "cell.log",
        signum,
        status,
    )
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text[-3000:]
    # its first line comes before torch loads: no silent wait while the cell starts
    assert text.splitlines()[0].startswith("[distbench] sequential 1x1"), text[:1000]
    assert ": starting in " in text.splitlines()[0]
    (line,) = [line for line in text.splitlines() if line.startswith("distbench: ")]
    assert f"interrupted by {signal.Signals(signum).name}" in line
    result = _only_result(output_root)
    assert result["status"] == "interrupted" and not result["pending_sync"]
    assert 1 <= len(result["epoch_seconds"]) < 40
    assert result["metrics"]["seconds_per_epoch"] > 0
    run = MlflowClient(f"sqlite:///{output_root / DEFAULT_STORE_FILE}").get_run(
        result["mlflow_run_id"]
    )
    assert run.data.tags["status"] == "interrupted"
    assert not [child for child in children if child.is_running()]
    assert finished_result(output_root, result["cell_key"]) is None


@pytest.mark.parametrize(
    ("signum", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["SIGINT", "SIGTERM"]
)
def test_an_interrupted_sweep_keeps_its_running_cells_measured_epochs(
    output_root: Path, tmp_path: Path, signum: int, status: int
) -> None:
    """Ctrl-C or `kill` of a sweep after its first cell's first timed epoch: that cell is
    recorded `interrupted` with the epoch (result.json and its MLflow run), the sweep's parent
    run KILLED, its summary counting the cell interrupted, one line says so (no traceback), no
    process of the cell is left, and the exit status is the signal's."""
    cell, text = _interrupted_after_the_first_epoch(
        [
            "harness",
            "-m",
            *tiny_overrides(output_root, "run.epochs=40", "run.warmup_batches=0"),
            "distribution=sequential,ddp",
        ],
        output_root,
        tmp_path / "sweep.log",
        signum,
        status,
    )
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text[-3000:]
    said = f"recorded as interrupted: interrupted by {signal.Signals(signum).name} after"
    assert said in text, text[-3000:]
    (path,) = (output_root / "sweeps").glob("*/*/*/result.json")
    result = json.loads(path.read_text())
    assert result["status"] == "interrupted" and not result["pending_sync"], result["error"]
    assert 1 <= len(result["epoch_seconds"]) < 40
    client = MlflowClient(f"sqlite:///{output_root / DEFAULT_STORE_FILE}")
    assert client.get_run(result["mlflow_run_id"]).data.tags["status"] == "interrupted"
    (parent,) = [
        run
        for run in client.search_runs(client.search_experiments()[0].experiment_id.split())
        if run.data.tags.get("distbench.kind") == "sweep"
    ]
    assert parent.info.status == "KILLED"
    # the parent's summary counts the cell, interrupted, not failed
    assert parent.data.metrics["cells_interrupted"] == 1
    assert parent.data.metrics["cells_failed"] == 0
    assert "0 failed, 1 interrupted" in parent.data.tags["mlflow.note.content"]
    assert all(_ends_within(process, 10) for process in cell)


def _interrupted_after_the_first_epoch(
    module_and_args: list[str], output_root: Path, log: Path, signum: int, status: int
) -> tuple[list[psutil.Process], str]:
    """Run `python -m <module> <args>` until its first timed epoch of 40 is logged, send it
    `signum`, check that it exits with `status`; its child processes as they were when it was
    signalled, and what it printed."""
    with log.open("w") as out:
        command = subprocess.Popen(
            [sys.executable, "-m", *module_and_args],
            cwd=output_root.parent,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
            # As from a terminal: a pytest started in the background of a non-interactive
            # shell ignores SIGINT, and its children would inherit that.
            preexec_fn=_default_sigint,
        )
        try:
            deadline = time.monotonic() + 180
            while "epoch 1/40:" not in log.read_text() and time.monotonic() < deadline:
                assert command.poll() is None, log.read_text()[-3000:]
                time.sleep(0.05)
            children = psutil.Process(command.pid).children(recursive=True)
            command.send_signal(signum)
            assert command.wait(timeout=90) == status, log.read_text()[-3000:]
        finally:
            command.kill()
    return children, log.read_text()


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _ends_within(process: psutil.Process, seconds: float) -> bool:
    """Whether `process` ends (a zombie counts: whoever adopted it may reap it late) within
    `seconds`; the probe itself runs for several seconds."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if process.status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


_PROBING_COMMAND = """
import sys
from harness.commands.compose import compose_config
from harness.config.schema import validate
from harness.worker.runtime_memory import measure_runtime_mb
measure_runtime_mb(validate(compose_config(sys.argv[1:])))
"""


def test_a_command_ended_by_sigterm_leaves_no_memory_probe_running(output_root: Path) -> None:
    """harness.recommend and harness.analysis measure a worker's runtime memory in a child
    process (harness.worker.runtime_memory); SIGTERM of the command must end that child too."""
    command = subprocess.Popen(
        [sys.executable, "-c", _PROBING_COMMAND, *tiny_overrides(output_root)],
        cwd=output_root.parent,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    probe = None
    try:
        deadline = time.monotonic() + 120
        while probe is None and time.monotonic() < deadline:
            assert command.poll() is None, "the command ended before its probe started"
            probe = next(
                (
                    child
                    for child in psutil.Process(command.pid).children()
                    if "harness.worker.runtime_memory" in " ".join(child.cmdline())
                ),
                None,
            )
            time.sleep(0.05)
        assert probe is not None
        command.send_signal(signal.SIGTERM)
        command.wait(timeout=30)
        assert _ends_within(probe, 1.0), f"the probe {probe.pid} outlived its command"
    finally:
        command.kill()
        if probe is not None and probe.is_running():
            probe.kill()


def test_a_runtime_probe_started_beside_other_work_ends_when_that_work_fails(
    output_root: Path,
) -> None:
    """The recommender starts the runtime memory probe while it describes the network
    (harness.predict.facts.gather.gather); a failure there must not leave the probe running."""
    from harness.commands.compose import compose_config
    from harness.config.schema import validate
    from harness.predict.facts.cache import cache_for
    from harness.predict.facts.gather import _runtime_measured_meanwhile
    from harness.worker.measurements import WorkerMeasurements

    config = validate(compose_config(tiny_overrides(output_root)))
    cache = cache_for(1, measurements=WorkerMeasurements())
    with (
        pytest.raises(RuntimeError, match="describing failed"),
        _runtime_measured_meanwhile(config, cache),
    ):
        (probe,) = [
            child
            for child in psutil.Process().children()
            if "harness.worker.runtime_memory" in " ".join(child.cmdline())
        ]
        raise RuntimeError("describing failed")
    assert cache.runtime == {} and _ends_within(probe, 1.0)


_FIRST_STORE_USE = """
import sys, time
from pathlib import Path
from harness.records.mlflow_store import open_store, experiment_id
from mlflow.tracking import MlflowClient  # imported before the barrier: its import is slow
barrier, me, uri = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
(barrier / me).touch()
while len(list(barrier.iterdir())) < 2:
    time.sleep(0.001)
client = open_store(uri)
client.create_run(experiment_id(client, "race", uri), run_name=me)
"""


def test_two_processes_creating_one_new_mlflow_store_both_record(tmp_path: Path) -> None:
    """Two processes that open the same new SQLite store at the same moment (two runs into
    one fresh run.output_dir): its creation and migration happen once, both runs land."""
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    uri = f"sqlite:///{tmp_path / DEFAULT_STORE_FILE}"
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", _FIRST_STORE_USE, str(barrier), f"p{n}", uri],
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(2)
    ]
    errors = [process.communicate(timeout=120)[1] for process in processes]
    assert [process.returncode for process in processes] == [0, 0], errors
    experiment = MlflowClient(uri).get_experiment_by_name("race")
    runs = MlflowClient(uri).search_runs([experiment.experiment_id])
    assert sorted(run.info.run_name for run in runs) == ["p0", "p1"]


def test_runs_started_in_the_same_second_get_their_own_directories() -> None:
    """Every run composes its own directory name from the time it starts, to the
    microsecond (conf/config.yaml `hydra.run.dir`): two runs started in the same second by
    two processes (two seeds into one run.output_dir) do not share one, and the names still
    sort by start time."""
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    from harness.commands.compose import CONFIG_MODULE
    from harness.distributions.registry import register_configs

    register_configs()
    with initialize_config_module(config_module=CONFIG_MODULE, version_base="1.3"):
        first, second = (
            OmegaConf.select(
                compose("config", return_hydra_config=True, overrides=[f"run.seed={seed}"]),
                "hydra.run.dir",
            )
            for seed in (1, 2)
        )
    assert first != second and first < second
    assert Path(first).name.startswith(Path(second).name[:10])  # the date leads


def test_a_second_sweep_into_the_directory_of_a_live_sweep_is_refused(
    output_root: Path, tmp_path: Path
) -> None:
    """Two copies of one `-m` sweep into one run.output_dir would share its cell index and time
    each other's cells: while the first lives, the second is refused in one line naming it,
    exit status 2, before it starts anything."""
    sweep = [
        sys.executable,
        "-m",
        "harness",
        "-m",
        "run.seed=1,2",
        *tiny_overrides(output_root, "run.epochs=40"),
    ]
    with (tmp_path / "first.log").open("w") as out:
        first = subprocess.Popen(
            sweep, cwd=output_root.parent, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        lock = lock_path(output_root)
        deadline = time.monotonic() + 120
        while not (lock.exists() and str(first.pid) in lock.read_text()):
            assert first.poll() is None and time.monotonic() < deadline, (
                tmp_path / "first.log"
            ).read_text()[-3000:]
            time.sleep(0.05)
        second = subprocess.run(
            sweep, cwd=output_root.parent, capture_output=True, text=True, timeout=120
        )
        assert second.returncode == 2, second.stderr[-3000:]
        (line,) = second.stderr.splitlines()
        assert "a live sweep is using it" in line and f"pid {first.pid}" in line
        assert first.poll() is None  # the first goes on
    finally:
        first.send_signal(signal.SIGTERM)
        first.wait(timeout=60)
