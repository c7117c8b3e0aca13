"""The local job controller makes its job's folder before it opens its tasks' logs there: a
controller that starts before the submitting process has made the folder (a loaded machine)
still runs its job. The submitting process is left out here, so the folder is never made by it:
the case submitit's own controller fails with FileNotFoundError."""

from __future__ import annotations

import sys
from pathlib import Path

import submitit

from launchers.local_controller import Executor, start_controller


def test_a_controller_started_before_its_folder_exists_runs_its_job(tmp_path: Path) -> None:
    folder = tmp_path / ".submitit" / "%j"
    command = f"{sys.executable} -c \"print('task ran')\""
    process = start_controller(
        folder,
        command,
        tasks=1,
        cuda_devices="",
        timeout_min=1,
        signal_delay_s=1,
        stderr_to_stdout=False,
    )
    assert process.wait(timeout=60) == 0
    job_folder = tmp_path / ".submitit" / str(process.pid)
    assert (job_folder / f"{process.pid}_0_log.out").read_text() == "task ran\n"
    assert (job_folder / f"{process.pid}_0_log.err").exists()


def test_the_executor_runs_a_function_as_submitits_does(tmp_path: Path) -> None:
    executor = Executor(folder=str(tmp_path / ".submitit" / "%j"))
    executor.update_parameters(tasks_per_node=1, nodes=1, timeout_min=1)
    job = executor.submit(sum, [1, 2, 3])
    assert isinstance(job, submitit.local.local.LocalJob)
    assert job.result() == 6
    # The job's files where submitit puts them: the job id is the controller's process id.
    assert job.paths.folder == tmp_path / ".submitit" / job.job_id
    assert (job.paths.folder / f"{job.job_id}_0_result.pkl").exists()
