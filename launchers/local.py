"""Run one cell's workers as local processes through submitit, and wait for the cell to end.

submitit's local executor starts `tasks` processes that each learn their rank from the
environment it sets, as on SLURM. Waiting is ours, because a cell is over when its rank 0 has
recorded it: a peer that hangs must not hold the sweep, so after rank 0's result.json appears
the rest get a grace period and are then ended (SIGINT, then SIGKILL), as is a cell that
exceeds its time limit.

A local cell does not outlive the process that launched it (the sweep, or `python -m harness`):
submitit's job controller is made to survive it, but a cell left running would measure itself
against the next run's cells, and a re-run sweep would run it a second time. Its workers watch
the launcher and end themselves when it is gone; the cell, without a result, is run again when
the sweep is re-run.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import submitit

from harness.results import RESULT_FILE, RunStatus
from launchers.distributed import MASTER_PORT_ENV, free_port, log_to_stderr

# After rank 0 recorded the cell, how long the other workers may take to exit by themselves.
GRACE_AFTER_RESULT_S = 20.0
_POLL_S = 0.5
# The pid of the process that launched a local cell, handed to its workers.
LAUNCHER_PID_ENV = "DISTBENCH_LAUNCHER_PID"


def submit_local(function: Callable[..., Any], *args: Any, folder: Path, tasks: int,
                 timeout_min: int, name: str) -> submitit.Job:
    """Start `tasks` local processes that each call `function(*args)`.

    The workers' rendezvous port is a port free right now, handed to them in their
    environment: a port derived from the local job id (a process id) could be one that another
    cell on this machine is using.
    """
    executor = submitit.LocalExecutor(folder=str(folder))
    # submitit's own time limit is a backstop only: wait_for_cell ends the cell first.
    executor.update_parameters(tasks_per_node=tasks, nodes=1, timeout_min=timeout_min + 5,
                               name=name)
    handed = {MASTER_PORT_ENV: str(free_port()), LAUNCHER_PID_ENV: str(os.getpid())}
    previous = {name: os.environ.get(name) for name in handed}
    os.environ.update(handed)  # submitit copies os.environ to the tasks
    try:
        return executor.submit(function, *args)
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def follow_launcher() -> None:
    """In a local cell's worker: end this process (SIGKILL) as soon as the process that
    launched the cell is gone. Nothing to do outside a local cell, or without /proc."""
    pid = os.environ.get(LAUNCHER_PID_ENV)
    if pid is None or not Path("/proc/self/stat").exists():
        return
    born = _start_time(int(pid))
    threading.Thread(target=_watch_launcher, args=(int(pid), born), name="launcher-watch",
                     daemon=True).start()


def _watch_launcher(pid: int, born: str | None) -> None:
    # Compared by start time too: after the launcher's death its pid may be reused.
    while born is not None and _start_time(pid) == born:
        time.sleep(1.0)
    os.kill(os.getpid(), signal.SIGKILL)


def _start_time(pid: int) -> str | None:
    """When process `pid` started (field 22 of /proc/<pid>/stat), or None if it is gone (a
    zombie, dead but not yet reaped by its parent, is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()  # from field 3 on; the command name may hold spaces
    return None if fields[0] in ("Z", "X") else fields[19]


def wait_for_cell(job: submitit.Job, output_dir: Path, *, timeout_s: float,
                  grace_s: float = GRACE_AFTER_RESULT_S, result_file: str = RESULT_FILE) -> bool:
    """Wait until every worker of the cell has exited; return True if the cell timed out.

    Workers still running `grace_s` after rank 0 wrote `result_file` (the cell's record), or
    when `timeout_s` has passed, are ended, so no process of the cell outlives it.
    """
    result_path = Path(output_dir) / result_file
    deadline = time.monotonic() + timeout_s
    result_seen: float | None = None
    while not job.done():
        now = time.monotonic()
        if result_seen is None and result_path.exists():
            result_seen = now
        if result_seen is not None and now - result_seen > grace_s:
            job.cancel(check=False)
            break
        if now > deadline:
            job.cancel(check=False)
            _wait_until_done(job)
            return True
        time.sleep(_POLL_S)
    _wait_until_done(job)
    return False


def _wait_until_done(job: submitit.Job, limit_s: float = 30.0) -> None:
    """Cancellation escalates from SIGINT to SIGKILL within seconds; wait for it."""
    deadline = time.monotonic() + limit_s
    while not job.done() and time.monotonic() < deadline:
        time.sleep(_POLL_S)


def run_local_cell(cfg: Any, output_dir: Path, *, workers: int, timeout_min: int) -> dict:
    """`python -m harness` for a cell with several workers: start them, wait, return the
    result (rank 0's record, or the record of how the cell failed)."""
    from harness.run import now
    from launchers.cells import cell_outcome, worker_logs_tail

    started = now()
    job = submit_local(_logged_run_cell, cfg, output_dir, folder=output_dir / ".submitit" / "%j",
                       tasks=workers, timeout_min=timeout_min, name="distbench")
    timed_out = wait_for_cell(job, output_dir, timeout_s=60 * timeout_min)
    return cell_outcome(cfg, output_dir, ended_as=RunStatus.timeout if timed_out else None,
                        logs=worker_logs_tail(job, workers), started=started)


def _logged_run_cell(cfg: Any, output_dir: Path) -> dict:
    """A worker of `run_local_cell`: Hydra's job logging is not set up in these processes, so
    log to stderr (submitit keeps it per worker in .submitit/<job>/<job>_<rank>_log.err)."""
    from harness.run import run_cell

    follow_launcher()
    log_to_stderr()
    return run_cell(cfg, output_dir)
