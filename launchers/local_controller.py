"""submitit's local executor, its job controller started with the job's folder in place.

submitit's `LocalExecutor` starts a job controller (`python -m submitit.local._local FOLDER`,
its `Controller`: it starts the job's task processes, with their output in log files, and waits
for them) and only then makes the job's folder (`FOLDER` with `%j` replaced by the job id, which
is the controller's process id, known once it has started), in the submitting process. The
controller opens its tasks' log files in that folder as soon as it has imported submitit. On a
loaded machine it can get there first: `FileNotFoundError`, and the cell ends without having
started a worker (seen once in a run of the test suite on a machine loaded several times over).

`Executor` starts `python -m launchers.local_controller FOLDER` instead, which makes the
job's folder itself (the path submitit's `JobPaths` gives for its own process id) and then runs
submitit's `Controller`, which also notes how each task ended (`NotingController`, `TaskEnd`):
only a process's parent learns its exit status, and submitit's controller keeps it to itself,
so without the note the launcher could see that a worker is gone but not whether it returned,
raised or was killed, nor by which signal. Everything else is submitit's: the environment the
controller reads (`start_controller`, copied from `submitit.local.local.start_controller`,
submitit 1.5, without its `setup` shell lines, which distbench never passes), the job, its
files and its end.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import submitit
from submitit.core.utils import JobPaths
from submitit.local.local import Controller, LocalJob, LocalJobEnvironment

from workloads.datasets.atomic import write_json_atomic

CONTROLLER_MODULE = "launchers.local_controller"


class Executor(submitit.LocalExecutor):
    """submitit's `LocalExecutor` whose job controller makes the job's folder first."""

    def _submit_command(self, command: str) -> LocalJob[Any]:
        if self.parameters.get("setup"):
            raise ValueError("launchers.local_controller.Executor runs no setup lines")
        tasks = self.parameters.get("tasks_per_node", 1)
        gpus, visible = (
            self.parameters.get("gpus_per_node", 0),
            self.parameters.get("visible_gpus", ()),
        )
        devices = range(gpus) if visible == () else visible[:gpus]
        process = start_controller(
            self.folder,
            command,
            tasks=tasks,
            cuda_devices=",".join(str(device) for device in devices),
            timeout_min=self.parameters.get("timeout_min", 2.0),
            signal_delay_s=self.parameters.get("signal_delay_s", 30),
            stderr_to_stdout=self.parameters.get("stderr_to_stdout", False),
        )
        return LocalJob(
            folder=self.folder, job_id=str(process.pid), process=process, tasks=list(range(tasks))
        )


def start_controller(
    folder: Path,
    command: str,
    *,
    tasks: int,
    cuda_devices: str,
    timeout_min: float,
    signal_delay_s: int,
    stderr_to_stdout: bool,
) -> subprocess.Popen[bytes]:
    """The job's controller, in the environment submitit's controller reads its job from; it
    outlives this process, as submitit's does (the launcher ends it: launchers.local)."""
    env = dict(
        os.environ,
        SUBMITIT_LOCAL_NTASKS=str(tasks),
        SUBMITIT_LOCAL_COMMAND=command,
        SUBMITIT_LOCAL_TIMEOUT_S=str(int(60 * timeout_min)),
        SUBMITIT_LOCAL_SIGNAL_DELAY_S=str(int(signal_delay_s)),
        SUBMITIT_LOCAL_NODEID="0",
        SUBMITIT_LOCAL_JOB_NUM_NODES="1",
        SUBMITIT_STDERR_TO_STDOUT="1" if stderr_to_stdout else "",
        SUBMITIT_EXECUTOR="local",
        CUDA_VISIBLE_DEVICES=cuda_devices,
        SUBMITIT_LOCAL_WITH_SHELL="",
    )
    return subprocess.Popen([sys.executable, "-m", CONTROLLER_MODULE, str(folder)], env=env)


