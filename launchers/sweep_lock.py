"""One live sweep per output directory: a second sweep into a `run.output_dir` that a live
sweep is using is refused in one line naming it, before anything is written.

Two sweeps into one output root would share its cell index (each re-runs, or overwrites, what
the other measures) and run their cells at the same time on one machine's cores, timing each
other instead of the cells. The live sweep holds an advisory lock on `<run.output_dir>/
.sweep.lock` (`harness.filelock`) for as long as its process lives, and writes who it is into
the file; the kernel drops the lock when that process ends, however it ends, so a killed
sweep never blocks the next one.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import sys
from pathlib import Path

from harness.config import ConfigError
from harness.filelock import try_lock

SWEEP_LOCK_FILE = ".sweep.lock"
# The descriptors of the locks this process holds: open until it ends.
_held: dict[Path, int] = {}


def claim_output_root(output_dir: str | Path) -> None:
    """Hold `output_dir` for this process's sweep, or raise ConfigError naming the live sweep
    that holds it."""
    root = Path(output_dir).expanduser().resolve()
    if root in _held:
        return
    root.mkdir(parents=True, exist_ok=True)
    path = root / SWEEP_LOCK_FILE
    fd = try_lock(path)
    if fd is None:
        raise ConfigError(
            f"run.output_dir={output_dir} is invalid: a live sweep is using it "
            f"({_holder(path)}); cells never run at the same time on one machine: wait for "
            f"it to end, or choose another run.output_dir")
    os.ftruncate(fd, 0)
    os.write(fd, json.dumps({"pid": os.getpid(), "command": " ".join(sys.argv),
                             "since": dt.datetime.now().isoformat(timespec="seconds")}
                            ).encode())
    _held[root] = fd


def _holder(path: Path) -> str:
    """"pid 123 since <time>: <command>" of the sweep that holds `path`, as it wrote it."""
    try:
        holder = json.loads(path.read_text())
        return f"pid {holder['pid']} since {holder['since']}: {holder['command']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "a process that has not said which yet"
