"""A single-process cell (`python -m harness` without `-m`) ended by SIGINT (Ctrl-C) or
SIGTERM (`kill`, a shutdown) keeps what it measured: `harness.worker.run.run_cell` records it
`interrupted`, with the epochs it finished, prints one line and exits with the shell's status
for the signal (130, 143), instead of a traceback (SIGINT) or nothing at all (SIGTERM).

A cell of a sweep is its launcher's to end and to record (a cell past its time limit is its
`timeout`), but where the launcher itself is interrupted it first leaves a note in the cell's
folder (`INTERRUPTED_NOTE`, `launchers.local.keep_interrupted_cell`): a worker of one process
then records what it measured as a single cell does, and the launcher uploads it. A Ctrl-C at a
terminal reaches the workers with the launcher, before the note: a worker waits for it a moment
(`NOTE_WAIT_S`). A cell of several workers cannot gather its epochs once interrupted; its
launcher records it `interrupted` without them.

SIGTERM reaches Python as `SystemExit(143)` (`harness.cli.signals.end_like_ctrl_c_on_sigterm`),
SIGINT as `KeyboardInterrupt`; both unwind the measurement through its `finally` blocks (the memory
limit is lifted, the watchdog stopped, data-loader workers ended) before the cell is recorded.
"""

from __future__ import annotations

import os
import signal
import statistics
import time
from pathlib import Path

from harness.distributions.base import EpochMeasurement
from harness.records.results import CellResult

_SIGNAL_EXIT_BASE = 128  # the shell's status for "ended by signal n" is 128 + n
# The note an interrupted launcher leaves in its cell's folder (its text: the signal's name).
INTERRUPTED_NOTE = "interrupted-by-launcher"
# How long a worker of a launched cell, interrupted, waits for its launcher's note: a Ctrl-C at
# a terminal reaches both at once, and the launcher notes it within milliseconds.
NOTE_WAIT_S = 2.0


def signal_exit_code(error: BaseException) -> int | None:
    """The exit status of the signal that `error` stands for (130 for KeyboardInterrupt, the
    code of a SystemExit raised by a signal handler), or None when it is no signal."""
    if isinstance(error, KeyboardInterrupt):
        return _SIGNAL_EXIT_BASE + signal.SIGINT
    if (
        isinstance(error, SystemExit)
        and isinstance(error.code, int)
        and error.code > _SIGNAL_EXIT_BASE
    ):
        return error.code
    return None


def under_launcher() -> bool:
    """Whether a launcher (submitit's local or SLURM executor, in a sweep) runs this cell: it
    records a cell it ended itself (`launchers.cells.cell_outcome`), as `timeout` when its
    time limit ended it, which a record of the cell's own would hide."""
    return "SUBMITIT_EXECUTOR" in os.environ


def launcher_interrupted_by(output_dir: Path) -> str | None:
    """The signal that interrupted the launcher of this worker's cell, which asks it to record
    what it measured (its note in `output_dir`, waited for up to NOTE_WAIT_S); None where it
    left none (it ended the cell itself: a timeout)."""
    note = output_dir / INTERRUPTED_NOTE
    deadline = time.monotonic() + NOTE_WAIT_S
    while time.monotonic() <= deadline:
        try:
            return note.read_text().strip() or "a signal"
        except OSError:
            time.sleep(0.05)
    return None


def signal_name(exit_code: int) -> str:
    """ "SIGTERM" for 143."""
    try:
        return signal.Signals(exit_code - _SIGNAL_EXIT_BASE).name
    except ValueError:
        return f"signal {exit_code - _SIGNAL_EXIT_BASE}"


def add_measured_epochs(result: CellResult, measured: list[EpochMeasurement]) -> None:
    """Put the epochs a cell finished before it was interrupted into its record: their times
    and mean training losses, and their mean as `seconds_per_epoch` (no repeat statistics:
    the cell did not finish its repeats)."""
    result.epoch_seconds = [epoch.seconds for epoch in measured]
    result.train_loss = [
        statistics.fmean(epoch.batch_losses.values()) for epoch in measured if epoch.batch_losses
    ]
    result.metrics["epochs_measured"] = float(len(measured))
    if measured:
        result.metrics["seconds_per_epoch"] = statistics.fmean(result.epoch_seconds)


def interrupted_error(by: str, measured: int) -> str:
    """The record's one-line `error` for a cell ended by the signal named `by`."""
    return f"interrupted by {by} after {measured} timed epoch(s)"
