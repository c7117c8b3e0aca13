"""Run one cell's workers as local processes through submitit, and wait for the cell to end.

submitit's local executor starts `tasks` processes that each learn their rank from the
environment it sets, as on SLURM. Waiting is ours, because a cell is over when its rank 0 has
recorded it, or its rank 0 is gone (a worker ended by its own watchdog leaves no result.json):
a peer that hangs must not hold the sweep, so after either the rest get a grace period and are
then ended, as is a cell that exceeds its time limit.

Ending a cell does not rely on submitit's cancel alone, which only sends SIGINT to its job
controller: a launcher started with `nohup ... &` (or as a background job of a script) has
SIGINT ignored, and its cell's processes inherit that, so the SIGINT does nothing; a worker
stopped by SIGSTOP acts on no signal but SIGKILL. `end_cell` therefore sends SIGINT, SIGTERM
and SIGKILL in turn to every process of the cell (the controller and its descendants), each
with a SIGCONT, and checks in /proc that all are gone before the launcher moves on.

A local cell does not outlive the process that launched it (the sweep, or `python -m harness`):
submitit's job controller is made to survive it, but a cell left running would measure itself
against the next run's cells, and a re-run sweep would run it a second time. Its workers watch
the launcher and end themselves when it is gone; the cell, without a result, is run again when
the sweep is re-run.
"""

from __future__ import annotations

import codecs
import contextlib
import json
import os
import pickle
import re
import shlex
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import submitit
from tqdm import tqdm

from harness.records.record import LAUNCHER_RECORDS_ENV
from harness.records.results import RESULT_FILE, RunStatus, group_formed
from harness.system.processes import (
    ENDING_SIGNALS,
    ProcessId,
    children_with_environment,
    end_tree,
)
from harness.system.worker_env import MASTER_PORT_ENV, free_port, log_to_stderr
from launchers.local_controller import Executor, TaskEnd, read_task_end
from workloads.progress import BARS, PROGRESS_ENV, mode

# After rank 0 recorded the cell, how long the other workers may take to exit by themselves.
GRACE_AFTER_RESULT_S = 20.0
_POLL_S = 0.5
# Once rank 0 has recorded the cell (or exited), the launcher waits only for the processes to
# end, and polls faster: nothing it measures runs any more, and the next cell starts sooner.
_POLL_AFTER_RESULT_S = 0.05
# The pid of the process that launched a local cell, handed to its workers.
LAUNCHER_PID_ENV = "DISTBENCH_LAUNCHER_PID"


def submit_local(
    function: Callable[..., Any],
    *args: Any,
    folder: Path,
    tasks: int,
    timeout_min: int,
    name: str,
    records_cell: bool = False,
) -> submitit.Job:
    """Start `tasks` local processes that each call `function(*args)`.

    The workers' rendezvous port is a port free right now, handed to them in their
    environment: a port derived from the local job id (a process id) could be one that another
    cell on this machine is using. So is how this process shows progress (`workloads.progress`):
    the workers write to files; rank 0's bar reaches a terminal only through this process.
    With `records_cell`, also that this process records the cell in MLflow once it has ended
    (harness.records.record.LAUNCHER_RECORDS_ENV): a local cell does not outlive its launcher.
    """
    executor = Executor(folder=str(folder))  # submitit's, its controller made safe to start
    # submitit's own time limit is a backstop only: wait_for_cell ends the cell first.
    executor.update_parameters(
        tasks_per_node=tasks,
        nodes=1,
        timeout_min=timeout_min + 5,
        name=name,
        **gpu_parameters(os.environ.get("CUDA_VISIBLE_DEVICES")),
    )
    handed = {
        MASTER_PORT_ENV: str(free_port()),
        LAUNCHER_PID_ENV: str(os.getpid()),
        PROGRESS_ENV: mode(),
        LAUNCHER_RECORDS_ENV: "1" if records_cell else "0",
    }
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


