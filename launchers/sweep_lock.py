"""One live sweep per output directory: a second sweep into a `run.output_dir` that a live
sweep is using is refused in one line naming it, before anything is written.

Two sweeps into one output root would share its cell index (each re-runs, or overwrites, what
the other measures) and run their cells at the same time on one machine's cores, timing each
other instead of the cells. The live sweep holds an advisory lock (`harness.system.filelock`) for as
long as its process lives, and writes who it is into the lock's file; the kernel drops the
lock when that process ends, however it ends, so a killed sweep never blocks the next one.
The file is this machine's, under the temporary directory (`distbench-sweeps/<hash of the
resolved run.output_dir>.lock`): what it guards is this machine's cores, and the check before
a sweep writes nothing into its output directory.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path

from harness.config.schema import ConfigError
from harness.system.filelock import try_lock

_LOCK_DIR = "distbench-sweeps"
# The descriptors of the locks this process holds: open until it ends.
_held: dict[Path, int] = {}


def claim_output_root(output_dir: str | Path) -> None:
    """Hold `output_dir` for this process's sweep, or raise ConfigError naming the live sweep
    that holds it."""
    root = Path(output_dir).expanduser().resolve()
    if root in _held:
        return
    path = lock_path(root)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = try_lock(path)
    except OSError:  # no lock to be had here (a read-only or foreign temporary directory)
        return
    if fd is None:
        raise ConfigError(
            f"run.output_dir={output_dir} is invalid: a live sweep is using it "
            f"({_holder(path)}); cells never run at the same time on one machine: wait for "
            f"it to end, or choose another run.output_dir"
        )
    os.ftruncate(fd, 0)
    os.write(
        fd,
        json.dumps(
            {
                "pid": os.getpid(),
                "command": " ".join(sys.argv),
                "since": dt.datetime.now().isoformat(timespec="seconds"),
            }
        ).encode(),
    )
    _held[root] = fd


def lock_path(output_dir: str | Path) -> Path:
    """The file whose lock the live sweep into `output_dir` holds."""
    root = str(Path(output_dir).expanduser().resolve())
    name = hashlib.sha256(root.encode()).hexdigest()[:20]
    return Path(tempfile.gettempdir()) / _LOCK_DIR / f"{name}.lock"


def _holder(path: Path) -> str:
    """ "pid 123 since <time>: <command>" of the sweep that holds `path`, as it wrote it."""
    try:
        holder = json.loads(path.read_text())
        return f"pid {holder['pid']} since {holder['since']}: {holder['command']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "a process that has not said which yet"
