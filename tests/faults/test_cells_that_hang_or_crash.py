"""Faults that must still leave a record of the cell and no process of it: a cell that hangs
in a single process (no launcher to record it), and a frozen cell of a sweep started with
`nohup ... &`, whose processes inherit SIGINT ignored.

Faults are injected into real processes by a `sitecustomize` module put on PYTHONPATH (Python
loads it at start-up in every process): it turns the optimizer's step into the fault after a
few real steps, so the fault strikes mid-training.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from mlflow.tracking import MlflowClient

from harness.records.mlflow_store import DEFAULT_STORE_FILE
from harness.records.resume import INDEX_DIR
from harness.worker.watchdog import STALL_EXIT_CODE
from launchers.local_controller import CONTROLLER_MODULE
from tests.helpers import REPO_ROOT, cell_worker_pids, tiny_overrides

# DISTBENCH_TEST_FAULT=hang: every process sleeps inside its 3rd step (no collective is
# waiting, so only the watchdog can end it). =freeze: rank 0 does that, and rank 1 stops
# itself with SIGSTOP, as a worker frozen by a debugger or a stuck node would be: it acts on no
# signal but SIGKILL, and its own watchdog and launcher-watch threads are frozen too.
_FAULT_HOOK = """
import os
fault = os.environ.get("DISTBENCH_TEST_FAULT")
if fault == "hang" or (fault == "freeze" and "SUBMITIT_LOCAL_GLOBALID" in os.environ):
    import signal
    import time
    import torch
    real_step, steps = torch.optim.SGD.step, []

    def step(self, *args, **kwargs):
        steps.append(1)
        if len(steps) > 2:
            rank = os.environ.get("SUBMITIT_LOCAL_GLOBALID", "0")
            if fault == "freeze" and rank == "1":
                os.kill(os.getpid(), signal.SIGSTOP)
            time.sleep(3600)
        return real_step(self, *args, **kwargs)

    torch.optim.SGD.step = step
"""


def _fault_env(tmp_path: Path, fault: str) -> dict[str, str]:
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(_FAULT_HOOK)
    path = os.pathsep.join([str(hooks), *filter(None, [os.environ.get("PYTHONPATH")])])
    return dict(os.environ, PYTHONPATH=path, DISTBENCH_TEST_FAULT=fault, PYTHONUNBUFFERED="1")


def _cell_processes(output_root: Path) -> list[int]:
    """Every live process of the test's cells: submitit's controllers and their workers."""
    found = subprocess.run(
        ["pgrep", "-f", f"submitit.*{output_root}"], capture_output=True, text=True
    ).stdout.split()
    return [int(pid) for pid in found]


def _kill_leftovers(output_root: Path) -> None:
    """A failing test must not leave frozen processes on the machine."""
    for pid in _cell_processes(output_root):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_a_hung_single_process_cell_records_itself_as_timeout(
    output_root: Path, tmp_path: Path
) -> None:
    """`python -m harness` without -m runs a 1-worker cell in its own process: no launcher
    records it, so when its watchdog ends it, it records itself first (result.json, MLflow run,
    index entry), then exits with 124."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness",
            *tiny_overrides(output_root, "run.warmup_batches=0", "run.progress_timeout_s=8"),
        ],
        cwd=output_root.parent,
        capture_output=True,
        text=True,
        timeout=240,
        env=_fault_env(tmp_path, "hang"),
    )
    assert done.returncode == STALL_EXIT_CODE, done.stderr[-3000:]
    (path,) = (output_root / "runs").glob("*/result.json")
    result = json.loads(path.read_text())
    assert result["status"] == "timeout"
    assert "no progress for" in result["error"] and "time.sleep(3600)" in result["error"]
    run = MlflowClient(f"sqlite:///{output_root / DEFAULT_STORE_FILE}").get_run(
        result["mlflow_run_id"]
    )
    assert run.data.tags["status"] == "timeout"
    entry = json.loads((output_root / INDEX_DIR / f"{result['cell_key']}.json").read_text())
    assert entry["status"] == "timeout"
    assert (output_root / entry["result"]).resolve() == path.resolve()  # relative to the root


