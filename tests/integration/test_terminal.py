"""What a user sees on the terminal, and what a log file keeps: a multi-worker cell's progress
and result summary (rank 0's, relayed by the launcher), epochs counted from 1 by the bar as by
the log, progress bars only on a terminal (plain lines in a file, no third-party INFO lines), a
line for each phase, and a re-run sweep with nothing left to run saying so in one line.

One 2-worker DDP cell (`python -m harness`, as a user types it, its output captured: not a
terminal) is run once per module; the sweep tests re-run the same cell as a sweep, which finds
it already measured."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import select
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from harness.config.schema import RunConfig
from harness.records.mlflow_store import DEFAULT_STORE_FILE
from harness.worker.run import EpochProgress, epoch_label
from launchers.local import _GrowingOutput, recorded
from tests.helpers import run_module, tiny_overrides
from workloads import progress

# run.progress=true: the bar is what is tested (tiny_overrides turns it off).
DDP_CELL = [
    "distribution=ddp",
    "hardware=local_2cpu",
    "run.warmup_batches=0",
    "tracking.enabled=false",
]
BAR_FRAME = re.compile(r"(?:repeat \d+/\d+, )?epoch (\d+)/(\d+): +\d+%\|")
# What a bar leaves in a file: carriage returns, and escape sequences (cursor up: ESC[A).
BAR_DEBRIS = re.compile(r"\r|\x1b\[")


@pytest.fixture(scope="module")
def ddp_cell(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[subprocess.CompletedProcess[str], dict, Path]:
    """The finished 2-worker cell: its terminal output, its result.json, its output root."""
    output_root = tmp_path_factory.mktemp("terminal") / "outputs"
    output_root.mkdir()
    done = run_module(
        "harness",
        [*tiny_overrides(output_root, *DDP_CELL), "run.progress=true"],
        cwd=output_root.parent,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (path,) = (output_root / "runs").glob("*/result.json")
    return done, json.loads(path.read_text()), output_root


def test_a_two_worker_cell_shows_rank0s_epochs_and_result_summary(ddp_cell) -> None:
    done, result, _ = ddp_cell
    assert result["status"] == "ok", result["error"]
    terminal = done.stdout + done.stderr
    # Rank 0's own epoch lines (its seconds, said so; the record's are the slowest worker's).
    assert re.findall(
        r"\]\[harness\.worker\.run\]\[INFO\] - (epoch \d/2): [\d.]+ s \(8 images\) on worker "
        r"0 of 2 \(the cell's epoch time, in its summary, is its slowest worker's\)",
        terminal,
    ) == ["epoch 1/2", "epoch 2/2"], terminal[-3000:]
    metrics = result["metrics"]
    # One repeat: no spread measured, and said so (not "std 0.000"); whose epoch time it is.
    assert (
        f"{result['run_name']}: {metrics['seconds_per_epoch']:.3f} s/epoch, the slowest of 2 "
        f"workers' (1 repeat: no spread), {metrics['images_per_second']:.1f} "
        f"images/s, peak memory {metrics['peak_memory_mb']:.0f} MB"
    ) in terminal
    assert f"result: {result['output_dir']}/result.json; MLflow run off" in terminal
    assert "submitit" not in terminal  # the launcher's bookkeeping stays in the worker's files
    assert "rank 1" not in terminal  # rank 0's output, not every worker's


def test_off_a_terminal_the_cell_prints_lines_a_line_per_phase_and_no_bar(ddp_cell) -> None:
    """The cell's output went to pipes, not a terminal: no bar's carriage returns or cursor
    moves, in the launcher's output nor in rank 0's own file (the launcher told its workers);
    the workers' start, which takes seconds, has its line before rank 0 says anything."""
    done, result, _ = ddp_cell
    (drawn,) = Path(result["output_dir"]).glob(".submitit/*/*_0_log.err")
    for text in (done.stdout, done.stderr, drawn.read_text()):
        assert not BAR_DEBRIS.search(text), repr(text[-2000:])
    assert (
        f"[distbench] {result['run_name']}: starting 2 worker process(es) in "
        f"{result['output_dir']}" in done.stdout
    )
    assert "rank 0/2 joined the gloo process group" in done.stderr


def _read_all(fd: int) -> str:
    chunks = []
    while select.select([fd], [], [], 0.2)[0]:
        chunks.append(os.read(fd, 65536))
    return b"".join(chunks).decode()


