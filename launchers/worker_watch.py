"""A local job that needs every one of its workers to its end (the probe's: each figure is a
collective among all of them) is ended within seconds of one of them dying, which is named.

The launcher's wait (`launchers.local.wait_for_cell`) watches rank 0 and the result file only.
A worker that dies before its peers have joined the process group leaves them waiting for it at
the rendezvous until `run.progress_timeout_s` (600 s by default) has passed, in silence, and a
worker killed by a signal leaves no report of its own to say why. `LostWorkerWatch` runs beside
that wait, in a thread, and reads each worker's end as its controller notes it
(`launchers.local_controller.TaskEnd`): on the first worker that ended without having returned
(killed by a signal, or exited after raising), it gives rank 0 a moment to finish a result it may
be writing, then ends every process of the job (`launchers.local.end_cell`: by process id and
start time, never by name), and the wait returns.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import TracebackType

import submitit

from launchers.local import end_cell, lost_worker
from launchers.local_controller import TaskEnd, read_task_end

# How often the workers' ends are read: a few small files, a fraction of a second late at most.
POLL_S = 0.25
# How long rank 0 may go on after a peer died before the job is ended, where the result it
# writes is not there yet: the peer may have died after the last collective (rank 0 then holds
# every figure and writes them within a second), not only before the first.
SETTLE_S = 3.0
# How long each signal of the end (SIGINT, SIGTERM, SIGKILL) is given, shorter than a cell's
# (`launchers.local.END_STEP_S`): a peer waiting at the rendezvous or in a collective is inside
# torch's C++ code, where only SIGKILL reaches it, and what it had to write came meanwhile.
END_STEP_S = 1.0


class LostWorkerWatch:
    """While the launcher waits on `job` (within `with`), end the job once a worker is lost
    (`lost_worker`), unless `result_path` is written meanwhile; `lost` is that worker's end."""

    def __init__(
        self,
        job: submitit.Job,
        result_path: Path,
        *,
        settle_s: float = SETTLE_S,
        poll_s: float = POLL_S,
    ) -> None:
        self._job, self._result_path = job, Path(result_path)
        self._settle_s, self._poll_s = settle_s, poll_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="lost-worker-watch", daemon=True)
        self.lost: TaskEnd | None = None

    def __enter__(self) -> LostWorkerWatch:
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join()  # an end under way finishes first: no process of the job is left

    def _watch(self) -> None:
        while not self._stop.wait(self._poll_s):
            lost = lost_worker(self._job)
            if lost is not None:
                self.lost = lost
                if not self._result_comes(lost):
                    end_cell(self._job, step_s=END_STEP_S)
                return

    def _result_comes(self, lost: TaskEnd) -> bool:
        """Whether the result is written after all: up to `settle_s` while rank 0 still runs
        (it may be writing what it measured), not at all where rank 0 is the worker lost."""
        deadline = time.monotonic() + (0.0 if lost.rank == 0 else self._settle_s)
        while not self._result_path.exists():
            rank0_ended = read_task_end(self._job.task(0).paths) is not None
            if rank0_ended or time.monotonic() >= deadline or self._stop.wait(self._poll_s):
                return self._result_path.exists()
        return True
