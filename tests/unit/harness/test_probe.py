"""Why a probe ended without a profile, read off its workers' logs (`harness.probe`): on SLURM,
srun's line naming the task that ended badly, not the "Force Terminated" its peers' logs end
with. The logs are the files submitit's SLURM job reads (their text as srun wrote them on the
local 2-node cluster); nothing is submitted here (the probe on the cluster is
tests/integration/test_slurm.py's)."""

from __future__ import annotations

from pathlib import Path

import submitit

from harness.probe import _last_words

SRUN_ENDED_TASK_0 = """\
[2026-12-07 23:24:22,229][submitit][WARNING] - Bypassing signal SIGCONT
srun: error: node1: task 0: Killed
srun: Force Terminated StepId=483.0
"""


def _job(folder: Path, logs: dict[int, str]) -> submitit.Job:
    for rank, text in logs.items():
        (folder / f"483_{rank}_log.err").write_text(text)
    return submitit.SlurmJob(folder=folder, job_id="483", tasks=tuple(range(len(logs))))


def test_srun_naming_the_task_that_ended_badly_is_what_the_failure_says(tmp_path: Path) -> None:
    job = _job(tmp_path, {0: SRUN_ENDED_TASK_0, 1: ""})
    assert _last_words(job, 2) == "SLURM said: srun: error: node1: task 0: Killed"


def test_else_a_workers_last_line_or_that_none_wrote_anything(tmp_path: Path) -> None:
    job = _job(tmp_path, {0: "", 1: "Traceback ...\nRuntimeError: gloo connect failed\n"})
    assert _last_words(job, 2) == "worker 1 last wrote: RuntimeError: gloo connect failed"
    silent = _job(tmp_path, {0: "", 1: ""})
    assert _last_words(silent, 2) == "no worker wrote anything on stderr"
