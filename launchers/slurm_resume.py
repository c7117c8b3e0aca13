"""What a re-run of a SLURM sweep does with the jobs an earlier run of it submitted.

SLURM jobs outlive the process that submitted them (they record themselves), so when a sweep is
run again after its submitting process died, some of its cells may still be queued or running,
and some may have died without a result that nobody recorded. For each cell without a finished
result, the re-run looks at the job noted for it (`launchers.slurm.JobNote`):

- still in `squeue` (pending, running): the re-run follows that job instead of submitting the
  cell again, so that the cell runs, and is recorded in MLflow, once;
- gone without a result.json: the re-run records that attempt first (`failed`, `timeout` or
  `oom`, from the rank reports, the workers' stderr and SLURM's final state if it still knows
  it), then submits the cell again;
- gone with a result.json: that attempt recorded itself; an `ok` one that did not reach the
  index (its job was killed right after writing it) counts as finished, any other is run again.

With `force`, every cell is submitted again; earlier jobs of the sweep's cells still in the
queue are cancelled first, so that no cell runs twice (their attempts are not recorded).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.measure.steadiness import is_unsteady
from harness.records.results import RESULT_FILE, RunStatus
from harness.records.resume import cell_key, index_result
from launchers import cells, slurm
from launchers.cells import PreparedCell


@dataclass
class EarlierJobs:
    """What a re-run takes over from the jobs of earlier runs, by position in the sweep."""

    following: dict[int, slurm.SubmittedCell] = field(default_factory=dict)  # still in squeue
    finished: dict[int, dict[str, Any]] = field(default_factory=dict)  # ended ok, not indexed


def _output_root(cell: PreparedCell[Any]) -> str:
    return cell.cell.run.output_dir


def noted_jobs(
    prepared: Sequence[PreparedCell[Any]], skipped: Collection[int]
) -> dict[int, slurm.JobNote]:
    """The noted earlier job of every cell not in `skipped`, by position in the sweep."""
    notes = {}
    for index, cell in enumerate(prepared):
        if index in skipped:
            continue
        note = slurm.read_job_note(_output_root(cell), cell_key(cell.config))
        if note is not None:
            notes[index] = note
    return notes


def take_over_earlier_jobs(
    prepared: Sequence[PreparedCell[Any]],
    skipped: Collection[int],
    *,
    force: bool,
    remeasure_unsteady: bool = False,
) -> EarlierJobs:
    """Follow, record or (with `force`) cancel the earlier jobs of the cells to be run; an
    earlier job's ok result measured while the machine was unsteady is not reused with
    `remeasure_unsteady`."""
    notes = noted_jobs(prepared, skipped)
    states = slurm.job_states(sorted({note.job_id for note in notes.values()}))
    if force:
        cancel_queued(prepared, notes, states)
        return EarlierJobs()
    earlier = EarlierJobs()
    for index, note in notes.items():
        cell, state = prepared[index], states[note.job_id]
        if not slurm.has_ended(state):
            earlier.following[index] = follow(cell, note, state)
            continue
        outcome = record_earlier_attempt(cell, note, state)
        remeasure = remeasure_unsteady and is_unsteady(outcome.get("metrics", {}))
        if outcome["status"] == RunStatus.ok.value and not remeasure:
            earlier.finished[index] = outcome
            print(
                f"[distbench] cell {cell.job_num} ({cell.cell.run_name}): skipped, earlier "
                f"job {note.job_id} finished it: {note.output_dir}",
                flush=True,
            )
    return earlier


def follow(cell: PreparedCell[Any], note: slurm.JobNote, state: str) -> slurm.SubmittedCell:
    """The earlier job of `cell`, to be followed as if this run had submitted it."""
    print(
        f"[distbench] cell {cell.job_num} ({cell.cell.run_name}): following earlier job "
        f"{note.job_id} ({state}), in {note.output_dir}",
        flush=True,
    )
    return slurm.SubmittedCell(note.job(), Path(note.output_dir), note.tasks, state=state)


def record_earlier_attempt(
    cell: PreparedCell[Any], note: slurm.JobNote, state: str
) -> dict[str, Any]:
    """The result of an earlier job that has ended: the one it wrote, or else (it died while
    no launcher watched) one recorded now from what it left, so the attempt is not lost."""
    output_dir = Path(note.output_dir)
    ended = (
        f"ended {state} while the sweep was not watching"
        if state != slurm.GONE
        else "ended without a result while the sweep was not watching (SLURM no longer "
        "knows the job)"
    )
    logs = f"SLURM job {note.job_id} {ended}\n" + cells.worker_logs_tail(note.job(), note.tasks)
    recorded_now = not (output_dir / RESULT_FILE).exists()
    outcome = cells.cell_outcome(
        cell.config,
        output_dir,
        ended_as=slurm.status_of_state(state),
        logs=logs,
        started=note.submitted_at,
    )
    if recorded_now:
        print(
            f"[distbench] cell {cell.job_num} ({cell.cell.run_name}): earlier job "
            f"{note.job_id} {ended}; recorded as {outcome['status']}",
            flush=True,
        )
    elif outcome["status"] == RunStatus.ok.value and outcome.get("cell_key"):
        # Killed between writing result.json and indexing it: finished all the same (the
        # caller says whether it is used, or measured again as unsteady).
        index_result(_output_root(cell), outcome["cell_key"], outcome)
    return outcome


def cancel_queued(
    prepared: Sequence[PreparedCell[Any]], notes: dict[int, slurm.JobNote], states: dict[str, str]
) -> None:
    """scancel the earlier jobs still queued or running: a forced re-run replaces them."""
    for index, note in notes.items():
        if slurm.has_ended(states[note.job_id]):
            continue
        note.job().cancel(check=False)
        cell = prepared[index]
        print(
            f"[distbench] cell {cell.job_num} ({cell.cell.run_name}): cancelled earlier job "
            f"{note.job_id} ({states[note.job_id]}): hydra.launcher.force=true runs the cell "
            f"again",
            flush=True,
        )
