"""While SLURM holds a cell's job pending, the sweep says so (no silent wait over 5 s): once
past PENDING_QUIET_S, then every PENDING_EVERY_S, with squeue's reason. The job is submitit's
own record of a SLURM job (nothing is submitted: the waiting rule is what is tested; the
sweeps on the real cluster are tests/integration/test_slurm.py's)."""

from __future__ import annotations

from pathlib import Path

import pytest
import submitit

from launchers.slurm import PENDING_EVERY_S, PENDING_QUIET_S, SubmittedCell, say_pending


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