def gpu_parameters(declared: str | None) -> dict[str, Any]:
    """submitit's settings that give a local cell's workers the GPUs this process sees.

        submitit sets the tasks' CUDA_VISIBLE_DEVICES to the GPUs it is given, none unless told: a
        CUDA cell's workers would see no GPU (seen on an H100:
        docs/benchmarks/2026-11-25-cuda-h100-h200.md, "The CUDA path's first run on a GPU: one H100
        (2026-11-25)").
        `declared` is this process's CUDA_VISIBLE_DEVICES (None: unset, then every GPU torch
        counts). submitit takes GPU indices only; GPU UUIDs or MIG names are exported by its
        `setup` lines instead. No GPU here: nothing (submitit's default, none); a machine without
    an NVIDIA device file (/dev/nvidia0, ...) has none, and its sweeps never load torch to count."""
    if declared is None:
        if not any(Path("/dev").glob("nvidia[0-9]*")):  # no NVIDIA GPU: no torch to ask
            return {}
        import torch

        return (
            {"gpus_per_node": count, "visible_gpus": tuple(range(count))}
            if (count := torch.cuda.device_count())
            else {}
        )
    ids = [part.strip() for part in declared.split(",") if part.strip()]
    if not ids:
        return {}
    if all(part.isdigit() for part in ids):
        return {"gpus_per_node": len(ids), "visible_gpus": tuple(int(part) for part in ids)}
    return {"setup": [f"export CUDA_VISIBLE_DEVICES={shlex.quote(declared)}"]}


def follow_launcher() -> None:
    """In a local cell's worker: end this process (SIGKILL) as soon as the process that
    launched the cell is gone. Nothing to do outside a local cell.

    Also undoes an inherited SIG_IGN of SIGINT (a launcher started with `nohup ... &` passes
    it on), so that the SIGINT its controller forwards when the cell is cancelled ends it.
    (submitit's worker answers SIGTERM with a log line only: `end_cell` ends with SIGKILL.)"""
    _default_signal_dispositions()
    pid = os.environ.get(LAUNCHER_PID_ENV)
    if pid is None:
        return
    launcher = ProcessId.of(int(pid))
    threading.Thread(
        target=_watch_launcher, args=(launcher,), name="launcher-watch", daemon=True
    ).start()


def _default_signal_dispositions() -> None:
    if threading.current_thread() is not threading.main_thread():
        return  # only the main thread may set handlers
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # Python's usual handler


def _watch_launcher(launcher: ProcessId | None) -> None:
    # By start time too (ProcessId): after the launcher's death its pid may be reused.
    while launcher is not None and launcher.alive():
        time.sleep(1.0)
    os.kill(os.getpid(), signal.SIGKILL)


@dataclass(frozen=True)
class CellWaited:
    """How the wait for a cell's workers ended (`wait_for_cell`)."""

    timed_out: bool = False
    # A worker that died before the cell's process group formed: its peers could only have
    # waited for it at the rendezvous, so the cell was ended at once, nothing measured.
    lost_before_group: TaskEnd | None = None


def wait_for_cell(
    job: submitit.Job,
    output_dir: Path,
    *,
    timeout_s: float,
    grace_s: float = GRACE_AFTER_RESULT_S,
    result_file: str = RESULT_FILE,
    show_rank0: bool = False,
    records_cell: bool = False,
) -> CellWaited:
    """Wait until every worker of the cell has exited, and say how the wait ended.

    Workers still running `grace_s` after rank 0 recorded the cell (`recorded`) or exited
    (without a record, e.g. ended by its watchdog: the launcher records the cell from the rank
    reports), or when `timeout_s` has passed, are ended (`end_cell`), so no process of the
    cell outlives it. With `show_rank0`, what rank 0 prints appears on this process's
    terminal meanwhile (`Rank0Terminal`). `records_cell`: this process records the cell in
    MLflow afterwards (`submit_local`), so rank 0 uploads nothing that could be cut short;
    a worker of such a cell that dies while the others run is said at once (`_say_lost`).
    Where it died before the process group formed (rank 0 has not noted it:
    `harness.records.results.group_formed`), the others would wait for it at the rendezvous
    until run.progress_timeout_s with nothing measured: the cell is ended at once instead.
    Once the group formed, rank 0's collectives fail and it records the cell itself, with the
    epochs it measured: it is left to do so.
    """
    result_path = Path(output_dir) / result_file
    deadline = time.monotonic() + timeout_s
    rank0 = _Rank0(job)
    ended: float | None = None
    lost: TaskEnd | None = None
    with Rank0Terminal(job, enabled=show_rank0) as terminal:
        while not job.done():
            terminal.show()
            now = time.monotonic()
            if ended is None and (
                recorded(result_path, uploading=not records_cell) or rank0.exited()
            ):
                ended = now
            if records_cell and ended is None and lost is None and job.num_tasks > 1:
                lost = lost_worker(job)
                if lost is not None and not group_formed(output_dir):
                    _say_lost(
                        job,
                        lost,
                        "before the cell's process group formed: the other "
                        "workers are ended and the cell recorded as failed",
                    )
                    end_cell(job)
                    return CellWaited(lost_before_group=lost)
                if lost is not None:
                    _say_lost(
                        job,
                        lost,
                        "the cell is recorded once rank 0 notices, or its "
                        "watchdog ends it after run.progress_timeout_s without progress",
                    )
            if ended is not None and (now - ended > grace_s or every_worker_returned(job)):
                break
            if now > deadline:
                end_cell(job)
                return CellWaited(timed_out=True)
            time.sleep(_POLL_S if ended is None else _POLL_AFTER_RESULT_S)
        end_cell(job, signals=(signal.SIGKILL,) if every_worker_returned(job) else ENDING_SIGNALS)
    return CellWaited()