def test_the_bar_counts_epochs_from_one_as_the_log_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Rank 0's bar on a terminal (a pseudo-terminal here), as it draws it: epochs counted from
    1. The same progress in a file: plain lines, none for a task shorter than its first line's
    delay, then one with the steps done (on stderr, in a process that does not log at INFO),
    and one with the last count when a task that showed a line ends."""
    monkeypatch.delenv(progress.PROGRESS_ENV, raising=False)
    caplog.set_level(logging.WARNING, logger=progress.log.name)
    leader, follower = os.openpty()
    # A terminal has a size (a fresh pseudo-terminal's is 0 x 0, where tqdm shows no bar).
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    with os.fdopen(follower, "w") as terminal:
        monkeypatch.setattr(sys, "stderr", terminal)
        assert progress.mode() == progress.BARS
        bar = EpochProgress(enabled=True, batches=2)
        for epoch in range(2):
            with bar.epoch(epoch_label(RunConfig(epochs=2), repeat=0, epoch=epoch)):
                bar.update()
                bar.update()
        terminal.flush()
        drawn = _read_all(leader)  # while the terminal is open (else EIO)
    os.close(leader)
    frames = BAR_FRAME.findall(drawn)
    assert {epoch for epoch, _ in frames} == {"1", "2"} and {t for _, t in frames} == {"2"}, drawn
    assert "\r" in drawn and "epoch 0" not in drawn
    with (tmp_path / "log").open("w") as log_file:
        monkeypatch.setattr(sys, "stderr", log_file)
        assert progress.mode() == progress.LINES
        with progress.steps(4, "profiling layers", "layer(s)", first_line_s=0.0) as shown:
            shown.update()
        with progress.steps(4, "generating", "img") as quick:  # done within a second
            quick.update(4)
        # a task that showed a line and went on says where it ended, not where its line was
        with progress.steps(480, "composing cells", "cell(s)", first_line_s=0.0) as composed:
            composed.update(24)
            composed.update(456)
    assert (tmp_path / "log").read_text() == (
        "profiling layers: 1/4 layer(s) (25%)\n"
        "composing cells: 24/480 cell(s) (5%)\n"
        "composing cells: 480/480 cell(s) (100%)\n"
    )
    run = RunConfig(epochs=2, repeats=3)
    assert epoch_label(run, repeat=1, epoch=0) == "repeat 2/3, epoch 1/2"
    assert epoch_label(RunConfig(epochs=2), repeat=0, epoch=1) == "epoch 2/2"


def test_a_rerun_sweep_with_every_cell_measured_says_so_in_one_line(ddp_cell) -> None:
    """The cell measured above, as a one-cell sweep: nothing runs, one line says so and how
    to measure again, no per-cell line and no sweep bar (whose rate would read thousands of
    cells per second); the table still shows the earlier measurement."""
    _, result, output_root = ddp_cell
    done = run_module(
        "harness",
        ["-m", *tiny_overrides(output_root, *DDP_CELL)],
        cwd=output_root.parent,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    said = [line for line in done.stdout.splitlines() if line.startswith("[distbench]")]
    assert said == [
        "[distbench] 1 cell(s) already measured, nothing to run; "
        "hydra.launcher.force=true measures them again"
    ], done.stdout
    assert "cell/s" not in done.stderr and "sweep:" not in done.stderr, done.stderr[-3000:]
    (row,) = [line for line in done.stdout.splitlines() if line.startswith("  0  ")]
    assert f"{result['metrics']['seconds_per_epoch']:.3f}" in row and result["run_name"] in row


def _table_rows(stdout: str) -> dict[str, tuple[float, list[str]]]:
    """The summary table's rows: run name -> (seconds per epoch, the lines under the row; a
    cell measured while the machine was unsteady has its s/epoch marked '~' and a line)."""
    rows: dict[str, tuple[float, list[str]]] = {}
    last = None
    for line in stdout.splitlines():
        row = re.match(r"^ +\d+  (.+?) {2,}(\w+) +([\d.]+)~? ", line)
        if row:
            last = row.group(1)
            rows[last] = (float(row.group(3)), [])
        elif last is not None and line.startswith("     "):
            rows[last][1].append(line.strip())
    return rows


def test_a_sweep_that_reuses_a_cell_summarizes_the_table_it_prints_and_logs_plain_lines(
    ddp_cell, tmp_path: Path
) -> None:
    """The DDP cell measured above and a sequential cell, as a sweep with MLflow on, its
    stderr in a file: the DDP cell is reused, marked so in the table with where it came from,
    and the summary line under the table and the sweep's MLflow run name the fastest of the
    cells the table shows, the reused one included. The file holds no bar, no MLflow INFO
    chatter; each phase has its line. The sequential cell's record and MLflow run say how
    loaded the machine was as it started."""
    _, ddp, output_root = ddp_cell
    with (tmp_path / "stderr.log").open("w") as stderr:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "harness",
                "-m",
                *tiny_overrides(output_root, *DDP_CELL),
                "distribution=sequential,ddp",
                "run.progress=true",
                "tracking.enabled=true",
            ],  # not part of the cell's key: the DDP cell is reused
            cwd=output_root.parent,
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
            text=True,
            stdout=subprocess.PIPE,
            stderr=stderr,
            timeout=300,
        )
    logged = (tmp_path / "stderr.log").read_text()
    assert done.returncode == 0, logged[-3000:]
    rows = _table_rows(done.stdout)
    assert [line for line in rows[ddp["run_name"]][1] if not line.startswith("unsteady: ")] == [
        f"reused: measured earlier, in {ddp['output_dir']}"
    ]
    (sequential,) = [name for name in rows if name.startswith("sequential")]
    # ran now (an 'unsteady: ...' line may follow: these cells' epochs are milliseconds long)
    assert [line for line in rows[sequential][1] if not line.startswith("unsteady: ")] == []
    fastest = min(rows, key=lambda name: rows[name][0])
    mark = " (reused)" if fastest == ddp["run_name"] else ""
    summary = (
        f"2 cell(s) ok (1 reused), 0 failed; fastest {fastest!r} at "
        f"{rows[fastest][0]:.3f} s/epoch{mark}"
    )
    assert f"sweep: {summary}" in done.stdout.splitlines()
    assert f"FINISHED: {summary}. Compare the cells" in done.stdout + logged
    # A log file, not a terminal: plain lines only, no third-party INFO lines, a line a phase.
    assert not BAR_DEBRIS.search(logged + done.stdout), repr(logged[-2000:])
    assert "Creating initial MLflow database tables" not in logged + done.stdout
    assert f"cell 0 ({sequential}): starting 1 worker process(es)" in done.stdout
    assert "recording the cell in MLflow at" in done.stdout + logged
    (result_path,) = (output_root / "sweeps").glob("*/*/0/result.json")
    environment = json.loads(result_path.read_text())["environment"]
    load = [float(environment[f"load_average_{m}min"]) for m in (1, 5, 15)]
    assert all(value >= 0 for value in load)
    governors = sorted(
        {
            path.read_text().strip()
            for path in Path("/sys/devices/system/cpu").glob("cpu[0-9]*/cpufreq/scaling_governor")
        }
    )
    assert environment["cpu_governor"] == (",".join(governors) or "unavailable")
    assert environment["cpu_count"] == str(os.cpu_count())
    client = MlflowClient(f"sqlite:///{output_root / DEFAULT_STORE_FILE}")
    (run,) = client.search_runs(
        [e.experiment_id for e in client.search_experiments()], "tags.status = 'ok'"
    )  # the sequential cell's: it ran
    assert {
        key: run.data.tags[key]
        for key in environment
        if key.startswith(("load_average", "cpu_governor"))
    } == {
        key: value
        for key, value in environment.items()
        if key.startswith(("load_average", "cpu_governor"))
    }


def test_a_followed_output_yields_finished_lines_and_the_frame_being_redrawn(
    tmp_path: Path,
) -> None:
    """What the launcher reads of a worker's output file: lines as a terminal shows them (the
    text after a line's last carriage return), and the progress bar's current frame."""
    path = tmp_path / "0_log.err"
    output = _GrowingOutput(path, stream=None)  # type: ignore[arg-type] - not written here
    assert output.new_lines() == [] and output.frame == ""  # no file yet
    path.write_text("[x][harness.worker.run][INFO] - warm\n\repoch 1/2:   0%|\repoch 1/2:  50%|")
    assert output.new_lines() == ["[x][harness.worker.run][INFO] - warm"]
    assert output.frame == "epoch 1/2:  50%|"
    with path.open("a") as file:  # the bar closes (leave=False), the epoch's log line follows
        file.write(
            "\r          \r[x][harness.worker.run][INFO] - epoch 1/2: 1.0 s\n\repoch 2/2:   0"
        )
    assert output.new_lines() == ["[x][harness.worker.run][INFO] - epoch 1/2: 1.0 s"]
    assert output.frame == "epoch 2/2:   0"
    with path.open("ab") as file:  # a character cut between two reads
        file.write("\r          \r\u00e9".encode()[:-1])
    assert output.new_lines() == [] and output.frame == ""
    with path.open("ab") as file:
        file.write("\u00e9".encode()[-1:] + b"\n")
    assert output.new_lines() == ["\u00e9"]


def test_a_cell_is_recorded_once_its_record_is_no_longer_on_its_way_to_mlflow(
    tmp_path: Path,
) -> None:
    """The launcher's grace period for the other workers starts when rank 0 is done recording:
    not at result.json's first write (pending_sync, while rank 0 uploads it to MLflow, which
    the grace period cut short on a busy machine), but at its second."""
    path = tmp_path / "result.json"
    assert not recorded(path)
    path.write_text(json.dumps({"status": "ok", "pending_sync": True}))
    assert not recorded(path)  # uploading
    path.write_text(json.dumps({"status": "ok", "pending_sync": False, "mlflow_run_id": "x"}))
    assert recorded(path)
    path.write_text(
        json.dumps(
            {"status": "ok", "pending_sync": True, "tracking_error": "ConnectionError: refused"}
        )
    )
    assert recorded(path)  # MLflow refused it: rank 0 is done, harness.sync uploads it later
