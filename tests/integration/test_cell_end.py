"""A local cell ends when its workers have returned: the launcher does not wait for their
interpreters to exit (about 1.2 s for a process that imported torch, every cell), and a worker
whose function raised is left to exit by itself, printing its traceback. Real submitit jobs of
plain functions (no torch: the test is about the processes)."""

from __future__ import annotations

import time
from pathlib import Path

import psutil

from launchers.local import every_worker_returned, submit_local, wait_for_cell


def _return_then_linger(result_path: str) -> str:
    """Record, return, then take 10 minutes to exit (an atexit handler)."""
    import atexit

    atexit.register(time.sleep, 600)
    Path(result_path).write_text("{}")
    return "recorded"


def _raise() -> None:
    raise RuntimeError("the cell's function failed")


def test_workers_that_returned_are_ended_without_waiting_for_their_exit(tmp_path: Path) -> None:
    job = submit_local(
        _return_then_linger,
        str(tmp_path / "result.json"),
        folder=tmp_path / "job",
        tasks=2,
        timeout_min=5,
        name="linger",
    )
    controller = psutil.Process(job._process.pid)  # type: ignore[attr-defined]
    # The grace after the record (600 s) outlasts the cell's time limit (120 s): only the
    # workers' having returned ends the wait in time.
    assert not wait_for_cell(job, tmp_path, timeout_s=120, grace_s=600).timed_out
    assert every_worker_returned(job) and job.results() == ["recorded", "recorded"]
    assert not controller.is_running()  # nor any of its workers: ended with the tree


def test_a_worker_whose_function_raised_has_not_returned(tmp_path: Path) -> None:
    job = submit_local(_raise, folder=tmp_path / "job", tasks=1, timeout_min=5, name="raise")
    deadline = time.monotonic() + 120
    while not job.done() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert job.done()
    assert not every_worker_returned(job)