@dataclass(frozen=True)
class TaskEnd:
    """How one task (a worker) of a local job ended, as its controller, its parent, saw it."""

    rank: int
    pid: int
    returncode: int  # subprocess's: -N where signal N ended it

    def how(self) -> str:
        """'was killed by SIGKILL', 'exited with status 1': what a line about the worker says."""
        if self.returncode >= 0:
            return f"exited with status {self.returncode}"
        try:
            return f"was killed by {signal.Signals(-self.returncode).name}"
        except ValueError:  # a real-time signal has no name of its own
            return f"was killed by signal {-self.returncode}"


def task_end_path(paths: JobPaths) -> Path:
    """Where the controller notes how the task of `paths` ended: beside its logs, named as
    submitit names a task's files (`<job>_<task>_...`)."""
    return paths.folder / f"{paths.job_id}_{paths.task_id}_ended.json"


def read_task_end(paths: JobPaths) -> TaskEnd | None:
    """The task's end as its controller noted it; None while it runs (or if nothing could be
    read: the note is written whole or not at all, `write_json_atomic`)."""
    try:
        noted = json.loads(task_end_path(paths).read_text())
        return TaskEnd(int(noted["rank"]), int(noted["pid"]), int(noted["returncode"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


class NotingController(Controller):
    """submitit's controller, which notes each task's end (`task_end_path`) as soon as it sees
    it. Its `wait` is submitit 1.5's `Controller.wait`, with the note taken at every poll: the
    loop has no hook, and a second thread polling the tasks would race it for their exit
    statuses."""

    def start_tasks(self) -> None:
        super().start_tasks()
        self._noted: set[int] = set()  # afresh for a requeued job's new tasks

    def wait(self, freq: int = 24) -> Sequence[int | None]:
        assert self.tasks, "Nothing to do!"
        timeout = freq * self.timeout_s
        almost_timeout = freq * (self.timeout_s - self.signal_delay_s)
        for step in range(timeout):
            exit_codes = self._poll_and_note()
            if all(code is not None for code in exit_codes):
                return exit_codes
            if step == almost_timeout:
                self._forward_signal(LocalJobEnvironment._usr_sig())
            time.sleep(1.0 / freq)
        return self._poll_and_note()

    def _poll_and_note(self) -> list[int | None]:
        """Every task's exit status (None: running), each new one noted once."""
        exit_codes = [task.poll() for task in self.tasks]
        for rank, (task, code) in enumerate(zip(self.tasks, exit_codes, strict=True)):
            if code is not None and rank not in self._noted:
                self._noted.add(rank)
                note_task_end(JobPaths(self.folder, self.pid, rank), TaskEnd(rank, task.pid, code))
        return exit_codes


def note_task_end(paths: JobPaths, end: TaskEnd) -> None:
    """Write the note of `end`; a disk that refuses it costs the launcher only its knowing how
    the task ended, never the job."""
    try:
        write_json_atomic(
            task_end_path(paths),
            {"rank": end.rank, "pid": end.pid, "returncode": end.returncode},
        )
    except OSError:
        pass


def run_controller(folder: Path) -> None:
    """submitit's controller of the job in `folder`, once the job's folder exists."""
    controller = NotingController(folder)
    JobPaths(folder, controller.pid).folder.mkdir(parents=True, exist_ok=True)
    # SIGINT is forwarded to the workers, as submitit's controller forwards SIGTERM, and the
    # controller goes on waiting for them: by default it would raise, and on its way out kill
    # them within a second (Controller.run's `finally`), cutting short the record an
    # interrupted worker makes of its measured epochs (harness.worker.interruption). Where it
    # is ignored (a sweep started with `nohup ... &`) it stays ignored, as the workers have it.
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, controller._forward_signal)  # type: ignore[arg-type]
    controller.run()


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(f"usage: python -m {CONTROLLER_MODULE} SUBMITIT_FOLDER")
    run_controller(Path(sys.argv[1]))