def test_a_frozen_cell_of_a_sweep_started_with_nohup_is_ended_and_recorded(
    output_root: Path, tmp_path: Path
) -> None:
    """A sweep started as `nohup python -m harness -m ... &` from a script: its processes
    inherit SIGINT ignored, so submitit's cancel (a SIGINT) ends nothing. Rank 0 hangs and is
    ended by its watchdog without a result.json; rank 1 is stopped (SIGSTOP). The launcher
    must see rank 0 gone, record the cell as `timeout`, and end rank 1 and submitit's
    controller before the sweep ends."""
    log, status = tmp_path / "sweep.log", tmp_path / "sweep.rc"
    command = [
        sys.executable,
        "-m",
        "harness",
        "-m",
        "hardware=local_2cpu",
        "distribution=ddp",
        *tiny_overrides(
            output_root,
            "dataset.num_samples=256",
            "run.epochs=5",
            "run.warmup_batches=0",
            "run.progress_timeout_s=8",
            "hydra.launcher.timeout_min=3",
            # rank 1, frozen, is ended 3 s after rank 0 is gone (default 20)
            "hydra.launcher.grace_after_result_s=3",
        ),
    ]
    # As a script would: in the background of a non-interactive shell, which has it ignore
    # SIGINT (and nohup SIGHUP); `sh -c` notes the sweep's exit status.
    inner = f"{shlex.join(command)}; echo $? > {shlex.quote(str(status))}"
    script = f"nohup sh -c {shlex.quote(inner)} > {shlex.quote(str(log))} 2>&1 &"
    subprocess.run(
        ["bash", "-c", script],
        cwd=output_root.parent,
        check=True,
        timeout=30,
        env=_fault_env(tmp_path, "freeze"),
        stdin=subprocess.DEVNULL,
    )
    try:
        controller_ignores_sigint = None
        deadline = time.monotonic() + 170  # under the 3 min at which the sweep gives up
        while not status.exists():
            assert time.monotonic() < deadline, "the sweep did not end:\n" + log.read_text()[-3000:]
            controller_ignores_sigint = controller_ignores_sigint or _controller_ignores_sigint(
                output_root
            )
            time.sleep(0.5)
        # Exit status 1 says that a cell did not end ok; anything else is a crash.
        assert status.read_text().strip() in ("0", "1"), log.read_text()[-3000:]
        assert "Traceback" not in log.read_text(), log.read_text()[-3000:]
        assert controller_ignores_sigint, "the test's premise: SIGINT ignored in the cell"
        # The launcher ended the cell's processes before it moved on: none is left.
        assert not _cell_processes(output_root), _cell_processes(output_root)
        assert not cell_worker_pids(output_root)
        (path,) = (output_root / "sweeps").rglob("result.json")
        result = json.loads(path.read_text())
        assert result["status"] == "timeout", result["error"]
        assert "--- rank 0: timeout\nno progress for" in result["error"]
    finally:
        _kill_leftovers(output_root)


def _controller_ignores_sigint(output_root: Path) -> bool | None:
    """Whether the submitit controller of the test's cell has SIGINT ignored (None: not found)."""
    found = subprocess.run(
        ["pgrep", "-f", f"{CONTROLLER_MODULE} {output_root}"], capture_output=True, text=True
    ).stdout.split()
    for pid in found:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        ignored = int(
            next(line.split()[1] for line in status.splitlines() if line.startswith("SigIgn:")), 16
        )
        return bool(ignored & (1 << (signal.SIGINT - 1)))
    return None


def test_a_stall_that_cannot_be_recorded_still_ends_the_process(tmp_path: Path) -> None:
    """The stuck thread may hold what recording needs (here: a lock the recorder waits on
    forever); the watchdog gives recording `record_s` and ends the process anyway."""
    script = (
        "import threading, time\n"
        "from harness.worker.watchdog import ProgressWatchdog\n"
        "held = threading.Lock(); held.acquire()\n"
        "with ProgressWatchdog(0.5, on_stall=lambda report: held.acquire(), record_s=1.0):\n"
        "    time.sleep(3600)\n"
    )
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == STALL_EXIT_CODE, done.stderr
    assert time.monotonic() - started < 30
    assert "recording the stalled cell took over 1 s" in done.stderr
