"""While SLURM holds a cell's job pending, the sweep says so (no silent wait over 5 s): once
past PENDING_QUIET_S, then every PENDING_EVERY_S, with squeue's reason; and a cell's job note
follows its output root when the root is moved. The job is submitit's own record of a SLURM
job (nothing is submitted: the waiting rule and the note are what is tested; the sweeps on the
real cluster are tests/integration/test_slurm.py's)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import submitit

from harness.records.resume import job_note_path
from launchers.slurm import (
    PENDING_EVERY_S,
    PENDING_QUIET_S,
    JobNote,
    SubmittedCell,
    read_job_note,
    say_pending,
    write_job_note,
)


def test_a_pending_job_is_said_after_5_s_then_every_minute(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cell = SubmittedCell(submitit.SlurmJob(tmp_path, "4242"), tmp_path, tasks=2)
    start = cell.followed_since
    say_pending(cell, "Resources", start + PENDING_QUIET_S - 1)
    assert capsys.readouterr().out == ""
    say_pending(cell, "Resources", start + PENDING_QUIET_S + 1)
    assert capsys.readouterr().out == (
        "[distbench] job 4242 has waited in SLURM's queue for 6 s (Resources): the sweep goes "
        "on once SLURM starts it\n"
    )
    say_pending(cell, "Resources", start + PENDING_QUIET_S + 30)
    assert capsys.readouterr().out == ""
    say_pending(cell, "Priority", start + PENDING_QUIET_S + 1 + PENDING_EVERY_S)
    assert "queue for 66 s (Priority)" in capsys.readouterr().out
    cell.state = "RUNNING"
    say_pending(cell, "None", start + 1000)
    assert capsys.readouterr().out == ""


def test_a_job_note_keeps_its_folders_relative_and_follows_a_moved_root(tmp_path: Path) -> None:
    """The note names the cell's folders relative to the output root, so that a root moved as
    a whole (`mv out1 moved/out2`) finds its jobs' outputs and logs there; a note written with
    absolute folders, before they were kept relative, is found by its tail under the root."""
    root = tmp_path / "out1"
    cell_dir = root / "runs" / "cell-0"
    (cell_dir / ".submitit").mkdir(parents=True)
    note = JobNote("4242", str(cell_dir / ".submitit" / "%j"), str(cell_dir), 2, "2026-12-07")
    write_job_note(root, "key", note)
    kept = json.loads(job_note_path(root, "key").read_text())
    assert kept["output_dir"] == "runs/cell-0"
    assert kept["folder"] == "runs/cell-0/.submitit/%j"
    assert read_job_note(root, "key") == note

    moved = tmp_path / "moved" / "out2"
    moved.parent.mkdir()
    shutil.move(root, moved)
    found = read_job_note(moved, "key")
    assert found is not None
    assert found.output_dir == str(moved / "runs" / "cell-0")
    assert found.folder == str(moved / "runs" / "cell-0" / ".submitit" / "%j")

    old = {**kept, "output_dir": str(cell_dir), "folder": note.folder}  # as notes were written
    job_note_path(moved, "key").write_text(json.dumps(old))
    found = read_job_note(moved, "key")
    assert found is not None and found.output_dir == str(moved / "runs" / "cell-0")