def every_worker_returned(job: submitit.Job) -> bool:
    """Whether every worker's function returned and submitit saved its value: then all a worker has
    left is the interpreter's exit, which takes a process that imported torch about 1.2 s on this
    machine (docs/benchmarks/2026-12-01-process-exit.md, "A local cell's workers ended once they
    returned (2026-12-01)"), every cell of a sweep; the launcher ends them instead. A worker whose
    function raised is left to exit by itself: it is still printing its traceback."""
    tasks = [job.task(rank) for rank in range(job.num_tasks)] if job.num_tasks > 1 else [job]
    return all(_saved_outcome(task.paths.result_pickle) == "success" for task in tasks)


def lost_worker(job: submitit.Job) -> TaskEnd | None:
    """The first worker (by rank) of `job` that ended without its function having returned:
    killed by a signal, or exited with an error, as its controller noted it
    (`launchers.local_controller.TaskEnd`). A worker killed after it returned (the launcher
    ends workers that only have their interpreter's exit left) is not lost."""
    for rank in range(job.num_tasks):
        task = job.task(rank)
        end = read_task_end(task.paths)
        if end is not None and end.returncode != 0 and not every_worker_returned(task):
            return end
    return None


def worker_line(job: submitit.Job, end: TaskEnd) -> str:
    """'worker 1 (pid 123) was killed by SIGKILL (its log: ...)': who, how, and where to look."""
    log = job.task(end.rank).paths.stderr
    return f"worker {end.rank} (pid {end.pid}) {end.how()} (its log: {log})"


def _say_lost(job: submitit.Job, end: TaskEnd, then: str) -> None:
    """Say, once, that a worker of a running cell is gone, and `then`, what follows: rank 0,
    which records the cell, has not said so yet."""
    with tqdm.external_write_mode(file=sys.stdout):
        print(f"[distbench] {worker_line(job, end)}; {then}", flush=True)


class _HoldsObjects(Exception):
    """The saved value holds objects of some module's classes."""


