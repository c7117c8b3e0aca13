"""A probe worker that dies ends the probe within seconds, named: every figure of the probe is a
collective among all its workers, and a worker killed before it joined the process group left
the others waiting at the rendezvous for `run.progress_timeout_s` (600 s), then a line that
called it a bug and said nothing of the worker."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from harness.cli.cell_results import FAILED_CELLS_EXIT_CODE
from harness.system.processes import ProcessId
from tests.helpers import cell_worker_pids

# The probe at its smallest: what is tested is how it ends, not what it measures.
_SMALL_PROBE = [
    "hardware=local_2cpu",
    "probe.repeats=1",
    "probe.warmup=0",
    "probe.message_bytes=[8,65536]",
    "probe.rounds=1",
]
# From the kill to the command's end: the watch reads the workers' ends every 0.25 s, gives
# rank 0 3 s to write a profile it may have measured, then ends it (about 5 s here).
_ENDS_WITHIN_S = 30


def _workers_once_started(output_root: Path, probe: subprocess.Popen[bytes]) -> dict[int, int]:
    """rank -> pid of the probe's two workers, as soon as both exist."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and probe.poll() is None:
        workers = cell_worker_pids(output_root)
        if len(workers) == 2:
            return workers
        time.sleep(0.05)
    raise AssertionError(f"the probe's workers never started (probe ended: {probe.poll()})")


def _controllers(output_root: Path) -> list[int]:
    found = subprocess.run(
        ["pgrep", "-f", f"launchers.local_controller {output_root}"], capture_output=True, text=True
    ).stdout.split()
    return [int(pid) for pid in found]


def test_a_probe_worker_killed_as_it_starts_ends_the_probe_at_once_and_is_named(
    output_root: Path, tmp_path: Path
) -> None:
    out, err = tmp_path / "probe.out", tmp_path / "probe.err"
    with out.open("w") as stdout, err.open("w") as stderr:  # files: a leftover cannot block
        probe = subprocess.Popen(
            [sys.executable, "-m", "harness.probe", *_SMALL_PROBE, f"run.output_dir={output_root}"],
            cwd=output_root.parent,
            stdout=stdout,
            stderr=stderr,
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
        )
    try:
        workers = _workers_once_started(output_root, probe)
        rank0 = ProcessId.of(workers[0])
        os.kill(workers[1], signal.SIGKILL)  # before it could join the process group
        killed = time.monotonic()
        probe.wait(timeout=_ENDS_WITHIN_S + 60)
        took = time.monotonic() - killed
        output = out.read_text() + err.read_text()
        assert took < _ENDS_WITHIN_S, f"ended {took:.0f} s after the kill:\n{output[-3000:]}"
        assert probe.returncode == FAILED_CELLS_EXIT_CODE, output[-3000:]
        named = [line for line in output.splitlines() if "worker 1 (pid" in line]
        assert len(named) == 1, output[-3000:]
        assert f"worker 1 (pid {workers[1]}) was killed by SIGKILL" in named[0]
        assert "a bug" not in output and "Traceback" not in output, output[-3000:]
        # No process of the probe is left: its other worker was ended, its controller too.
        assert cell_worker_pids(output_root) == {}
        assert rank0 is None or not rank0.alive()
        assert _controllers(output_root) == []
        # Nothing kept is lost: the worker's log the line names is there; no partial profile
        # became the hardware's latest.
        log = Path(named[0].split("(its log: ", 1)[1].split(")", 1)[0])
        assert log.is_file()
        assert not (output_root / "hardware_profiles" / "local_2cpu.json").exists()
    finally:  # a failing test must not leave the probe's processes on the machine
        if probe.poll() is None:
            probe.kill()
        for pid in [*cell_worker_pids(output_root).values(), *_controllers(output_root)]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        probe.wait(timeout=60)
