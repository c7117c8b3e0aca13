"""The local job controller makes its job's folder before it opens its tasks' logs there: a
controller that starts before the submitting process has made the folder (a loaded machine)
still runs its job. The submitting process is left out here, so the folder is never made by it:
the case submitit's own controller fails with FileNotFoundError. It notes how each task ended,
which only it, their parent, can know."""

from __future__ import annotations

import sys
from pathlib import Path

import submitit
from submitit.core.utils import JobPaths

from launchers.local_controller import Executor, TaskEnd, read_task_end, start_controller


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


def test_the_controller_notes_how_each_task_ended(tmp_path: Path) -> None:
    # task 0 exits with status 3, task 1 is killed by SIGKILL, task 2 returns
    script = (
        "import os, signal, sys; rank = int(os.environ['SUBMITIT_LOCAL_GLOBALID']); "
        "sys.exit(3) if rank == 0 else os.kill(os.getpid(), signal.SIGKILL) if rank == 1 else None"
    )
    folder = tmp_path / ".submitit" / "%j"
    process = start_controller(
        folder,
        f'{sys.executable} -c "{script}"',
        tasks=3,
        cuda_devices="",
        timeout_min=1,
        signal_delay_s=1,
        stderr_to_stdout=False,
    )
    assert process.wait(timeout=60) == 0
    ends = [read_task_end(JobPaths(folder, str(process.pid), rank)) for rank in range(3)]
    assert [(end.rank, end.returncode) for end in ends if end is not None] == [
        (0, 3),
        (1, -9),
        (2, 0),
    ]
    assert all(end is not None and end.pid > 0 for end in ends)
    assert [end.how() for end in ends if end is not None] == [
        "exited with status 3",
        "was killed by SIGKILL",
        "exited with status 0",
    ]
    assert read_task_end(JobPaths(folder, str(process.pid), 3)) is None  # no such task
    assert TaskEnd(0, 1, -40).how() == "was killed by signal 40"  # a real-time signal
