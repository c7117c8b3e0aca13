"""What a user sees on the terminal: a multi-worker cell's progress and result summary (rank 0's,
relayed by the launcher), epochs counted from 1 by the bar as by the log, and a re-run sweep
with nothing left to run saying so in one line.

One 2-worker DDP cell (`python -m harness`, as a user types it) is run once per module; the
sweep test re-runs the same cell as a one-cell sweep, which finds it already measured."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from harness.config import RunConfig
from harness.run import epoch_label
from launchers.local import _GrowingOutput, recorded
from tests.helpers import run_module, tiny_overrides

# run.progress=true: the bar is what is tested (tiny_overrides turns it off).
DDP_CELL = ["distribution=ddp", "hardware=local_2cpu", "run.warmup_batches=0",
            "tracking.enabled=false"]
BAR_FRAME = re.compile(r"(?:repeat \d+/\d+, )?epoch (\d+)/(\d+): +\d+%\|")


@pytest.fixture(scope="module")
def ddp_cell(tmp_path_factory: pytest.TempPathFactory
             ) -> tuple[subprocess.CompletedProcess[str], dict, Path]:
    """The finished 2-worker cell: its terminal output, its result.json, its output root."""
    output_root = tmp_path_factory.mktemp("terminal") / "outputs"
    output_root.mkdir()
    done = run_module("harness", [*tiny_overrides(output_root, *DDP_CELL), "run.progress=true"],
                      cwd=output_root.parent, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    (path,) = (output_root / "runs").glob("*/result.json")
    return done, json.loads(path.read_text()), output_root


def test_a_two_worker_cell_shows_rank0s_epochs_and_result_summary(ddp_cell) -> None:
    done, result, _ = ddp_cell
    assert result["status"] == "ok", result["error"]
    terminal = done.stdout + done.stderr
    # Rank 0's own epoch lines (its seconds; the record's are the slowest worker's).
    assert re.findall(r"\]\[harness\.run\]\[INFO\] - (epoch \d/2): [\d.]+ s \(8 images\)",
                      terminal) == ["epoch 1/2", "epoch 2/2"], terminal[-3000:]
    metrics = result["metrics"]
    assert (f"{result['run_name']}: {metrics['seconds_per_epoch']:.3f} s/epoch (median "
            f"{metrics['seconds_per_epoch_median']:.3f}, std "
            f"{metrics['seconds_per_epoch_std']:.3f}), {metrics['images_per_second']:.1f} "
            f"images/s, peak memory {metrics['peak_memory_mb']:.0f} MB") in terminal
    assert f"result: {result['output_dir']}/result.json; MLflow run off" in terminal
    assert "submitit" not in terminal  # the launcher's bookkeeping stays in the worker's files
    assert "rank 1" not in terminal  # rank 0's output, not every worker's


def test_the_bar_counts_epochs_from_one_as_the_log_does(ddp_cell) -> None:
    """Rank 0's bar as it drew it (every frame is in its output file), and as the launcher
    redrew it: the frames current at its polls (an epoch shorter than a poll shows none)."""
    done, result, _ = ddp_cell
    (drawn,) = Path(result["output_dir"]).glob(".submitit/*/*_0_log.err")
    frames = BAR_FRAME.findall(drawn.read_text())
    assert {epoch for epoch, _ in frames} == {"1", "2"}, drawn.read_text()[-3000:]
    assert {total for _, total in frames} == {"2"}
    assert set(BAR_FRAME.findall(done.stderr)) <= {("1", "2"), ("2", "2")}
    assert "epoch 0" not in done.stdout + done.stderr
    run = RunConfig(epochs=2, repeats=3)
    assert epoch_label(run, repeat=1, epoch=0) == "repeat 2/3, epoch 1/2"
    assert epoch_label(RunConfig(epochs=2), repeat=0, epoch=1) == "epoch 2/2"


def test_a_rerun_sweep_with_every_cell_measured_says_so_in_one_line(ddp_cell) -> None:
    """The cell measured above, as a one-cell sweep: nothing runs, one line says so and how
    to measure again, no per-cell line and no sweep bar (whose rate would read thousands of
    cells per second); the table still shows the earlier measurement."""
    _, result, output_root = ddp_cell
    done = run_module("harness", ["-m", *tiny_overrides(output_root, *DDP_CELL)],
                      cwd=output_root.parent, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    said = [line for line in done.stdout.splitlines() if line.startswith("[distbench]")]
    assert said == ["[distbench] 1 cell(s) already measured, nothing to run; "
                    "hydra.launcher.force=true measures them again"], done.stdout
    assert "cell/s" not in done.stderr and "sweep:" not in done.stderr, done.stderr[-3000:]
    (row,) = [line for line in done.stdout.splitlines() if result["run_name"] in line]
    assert f"{result['metrics']['seconds_per_epoch']:.3f}" in row


def test_a_followed_output_yields_finished_lines_and_the_frame_being_redrawn(
        tmp_path: Path) -> None:
    """What the launcher reads of a worker's output file: lines as a terminal shows them (the
    text after a line's last carriage return), and the progress bar's current frame."""
    path = tmp_path / "0_log.err"
    output = _GrowingOutput(path, stream=None)  # type: ignore[arg-type] - not written here
    assert output.new_lines() == [] and output.frame == ""  # no file yet
    path.write_text("[x][harness.run][INFO] - warm\n\repoch 1/2:   0%|\repoch 1/2:  50%|")
    assert output.new_lines() == ["[x][harness.run][INFO] - warm"]
    assert output.frame == "epoch 1/2:  50%|"
    with path.open("a") as file:  # the bar closes (leave=False), the epoch's log line follows
        file.write("\r          \r[x][harness.run][INFO] - epoch 1/2: 1.0 s\n\repoch 2/2:   0")
    assert output.new_lines() == ["[x][harness.run][INFO] - epoch 1/2: 1.0 s"]
    assert output.frame == "epoch 2/2:   0"
    with path.open("ab") as file:  # a character cut between two reads
        file.write("\r          \r\u00e9".encode()[:-1])
    assert output.new_lines() == [] and output.frame == ""
    with path.open("ab") as file:
        file.write("\u00e9".encode()[-1:] + b"\n")
    assert output.new_lines() == ["\u00e9"]


def test_a_cell_is_recorded_once_its_record_is_no_longer_on_its_way_to_mlflow(
        tmp_path: Path) -> None:
    """The launcher's grace period for the other workers starts when rank 0 is done recording:
    not at result.json's first write (pending_sync, while rank 0 uploads it to MLflow, which
    the grace period cut short on a busy machine), but at its second."""
    path = tmp_path / "result.json"
    assert not recorded(path)
    path.write_text(json.dumps({"status": "ok", "pending_sync": True}))
    assert not recorded(path)  # uploading
    path.write_text(json.dumps({"status": "ok", "pending_sync": False, "mlflow_run_id": "x"}))
    assert recorded(path)
    path.write_text(json.dumps({"status": "ok", "pending_sync": True,
                                "tracking_error": "ConnectionError: refused"}))
    assert recorded(path)  # MLflow refused it: rank 0 is done, harness.sync uploads it later