class _BuiltinsOnly(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise _HoldsObjects(f"{module}.{name}")


def _saved_outcome(path: Path) -> str | None:
    """What submitit saved for a worker, "success" or "error" (None: nothing yet; it renames
    the file into place whole), read without importing anything: unpickling a worker's value
    could load torch into the launcher (`tests/meta/test_fast_commands.py`). An error is saved as
    ("error", its traceback's text); a value that holds objects is therefore a success."""
    try:
        with open(path, "rb") as stream:
            outcome, _ = _BuiltinsOnly(stream).load()
    except (FileNotFoundError, EOFError, pickle.UnpicklingError):  # not there, or not whole
        return None
    except _HoldsObjects:
        return "success"
    return str(outcome)


def recorded(result_path: Path, *, uploading: bool = True) -> bool:
    """Whether rank 0 is done recording the cell in `result_path`. A result.json that says
    `pending_sync` without a `tracking_error` is the first of its two writes: rank 0 is
    uploading it to MLflow (harness.records.record), which can take longer than the grace period
    (creating the store's tables on a busy machine), and must not be cut short. Not
    `uploading` (the launcher records the cell itself), any result.json is the record."""
    try:
        written = json.loads(result_path.read_text())
    except FileNotFoundError:
        return False
    except (OSError, ValueError):  # not a record of ours to read: its presence is the signal
        return True
    return not (
        uploading
        and isinstance(written, dict)
        and written.get("pending_sync")
        and not written.get("tracking_error")
    )


# A line of submitit's own logger in a worker's output (its handler's format, or the
# worker's logging format): the launcher's bookkeeping, not the cell's.
_SUBMITIT_LINE = re.compile(r"^(submitit [A-Z]+ \(|\[[^]]*\]\[submitit\]\[)")


class Rank0Terminal:
    """What rank 0 of a cell prints, shown on the launcher's terminal while the cell runs.

    A cell's workers run under submitit, which sends each worker's stdout and stderr to files
    (<job>_<rank>_log.out and .err): a multi-worker cell would otherwise train in silence.
    The launcher reads rank 0's two files as they grow, at each poll of `wait_for_cell`, and
    shows what a terminal would show of them: each finished line (a log line: the epochs, the
    result summary) goes to the launcher's stdout or stderr as it went to rank 0's, and the
    line rank 0 keeps redrawing (text after a carriage return and no newline yet: the
    frame of its progress bar) is shown on a status line of the launcher's own, a tqdm bar,
    which stays below the finished lines and under a sweep's own bar; rank 0 draws a bar only
    when this process's stderr is a terminal (`submit_local` hands it the choice). submitit's
    bookkeeping lines are left out. Ordering between rank 0's stdout and stderr is that of
    the polls (every `_POLL_S`).
    """

    def __init__(self, job: submitit.Job, *, enabled: bool = True) -> None:
        paths = job.task(0).paths
        self._outputs = (
            [_GrowingOutput(paths.stderr, sys.stderr), _GrowingOutput(paths.stdout, sys.stdout)]
            if enabled
            else []
        )
        self._status: tqdm | None = None

    def __enter__(self) -> Rank0Terminal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.show()  # what rank 0 printed last: the result summary
        self._close_status()

    def show(self) -> None:
        """Print rank 0's lines that are new since the last call; show its current frame.
        A terminal that is gone (a closed pipe: `... | head`) ends the showing, not the
        launcher: the cell goes on unseen."""
        try:
            self._show()
        except (OSError, ValueError):  # BrokenPipeError; a closed file
            self._outputs = []
            self._close_status()

    def _show(self) -> None:
        for output in self._outputs:
            for line in output.new_lines():
                if line.strip() and not _SUBMITIT_LINE.match(line):
                    with tqdm.external_write_mode(file=output.stream):  # clears the bars
                        output.stream.write(line + "\n")
                        output.stream.flush()
        frame = next((output.frame for output in self._outputs if output.frame), "")
        if self._status is None and frame and mode() == BARS:
            self._status = tqdm(bar_format="{desc}", leave=False, file=sys.stderr)
        if self._status is not None and frame != self._status.desc:
            self._status.set_description_str(frame)

    def _close_status(self) -> None:
        status, self._status = self._status, None
        if status is not None:
            with contextlib.suppress(OSError, ValueError):
                status.close()  # leave=False: the status line goes


class _GrowingOutput:
    """A worker's output file, read from where the last read stopped."""

    def __init__(self, path: Path, stream: TextIO) -> None:
        self.path = Path(path)
        self.stream = stream  # where its lines go on the launcher's side
        self._offset = 0
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._unfinished = ""  # text after its last newline

    def new_lines(self) -> list[str]:
        """The lines finished since the last call, each as a terminal shows it: the text
        after its last carriage return (what came before was overwritten)."""
        try:
            with self.path.open("rb") as file:
                file.seek(self._offset)
                data = file.read()
        except OSError:  # not created yet, or gone with the cell's folder
            return []
        self._offset += len(data)
        *lines, unfinished = (self._unfinished + self._decoder.decode(data)).split("\n")
        # Only the text after its last carriage return can still show: keep no more.
        self._unfinished = unfinished[max(unfinished.rfind("\r"), 0) :]
        return [line.rsplit("\r", 1)[-1] for line in lines]

    @property
    def frame(self) -> str:
        """The line being redrawn (after a carriage return, not finished yet), else ''."""
        return self._unfinished[1:].strip() if self._unfinished.startswith("\r") else ""


class _Rank0:
    """Rank 0's worker process, found among the controller's children by the rank submitit
    puts in its environment; `exited()` once it was seen and is gone."""

    def __init__(self, job: submitit.Job) -> None:
        self._controller = _controller_pid(job)
        self._process: ProcessId | None = None

    def exited(self) -> bool:
        if self._process is None:
            self._process = self._find()
            return False
        return not self._process.alive()

    def _find(self) -> ProcessId | None:
        if self._controller is None:
            return None
        found = children_with_environment(self._controller, "SUBMITIT_LOCAL_GLOBALID", "0")
        return found[0] if found else None


# How long each signal of `end_cell` is given to end the cell's processes before the next.
END_STEP_S = 5.0


def end_cell(
    job: submitit.Job,
    step_s: float = END_STEP_S,
    signals: tuple[signal.Signals, ...] = ENDING_SIGNALS,
) -> None:
    """End every process of the cell and return once all are gone: SIGINT (what submitit's
    cancel sends, which its controller forwards to the workers), then SIGTERM (which the
    controller forwards; its workers only log it), then SIGKILL, each to the controller and
    all its descendants with a SIGCONT (`harness.system.processes.end_tree`); or only `signals`."""
    controller = _controller_pid(job)
    if controller is not None:
        end_tree(
            controller,
            step_s=step_s,
            reap=job.done,  # done() reaps the controller
            signals=signals,
        )


def _controller_pid(job: submitit.Job) -> int | None:
    """submitit's LocalJob keeps the controller it started (a Popen) as `_process`."""
    process = getattr(job, "_process", None)
    return None if process is None else process.pid


def run_local_cell(
    cfg: Any,
    output_dir: Path,
    *,
    workers: int,
    timeout_min: int,
    grace_s: float = GRACE_AFTER_RESULT_S,
) -> dict:
    """`python -m harness` for a cell with several workers: start them, wait (showing what
    rank 0 prints, as a cell of one worker shows it), return the result (rank 0's record, or
    the record of how the cell failed)."""
    from harness.config.schema import validate

    outcome, _ = run_cell_job(
        _logged_run_cell,
        cfg,
        output_dir,
        config=cfg,
        output_dir=output_dir,
        folder=output_dir / ".submitit" / "%j",
        workers=workers,
        timeout_min=timeout_min,
        grace_s=grace_s,
        name="distbench",
        label=validate(cfg).run_name,
    )
    return outcome


def run_cell_job(
    function: Callable[..., Any],
    *args: Any,
    config: Any,
    output_dir: Path,
    folder: Path,
    workers: int,
    timeout_min: int,
    name: str,
    label: str,
    grace_s: float = GRACE_AFTER_RESULT_S,
    keep_interrupted: Callable[[dict], None] | None = None,
) -> tuple[dict, submitit.Job]:
    """One cell on this machine, as both a cell typed at the prompt and the serial sweep run
    it: submit `function(*args)` as the cell's `workers` processes, wait until all have ended
    (`wait_for_cell`, rank 0 shown), and return the cell's outcome (`launchers.cells.
    cell_outcome`: rank 0's record, or the record of how the cell failed) and its job.
    `grace_s`: how long the other workers may outlive rank 0's record (`wait_for_cell`).
    `label` names the cell in the line that says its workers are starting: they take seconds
    (a Python and torch each) before rank 0 says anything. `keep_interrupted` is given the
    cell's record when the launcher is interrupted while it runs (`keep_interrupted_cell`),
    before the interruption goes on up: a sweep counts it in its summary."""
    from harness.records.outcome import now
    from launchers.cells import cell_outcome, worker_logs_tail

    with tqdm.external_write_mode(file=sys.stdout):  # above a sweep's bar, on a terminal
        print(
            f"[distbench] {label}: starting {workers} worker process(es) in {output_dir}",
            flush=True,
        )
    started = now()
    job = submit_local(
        function,
        *args,
        folder=folder,
        tasks=workers,
        timeout_min=timeout_min,
        name=name,
        records_cell=True,
    )
    try:
        waited = wait_for_cell(
            job,
            output_dir,
            timeout_s=60 * timeout_min,
            grace_s=grace_s,
            show_rank0=True,
            records_cell=True,
        )
    except (KeyboardInterrupt, SystemExit) as interrupt:
        outcome = keep_interrupted_cell(job, interrupt, config, output_dir, workers, started)
        if outcome is not None and keep_interrupted is not None:
            keep_interrupted(outcome)
        raise
    ended_as, cause = None, None  # rank 0's record, or what the ranks reported
    if waited.timed_out:
        ended_as = RunStatus.timeout
    elif waited.lost_before_group is not None:
        ended_as = RunStatus.failed
        cause = (
            f"{worker_line(job, waited.lost_before_group)} before the cell's process group "
            f"formed, and the other workers were ended: nothing was measured"
        )
    outcome = cell_outcome(
        config,
        output_dir,
        ended_as=ended_as,
        logs=worker_logs_tail(job, workers),
        started=started,
        cause=cause,
    )
    return record_left_to_launcher(output_dir, outcome), job


def keep_interrupted_cell(
    job: submitit.Job,
    interrupt: BaseException,
    config: Any,
    output_dir: Path,
    workers: int,
    started: str,
) -> dict | None:
    """This launcher was interrupted (Ctrl-C, SIGTERM) while its cell ran: the cell keeps what
    it measured (`harness.worker.interruption`). The note asks a worker of one process to
    record its finished epochs as a single cell does; the cell's processes are ended; then its
    record (that one, or one made here: `interrupted`, without epochs, for a cell of several
    workers) is uploaded, and returned. Any other exit leaves the cell as before (None)."""
    from harness.worker.interruption import INTERRUPTED_NOTE, signal_exit_code, signal_name
    from launchers.cells import cell_outcome, worker_logs_tail

    exit_code = signal_exit_code(interrupt)
    if exit_code is None:
        return None
    name = signal_name(exit_code)
    with contextlib.suppress(OSError):
        (Path(output_dir) / INTERRUPTED_NOTE).write_text(name)
    end_cell(job)
    outcome = cell_outcome(
        config,
        output_dir,
        ended_as=RunStatus.interrupted,
        logs=worker_logs_tail(job, workers),
        started=started,
        cause=f"the sweep was interrupted by {name} while the cell ran",
    )
    outcome = record_left_to_launcher(output_dir, outcome)
    why = str(outcome.get("error") or "").strip().splitlines()
    print(
        f"[distbench] {outcome.get('run_name', 'the cell')}: recorded as "
        f"{outcome.get('status')}" + (f": {why[0]}" if why else ""),
        file=sys.stderr,
        flush=True,
    )
    return outcome


def record_left_to_launcher(output_dir: Path, outcome: dict) -> dict:
    """The cell's outcome once MLflow has it: rank 0 left the upload to this process
    (`submit_local`'s `records_cell`), to the store its own config names; a result this
    process cannot upload stays pending, with the reason, as rank 0 would have left it. A
    record made here (`cell_outcome`) is uploaded already, and a result whose upload failed
    already is left to `harness.sync`."""
    from harness.records.mlflow_store import tracking_uri
    from harness.records.pending import record_pending

    config = outcome.get("config") or {}
    tracking, run = config.get("tracking") or {}, config.get("run") or {}
    if not (
        outcome.get("pending_sync")
        and not outcome.get("tracking_error")
        and tracking.get("enabled")
        and (Path(output_dir) / RESULT_FILE).exists()
    ):
        return outcome
    return record_pending(Path(output_dir), tracking_uri(tracking.get("uri"), run["output_dir"]))


def _logged_run_cell(cfg: Any, output_dir: Path) -> dict:
    """A worker of `run_local_cell`: Hydra's job logging is not set up in these processes, so
    log to stderr (submitit keeps it per worker in .submitit/<job>/<job>_<rank>_log.err)."""
    from harness.records.cell import check_cell
    from harness.worker.run import run_cell

    follow_launcher()
    log_to_stderr()
    return run_cell(check_cell(cfg), output_dir)  # this worker's entry point: it checks once
