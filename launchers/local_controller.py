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
submitit's `Controller` unchanged. Everything else is submitit's: the environment the controller
reads (`start_controller`, copied from `submitit.local.local.start_controller`, submitit 1.5,
without its `setup` shell lines, which distbench never passes), the job, its files and its
end.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import submitit
from submitit.core.utils import JobPaths
from submitit.local.local import Controller, LocalJob

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


def run_controller(folder: Path) -> None:
    """submitit's controller of the job in `folder`, once the job's folder exists."""
    controller = Controller(folder)
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
